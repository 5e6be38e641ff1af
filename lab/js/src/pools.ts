// Pools: where this site's GPUs are (the box, a Slurm or Kubernetes cluster), in the
// order a job without --pool tries them, and how many slices of each size are free.
import { apiGet } from './api';
import { el, Section } from './section';

export class PoolsSection extends Section {
  constructor() {
    super('pools', 'Pools');
  }

  protected async load(): Promise<void> {
    const data = await apiGet('pools');
    const pools = (data.pools || []) as any[];
    if (!pools.length) {
      this.empty('This site has no pools.');
      return;
    }
    const sizes: { milli: number; label: string }[] = [];
    for (const p of pools) {
      for (const s of p.free || []) {
        if (!sizes.some(x => x.milli === s.milli)) {
          sizes.push({ milli: s.milli, label: s.label });
        }
      }
    }
    sizes.sort((a, b) => a.milli - b.milli);
    const box = el('div', 'gpulab-list');
    const how =
      data.default === 'auto'
        ? 'A job without --pool runs on the first pool with room, in this order.'
        : `Jobs run on pool ${data.default}.`;
    box.append(el('div', 'gpulab-total', how));
    box.append(el('div', 'gpulab-note', 'Slices free now, by size (GPU):'));
    const table = el('table', 'gpulab-table');
    const head = el('tr');
    ['pool', 'backend', 'GPUs', ...sizes.map(s => s.label.replace(/ GPUs?$/, ''))].forEach(h =>
      head.append(el('th', '', h))
    );
    table.append(head);
    for (const p of pools) {
      const tr = el('tr');
      const free: { [milli: number]: number } = {};
      for (const s of p.free || []) {
        free[s.milli] = s.count;
      }
      [p.name, p.backend, String(p.gpus), ...sizes.map(s => String(free[s.milli] ?? 0))].forEach(
        c => tr.append(el('td', '', c))
      );
      if (p.reason) {
        tr.title = p.reason;
      }
      table.append(tr);
    }
    box.append(table);
    box.append(
      el('div', 'gpulab-note', `Servers: pool ${data.servers}; endpoints: pool ${data.endpoints}`)
    );
    this.body.replaceChildren(box);
  }
}
