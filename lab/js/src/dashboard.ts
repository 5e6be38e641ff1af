// The GPU dashboard as a main-area tab: per GPU its utilisation, memory and the share
// held, as small live charts over the last minutes, the numbers now, and the slices
// held on it. It reads the service's telemetry through this server's gpulab routes
// (lab/handlers.py), so it needs no kernel, and it polls only while it is visible.
// The charts are inline SVG polylines: the labextension carries no charting library.
import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { TabPanel } from '@lumino/widgets';

import { apiGet, gpuLabel, plural } from './api';
import { el, Section } from './section';

export const OPEN_DASHBOARD = 'gpulab:open-dashboard';
/** Seconds drawn (the service keeps up to 15 minutes per node; a new tab backfills). */
export const WINDOW_S = 300;
const POLL_MS = 2000;
/** The charts span what is known (a new tab on a site without GPU history starts with
 * the share held now), at least this many seconds. */
const MIN_SPAN_S = 30;
/** A node whose newest sample is this much older than the newest of any node no longer
 * holds back the `since` cursor (a dead agent must not make every answer long). */
const STALE_NODE_S = 30;
const GIB = 1024 ** 3;
const SVG_NS = 'http://www.w3.org/2000/svg';
/** A chart's own units; the SVG stretches to its box and its lines keep their width. */
const W = 300;
const H = 60;

const chartIcon = new LabIcon({
  name: 'gpulab:dashboard',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
    '<path class="jp-icon3" fill="#616161" d="M3.5 18.49l6-6.01 4 4L22 6.92l-1.41-1.41' +
    '-7.09 7.97-4-4L2 16.99z"/></svg>'
});

type Point = [number, number | null];

/** One line's points (unix seconds, value or null for a gap), oldest first. */
class Series {
  points: Point[] = [];

  add(t: number, v: unknown): void {
    const last = this.points[this.points.length - 1];
    if (last && t <= last[0]) {
      return;
    }
    this.points.push([t, typeof v === 'number' && isFinite(v) ? v : null]);
  }

  trim(since: number): void {
    const keep = this.points.findIndex(p => p[0] >= since);
    this.points = keep < 0 ? [] : this.points.slice(keep);
  }

  latest(): Point | undefined {
    return this.points[this.points.length - 1];
  }
}

/** What the dashboard knows of one GPU. */
interface IGpu {
  /** The GPU's UUID (a MIG device's own), or node/index where a report has none. */
  key: string;
  node: string;
  index: number;
  model: string;
  simulated: boolean;
  memoryMib: number | null;
  allocatedMilli: number;
  /** Whether the service's inventory lists it (only then does gpulab place slices on it). */
  listed: boolean;
  util: Series;
  memory: Series;
  totalBytes: number | null;
  held: Series;
}

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: { [name: string]: string | number }
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  return e;
}

/** A line chart of ``series`` over the ``span`` seconds ending ``now``, 0..``max``: one
 * polyline (and its shaded area) per run of points without a gap. */
function chart(metric: string, series: Series, view: IView, max: number, gapS: number) {
  const { now, span } = view;
  const box = svg('svg', {
    class: `gpulab-dash-chart gpulab-dash-chart-${metric}`,
    viewBox: `0 0 ${W} ${H}`,
    preserveAspectRatio: 'none',
    role: 'img'
  });
  box.append(
    svg('line', { class: 'gpulab-dash-grid', x1: 0, x2: W, y1: H / 2, y2: H / 2 }),
    svg('line', { class: 'gpulab-dash-grid', x1: 0, x2: W, y1: 1, y2: 1 })
  );
  const start = now - span;
  const x = (t: number) => ((t - start) / span) * W;
  const y = (v: number) => H - 1 - (Math.min(Math.max(v, 0), max) / (max || 1)) * (H - 2);
  const runs: [number, number][][] = [];
  let run: [number, number][] = [];
  let prev = -Infinity;
  let drawn = 0;
  for (const [t, v] of series.points) {
    if (t < start) {
      continue;
    }
    if (v === null || t - prev > gapS) {
      if (run.length) {
        runs.push(run);
      }
      run = [];
    }
    if (v !== null) {
      run.push([x(t), y(v)]);
      drawn++;
    }
    prev = t;
  }
  if (run.length) {
    runs.push(run);
  }
  for (const r of runs) {
    if (r.length === 1) {
      r.unshift([r[0][0] - 2, r[0][1]]); // one point still shows, as a short dash
    }
    const line = r.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join(' ');
    const floor = `${r[r.length - 1][0].toFixed(1)},${H} ${r[0][0].toFixed(1)},${H}`;
    box.append(
      svg('polygon', { class: 'gpulab-dash-area', points: `${line} ${floor}` }),
      svg('polyline', { class: 'gpulab-dash-line', points: line })
    );
  }
  box.dataset.points = String(drawn);
  return box;
}

