// Usage: the user's GPU hours over the last 7 days, by kind and by day.
import { apiGet } from './api';
import { el, Section } from './section';

export class UsageSection extends Section {
  constructor() {
    super('usage', 'Usage');
  }

  protected async load(): Promise<void> {
    const [byKind, byDay] = await Promise.all([
      apiGet('usage?group_by=kind'),
      apiGet('usage?group_by=user&bucket=day')
    ]);
    const kinds = (byKind.rows || []) as any[];
    const total = kinds.reduce((s, r) => s + (r.gpu_hours || 0), 0);
    if (!kinds.length) {
      this.empty('No GPU time used in the last 7 days.');
      return;
    }
    const box = el('div', 'gpulab-list');
    box.append(
      el('div', 'gpulab-total', `${total.toFixed(2)} GPU-hours in the last 7 days`)
    );
    box.append(this.table(['kind', 'GPU-hours', 'slices'], kinds.map(r => [
      r.kind, r.gpu_hours.toFixed(2), String(r.allocations)
    ])));
    const days = ((byDay.rows || []) as any[]).sort((a, b) =>
      String(b.day).localeCompare(String(a.day))
    );
    if (days.length) {
      box.append(this.table(['day (UTC)', 'GPU-hours'], days.map(r => [
        r.day, r.gpu_hours.toFixed(2)
      ])));
    }
    this.body.replaceChildren(box);
  }

  private table(headers: string[], rows: string[][]): HTMLTableElement {
    const table = el('table', 'gpulab-table');
    const head = el('tr');
    headers.forEach(h => head.append(el('th', '', h)));
    table.append(head);
    for (const r of rows) {
      const tr = el('tr');
      r.forEach(c => tr.append(el('td', '', c)));
      table.append(tr);
    }
    return table;
  }
}
