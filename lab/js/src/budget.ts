// GPU-hours used and left this period (the service's GET /budget), in the words the
// spawn form uses: one short piece for the status bar, lines for its tooltip.

export interface IBudgetLine {
  name: string;
  budget_gpu_hours: number | null;
  used_gpu_hours: number;
  left_gpu_hours: number | null;
  cost: number | null;
  overdraft?: boolean;
}

export interface IBudget {
  period: string;
  until: string;
  set?: boolean;
  price_per_gpu_hour: number | null;
  currency: string;
  user: IBudgetLine;
  groups: IBudgetLine[];
  over: string[];
  refusal?: string | null;
}

/** 2.5 -> "2.5", 0.3333 -> "0.33", 2 -> "2". */
export function hours(value: number): string {
  return String(Number(value.toFixed(2)));
}

/** The status bar's piece: "6.5 GPU-h left", "over budget", or "" (no budget, no price). */
export function budgetShort(b: IBudget): string {
  if (b.over.length) {
    return 'over budget';
  }
  const lefts = [b.user, ...b.groups]
    .filter(l => !l.overdraft && l.left_gpu_hours !== null)
    .map(l => l.left_gpu_hours as number);
  if (lefts.length) {
    return `${hours(Math.min(...lefts))} GPU-h left`;
  }
  if (b.user.cost !== null) {
    return `${b.user.cost.toFixed(2)} ${b.currency}`;
  }
  return '';
}

/** The tooltip's lines: yours, each group's, the cost, the refusal. */
export function budgetLines(b: IBudget): string[] {
  const line = (l: IBudgetLine, whose: string): string =>
    l.budget_gpu_hours === null
      ? `${hours(l.used_gpu_hours)} GPU-hours used`
      : `${hours(l.used_gpu_hours)} GPU-hours used, ${hours(l.left_gpu_hours ?? 0)} left of ` +
        `${whose} ${hours(l.budget_gpu_hours)}` +
        (l.overdraft ? ' (may overdraw)' : '');
  const out = [`This ${b.period} (until ${b.until.slice(0, 10)}): ${line(b.user, 'your')}`];
  for (const g of b.groups) {
    out.push(`group ${g.name}: ${line(g, 'its')}`);
  }
  if (b.user.cost !== null && b.price_per_gpu_hour) {
    out.push(
      `cost so far: ${b.user.cost.toFixed(2)} ${b.currency} ` +
        `(${b.price_per_gpu_hour} ${b.currency} per GPU-hour)`
    );
  }
  if (b.refusal) {
    out.push(b.refusal);
  }
  return out;
}