function gib(bytes: number): string {
  const g = bytes / GIB;
  return g >= 10 ? g.toFixed(0) : g.toFixed(1);
}

/** One metric of a card: its name and value now, and its chart (or why there is none). */
class Metric {
  readonly node = el('div', 'gpulab-dash-metric');
  private value = el('span', 'gpulab-dash-value');
  private scale = el('span', 'gpulab-dash-scale');
  private box = el('div', 'gpulab-dash-chartbox');

  constructor(readonly metric: string, label: string) {
    this.node.dataset.metric = metric;
    const head = el('div', 'gpulab-dash-metric-head');
    head.append(el('span', 'gpulab-dash-label', label), this.value);
    this.node.append(head, this.box);
  }

  draw(value: string, series: Series, view: IView, max: number, scale: string, gapS: number) {
    this.value.textContent = value;
    this.scale.textContent = scale;
    this.box.replaceChildren(chart(this.metric, series, view, max, gapS), this.scale);
  }

  /** No chart: why, in a few words (the whole reason in the tooltip). */
  unmeasured(value: string, words: string, reason: string): void {
    this.value.textContent = value;
    const note = el('div', 'gpulab-dash-unmeasured', words);
    note.title = reason;
    this.box.replaceChildren(note);
  }
}

/** One GPU: its name, three charts, the slices held on it. */
class GpuCard {
  readonly node = el('div', 'gpulab-dash-gpu');
  private name = el('span', 'gpulab-name');
  private where = el('span', 'gpulab-dash-node');
  private badge = el('span', 'gpulab-state', 'simulated');
  private util = new Metric('util', 'utilisation');
  private memory = new Metric('memory', 'memory');
  private held = new Metric('held', 'held');
  private slices = el('div', 'gpulab-dash-slices');

  constructor(gpu: IGpu) {
    this.node.dataset.node = gpu.node;
    this.node.dataset.index = String(gpu.index);
    const head = el('div', 'gpulab-row-head gpulab-dash-head');
    head.append(this.name, this.where, this.badge);
    const metrics = el('div', 'gpulab-dash-metrics');
    metrics.append(this.util.node, this.memory.node, this.held.node);
    this.node.append(head, metrics, this.slices);
  }

  update(gpu: IGpu, view: IView): void {
    this.name.textContent = `GPU ${gpu.index} · ${gpu.model}`;
    this.where.textContent = gpu.node;
    this.badge.hidden = !gpu.simulated;
    const { now, gapS } = view;
    const recent = (s: Series) => {
      const p = s.latest();
      return p && p[1] !== null && now - p[0] <= gapS ? p[1] : null;
    };
    const measured = gpu.util.points.length > 0 || gpu.memory.points.length > 0;
    const totalBytes = gpu.totalBytes ?? (gpu.memoryMib ? gpu.memoryMib * 1024 * 1024 : 0);
    if (measured) {
      const u = recent(gpu.util);
      const m = recent(gpu.memory);
      this.util.draw(u === null ? '–' : `${Math.round(u)} %`, gpu.util, view, 100, '100 %', gapS);
      const used = m === null ? '–' : gib(m);
      const total = totalBytes ? ` / ${gib(totalBytes)} GiB` : ' GiB';
      const scale = totalBytes ? `${gib(totalBytes)} GiB` : '';
      this.memory.draw(used + total, gpu.memory, view, totalBytes || 1, scale, gapS);
    } else {
      const [words, reason] = view.unmeasured(gpu);
      this.util.unmeasured('–', words, reason);
      this.memory.unmeasured(totalBytes ? `– / ${gib(totalBytes)} GiB` : '–', words, reason);
    }
    if (!gpu.listed) {
      const why = 'gpulab places no slices on a GPU its inventory does not list';
      this.held.unmeasured('–', 'not in the inventory', why);
      this.slices.replaceChildren(el('div', 'gpulab-note', `Not in gpulab's inventory: ${why}.`));
      return;
    }
    const heldNow = gpu.allocatedMilli;
    this.held.draw(
      heldNow ? gpuLabel(heldNow) : 'none',
      gpu.held,
      view,
      1,
      '1 GPU',
      view.heldGapS
    );
    this.drawSlices(gpu, view);
  }

  private drawSlices(gpu: IGpu, view: IView): void {
    const mine = view.slices.filter(
      s => s.gpu_uuid === gpu.key || `${s.node}/${s.gpu_index}` === gpu.key
    );
    const shown = mine.reduce((n, s) => n + (s.milli || 0), 0);
    const free = Math.max(0, 1000 - gpu.allocatedMilli);
    const rows: HTMLElement[] = [];
    const total = el(
      'div',
      'gpulab-dash-held-total',
      !gpu.allocatedMilli
        ? 'Nothing holds it: the whole GPU is free.'
        : free
          ? `${gpuLabel(gpu.allocatedMilli)} held, ${gpuLabel(free)} free`
          : `${gpuLabel(gpu.allocatedMilli)} held: nothing free`
    );
    rows.push(total);
    if (mine.length) {
      const table = el('table', 'gpulab-table gpulab-dash-slice-table');
      for (const s of mine) {
        const tr = el('tr', 'gpulab-dash-slice');
        tr.dataset.name = String(s.name);
        const who = s.user === view.you ? '' : ` (${s.user})`;
        tr.append(
          el('td', 'gpulab-dash-slice-name', `${s.name}${who}`),
          el('td', '', gpuLabel(s.milli)),
          el('td', '', s.memory_mib ? `${gib(s.memory_mib * 1024 * 1024)} GiB` : '')
        );
        tr.title = `on ${s.node}, GPU ${s.gpu_index}`;
        table.append(tr);
      }
      rows.push(table);
    }
    if (gpu.allocatedMilli > shown) {
      const rest = gpu.allocatedMilli - shown;
      rows.push(el('div', 'gpulab-note', `Other users hold ${gpuLabel(rest)} of it.`));
    }
    this.slices.replaceChildren(...rows);
  }
}

/** What a card needs of the whole answer. */
interface IView {
  now: number;
  /** Seconds the charts span: what is known, at least MIN_SPAN_S, at most WINDOW_S. */
  span: number;
  gapS: number;
  heldGapS: number;
  you: string;
  slices: any[];
  unmeasured: (gpu: IGpu) => [string, string];
}

/** The dashboard: a header line, what is not measured and why, a card per GPU. */
export class GpuDashboard extends Section {
  constructor() {
    super('dashboard', 'GPU dashboard');
    this.header.append(this.summary, this.updated);
  }

  protected pollMs(): number {
    return POLL_MS;
  }

  protected async load(): Promise<void> {
    const answer = await apiGet(`telemetry?since=${this.since().toFixed(3)}`);
    this.ingest(answer);
    if (!this.gpus.size) {
      const reason = answer.inventory && answer.inventory.reason;
      this.empty(
        `No GPUs here${reason ? `: ${reason}` : ''}. ` +
          'Start the hub on a machine with GPUs, or with --simulate-gpus 2xA100-80GB for a demo.'
      );
      return;
    }
    this.draw();
  }

  /** The `since` to ask for: the oldest newest-sample of the live nodes, no older than
   * the window (in the service's clock, as far as the last answer said it). */
  private since(): number {
    const serverNow = Date.now() / 1000 + this.offset;
    let since = serverNow - WINDOW_S;
    const last = Object.values(this.lastTs);
    if (last.length) {
      const newest = Math.max(...last);
      const cursor = Math.min(...last.filter(t => t >= newest - STALE_NODE_S));
      since = Math.max(since, cursor);
    }
    return since;
  }

  private gpu(node: string, index: number, uuid: unknown): IGpu {
    const key = uuid ? String(uuid) : `${node}/${index}`;
    let gpu = this.gpus.get(key);
    if (!gpu) {
      gpu = {
        key,
        node,
        index,
        model: 'GPU',
        simulated: false,
        memoryMib: null,
        allocatedMilli: 0,
        listed: false,
        util: new Series(),
        memory: new Series(),
        totalBytes: null,
        held: new Series()
      };
      this.gpus.set(key, gpu);
    }
    return gpu;
  }

  private ingest(answer: any): void {
    const now = Number(answer.now) || Date.now() / 1000;
    this.offset = now - Date.now() / 1000;
    this.interval = Number(answer.interval_s) || 1;
    this.missing = {};
    const seen = new Set<string>();
    for (const [node, entry] of Object.entries<any>(answer.nodes || {})) {
      this.missing[node] = (entry && entry.missing) || {};
      const samples = ((entry && entry.samples) || []) as any[];
      samples.sort((a, b) => (a.ts || 0) - (b.ts || 0));
      for (const sample of samples) {
        const ts = Number(sample.ts);
        if (!(ts > (this.lastTs[node] ?? -Infinity))) {
          continue; // already seen: the cursor overlaps for slower nodes
        }
        this.lastTs[node] = ts;
        for (const g of sample.gpus || []) {
          // A MIG device's numbers are its own, under its physical GPU's.
          for (const d of [g, ...(g.mig || [])]) {
            const gpu = this.gpu(node, Number(g.index), d.uuid);
            if (d === g && g.name && gpu.model === 'GPU') {
              gpu.model = String(g.name).replace(/^NVIDIA /, '');
            }
            const util = d.utilization_ratio;
            gpu.util.add(ts, typeof util === 'number' ? util * 100 : null);
            gpu.memory.add(ts, d.memory_used_bytes);
            if (typeof d.memory_total_bytes === 'number') {
              gpu.totalBytes = d.memory_total_bytes;
            }
          }
        }
      }
    }
    this.parents.clear();
    for (const gpu of this.gpus.values()) {
      gpu.listed = false;
    }
    for (const n of (answer.inventory && answer.inventory.nodes) || []) {
      for (const g of n.gpus || []) {
        const gpu = this.gpu(String(n.name), Number(g.index), g.uuid);
        seen.add(gpu.key);
        gpu.listed = true;
        if (g.mig_parent) {
          this.parents.add(String(g.mig_parent)); // its MIG devices are shown, not it
        }
        gpu.model = String(g.model || gpu.model);
        gpu.simulated = Boolean(g.simulated);
        gpu.memoryMib = typeof g.memory_mib === 'number' ? g.memory_mib : null;
        gpu.allocatedMilli = Number(g.allocated_milli) || 0;
        gpu.held.add(now, gpu.allocatedMilli / 1000);
      }
    }
    for (const gpu of this.gpus.values()) {
      for (const s of [gpu.util, gpu.memory, gpu.held]) {
        s.trim(now - WINDOW_S);
      }
      // A GPU gone from the inventory and from the last minutes of samples goes.
      if (!seen.has(gpu.key) && !gpu.util.points.length && !gpu.held.points.length) {
        this.gpus.delete(gpu.key);
      }
    }
    this.slices = Array.isArray(answer.slices) ? answer.slices : [];
    this.you = String((answer.you && answer.you.name) || '');
    this.now = now;
  }

  private draw(): void {
    const gpus = [...this.gpus.values()].filter(g => !this.parents.has(g.key)).sort(
      (a, b) => a.node.localeCompare(b.node) || a.index - b.index
    );
    const nodes = new Set(gpus.map(g => g.node));
    this.summary.textContent = `${plural(gpus.length, 'GPU')} on ${plural(nodes.size, 'node')}`;
    let oldest = this.now;
    for (const g of gpus) {
      for (const s of [g.util, g.memory, g.held]) {
        oldest = Math.min(oldest, s.points.length ? s.points[0][0] : this.now);
      }
    }
    const span = Math.min(WINDOW_S, Math.max(MIN_SPAN_S, this.now - oldest));
    const spanText = span < 90 ? `${Math.round(span)} s` : `${Math.round(span / 60)} min`;
    this.updated.textContent =
      `charts: the last ${spanText}, now at the right · ` +
      `updated ${new Date(this.now * 1000).toLocaleTimeString()}`;
    const notes: HTMLElement[] = [];
    if (gpus.some(g => g.simulated)) {
      notes.push(
        el(
          'div',
          'gpulab-note',
          'GPUs are simulated (declared for demos and tests): slices are tracked, ' +
            'utilisation and memory are not measured.'
        )
      );
    }
    for (const [node, why] of Object.entries(this.missing)) {
      const reason = why && why.gpu;
      if (reason && gpus.some(g => g.node === node && !g.simulated)) {
        notes.push(el('div', 'gpulab-note', `No GPU telemetry on ${node}: ${reason}`));
      }
    }
    this.notes.replaceChildren(...notes);
    const gapS = Math.max(10, 5 * this.interval);
    const view: IView = {
      now: this.now,
      span,
      gapS,
      heldGapS: Math.max(10, (5 * POLL_MS) / 1000),
      you: this.you,
      slices: this.slices,
      unmeasured: gpu => {
        const reason = (this.missing[gpu.node] || {}).gpu || '';
        if (gpu.simulated) {
          return ['not measured (simulated)', reason || 'declared with --simulate-gpus'];
        }
        return ['no telemetry', reason || 'no sample from this node reports this GPU'];
      }
    };
    const cards: HTMLElement[] = [];
    for (const gpu of gpus) {
      let card = this.cards.get(gpu.key);
      if (!card) {
        card = new GpuCard(gpu);
        this.cards.set(gpu.key, card);
      }
      card.update(gpu, view);
      cards.push(card.node);
    }
    for (const key of [...this.cards.keys()]) {
      if (!this.gpus.has(key)) {
        this.cards.delete(key);
      }
    }
    this.grid.replaceChildren(...cards);
    if (this.header.parentNode !== this.body) {
      this.body.replaceChildren(this.header, this.notes, this.grid);
    }
  }

  private header = el('div', 'gpulab-dash-header');
  private summary = el('span', 'gpulab-total');
  private updated = el('span', 'gpulab-dash-updated');
  private notes = el('div', 'gpulab-dash-notes');
  private grid = el('div', 'gpulab-dash-grid-cards');
  private gpus = new Map<string, IGpu>();
  private cards = new Map<string, GpuCard>();
  /** UUIDs of GPUs split into MIG devices (the inventory lists the devices). */
  private parents = new Set<string>();
  private lastTs: { [node: string]: number } = {};
  private missing: { [node: string]: { [source: string]: string } } = {};
  private slices: any[] = [];
  private you = '';
  private now = 0;
  private offset = 0;
  private interval = 1;
}

/**
 * The command "gpulab: Open GPU dashboard" (palette), a small button on the gpulab
 * panel's tab bar that runs it, and the tab restored with the layout. One dashboard:
 * the command shows the open one rather than a second.
 */
export function addDashboard(
  app: JupyterFrontEnd,
  palette: ICommandPalette | null,
  restorer: ILayoutRestorer | null,
  panel: TabPanel,
  icon: LabIcon
): void {
  const tracker = new WidgetTracker<MainAreaWidget<GpuDashboard>>({
    namespace: 'gpulab-dashboard'
  });
  app.commands.addCommand(OPEN_DASHBOARD, {
    label: 'gpulab: Open GPU dashboard',
    caption: 'Utilisation, memory and the slices held on each GPU, live; no kernel needed',
    execute: () => {
      let widget = tracker.find(w => !w.isDisposed);
      if (!widget) {
        widget = new MainAreaWidget({ content: new GpuDashboard() });
        widget.id = `gpulab-dashboard-${Date.now()}`;
        widget.title.label = 'GPU dashboard';
        widget.title.icon = icon;
        widget.title.closable = true;
        widget.addClass('gpulab-MainArea');
        widget.addClass('gpulab-Dashboard');
        void tracker.add(widget);
        app.shell.add(widget, 'main');
      }
      app.shell.activateById(widget.id);
    }
  });
  if (palette) {
    palette.addItem({ command: OPEN_DASHBOARD, category: 'gpulab' });
  }
  if (restorer) {
    void restorer.restore(tracker, { command: OPEN_DASHBOARD, name: () => 'gpulab-dashboard' });
  }
  const button = el('button', 'gpulab-dash-open');
  button.title = 'Open the GPU dashboard in a tab';
  button.setAttribute('aria-label', 'Open GPU dashboard');
  button.append(chartIcon.element({ tag: 'span', height: '16px', width: '16px' }));
  button.addEventListener('click', () => void app.commands.execute(OPEN_DASHBOARD));
  panel.tabBar.node.append(button);
}
