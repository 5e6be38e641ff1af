// Jobs: the user's training jobs by name, their progress (step/total from report(),
// polled every second while one runs, as the cell's own display is), logs on demand,
// Cancel with a confirmation, and Clear to hide the jobs that ended.
import { Dialog, showDialog } from '@jupyterlab/apputils';

import { apiDelete, apiGet, apiText, gpuLabel, plural } from './api';
import { ago, el, Section } from './section';

const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const LOG_LINES = 200;
const LIVE_POLL_MS = 1000;
/** Where the ids of the jobs cleared from the list are kept (per browser). */
const CLEARED_KEY = 'gpulab:cleared-jobs';

function readCleared(): Set<string> {
  try {
    return new Set(JSON.parse(window.localStorage.getItem(CLEARED_KEY) || '[]'));
  } catch {
    return new Set();
  }
}

interface IProgress {
  cursor: number;
  step: number | null;
  total: number | null;
}

export class JobsSection extends Section {
  constructor() {
    super('jobs', 'Jobs');
  }

  protected pollMs(): number {
    return this._running ? LIVE_POLL_MS : super.pollMs();
  }

  protected async load(): Promise<void> {
    const all: any[] = await apiGet('jobs');
    const cleared = readCleared();
    const jobs = all.filter(j => !(TERMINAL.has(j.state) && cleared.has(j.id)));
    jobs.sort((a, b) => {
      const live = Number(TERMINAL.has(a.state)) - Number(TERMINAL.has(b.state));
      return live || String(b.submitted).localeCompare(String(a.submitted));
    });
    this._running = jobs.some(j => j.state === 'running');
    await Promise.all(
      jobs.filter(j => j.state === 'running').map(j => this.readProgress(j.id))
    );
    if (!jobs.length) {
      this.empty(
        all.length
          ? `No jobs to show: ${plural(all.length, 'ended job')} cleared.`
          : 'No jobs yet. Start one from a notebook with %%train_distributed.'
      );
      return;
    }
    const names = new Map<string, number>();
    for (const j of jobs) {
      names.set(j.name, (names.get(j.name) || 0) + 1);
    }
    const list = el('div', 'gpulab-list');
    const ended = jobs.filter(j => TERMINAL.has(j.state));
    if (ended.length) {
      const bar = el('div', 'gpulab-actions gpulab-jobs-bar');
      const clear = el(
        'button',
        'jp-Button jp-mod-styled jp-mod-reject gpulab-clear-ended',
        `Clear ${plural(ended.length, 'ended job')}`
      );
      clear.title = 'Hide the jobs that ended from this list (the API keeps them)';
      clear.onclick = () => {
        const kept = readCleared();
        ended.forEach(j => kept.add(j.id));
        window.localStorage.setItem(CLEARED_KEY, JSON.stringify([...kept]));
        void this.refresh();
      };
      bar.append(clear);
      list.append(bar);
    }
    for (const job of jobs.slice(0, 50)) {
      list.append(this.row(job, (names.get(job.name) || 0) > 1));
    }
    this.body.replaceChildren(list);
    for (const id of this._logsOpen) {
      void this.showLogs(id);
    }
  }

  private async readProgress(id: string): Promise<void> {
    const p = this._progress.get(id) || { cursor: 0, step: null, total: null };
    const m = await apiGet(`jobs/${encodeURIComponent(id)}/metrics?rank=0&cursor=${p.cursor}`);
    for (const r of m.records || []) {
      if (r.step !== undefined && r.step !== null) {
        p.step = r.step;
      }
      if (r.total_steps !== undefined && r.total_steps !== null) {
        p.total = r.total_steps;
      }
    }
    if (typeof m.cursor === 'number') {
      p.cursor = m.cursor;
    }
    this._progress.set(id, p);
  }

  private row(job: any, sameName: boolean): HTMLElement {
    const row = el('div', 'gpulab-row gpulab-job');
    row.dataset.jobId = job.id;
    row.dataset.state = job.state;
    row.title = `job ${job.id}`;
    const head = el('div', 'gpulab-row-head');
    head.append(
      el('span', 'gpulab-name', job.name || job.id),
      el('span', `gpulab-state gpulab-state-${job.state}`, job.state)
    );
    row.append(head);

    // Jobs go by their names; the id only tells apart two of one name.
    const facts: string[] = sameName ? [job.id.slice(0, 8)] : [];
    const p = this._progress.get(job.id);
    if (job.state === 'running' && p && p.step !== null) {
      facts.push(p.total ? `step ${p.step}/${p.total}` : `step ${p.step}`);
    }
    if (job.state === 'queued' && job.position) {
      facts.push(`#${job.position} in the queue`);
    }
    facts.push(
      job.gpu_milli
        ? `${plural(job.world_size || 1, 'rank')}, ${gpuLabel(job.gpu_milli)} each`
        : `${plural(job.world_size || 1, 'rank')}, no GPU`
    );
    if (job.elastic) {
      // --nodes MIN:MAX: the size now of its range (the cell says each change).
      const range = `${job.min_nodes}-${job.max_nodes} nodes`;
      facts.push(job.state === 'running' ? `${job.nodes_running} of ${range}` : range);
    }
    facts.push(TERMINAL.has(job.state) ? `ended ${ago(job.finished)}` : `submitted ${ago(job.submitted)}`);
    row.append(el('div', 'gpulab-facts gpulab-progress', facts.join(' · ')));
    if (job.error && job.error.message) {
      row.append(
        el('div', 'gpulab-error', `rank ${job.error.rank}: ${job.error.type}: ${job.error.message}`)
      );
    } else if (job.message && job.state !== 'running') {
      row.append(el('div', 'gpulab-message', job.message));
    }

    const actions = el('div', 'gpulab-actions');
    const logs = el('button', 'jp-Button jp-mod-styled jp-mod-reject gpulab-logs-button', 'Logs');
    logs.onclick = () => this.toggleLogs(job.id);
    actions.append(logs);
    if (!TERMINAL.has(job.state)) {
      const cancel = el('button', 'jp-Button jp-mod-styled jp-mod-warn gpulab-cancel-button', 'Cancel');
      cancel.onclick = () => void this.cancel(job);
      actions.append(cancel);
    }
    row.append(actions);
    const pre = el('pre', 'gpulab-logs');
    pre.hidden = !this._logsOpen.has(job.id);
    pre.textContent = this._logs.get(job.id) || '';
    row.append(pre);
    return row;
  }

  private toggleLogs(id: string): void {
    if (this._logsOpen.has(id)) {
      this._logsOpen.delete(id);
    } else {
      this._logsOpen.add(id);
    }
    const pre = this.node.querySelector(
      `.gpulab-job[data-job-id="${CSS.escape(id)}"] .gpulab-logs`
    ) as HTMLPreElement | null;
    if (pre) {
      pre.hidden = !this._logsOpen.has(id);
    }
    if (this._logsOpen.has(id)) {
      void this.showLogs(id);
    }
  }

  private async showLogs(id: string): Promise<void> {
    let text: string;
    try {
      // Only the lines shown travel: a long job's whole log is not re-sent every poll.
      text = await apiText(`jobs/${encodeURIComponent(id)}/logs?tail=${LOG_LINES}`);
    } catch (err) {
      text = `logs not available: ${(err as Error).message}`;
    }
    text = text.replace(/\n$/, '') || '(no output yet)';
    this._logs.set(id, text);
    const pre = this.node.querySelector(
      `.gpulab-job[data-job-id="${CSS.escape(id)}"] .gpulab-logs`
    ) as HTMLPreElement | null;
    if (pre) {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = text;
      if (atEnd) {
        pre.scrollTop = pre.scrollHeight;
      }
    }
  }

  private async cancel(job: any): Promise<void> {
    const answer = await showDialog({
      title: 'Cancel this job?',
      body: `${job.name || job.id} stops on every rank and its GPU slices are released.`,
      buttons: [
        Dialog.cancelButton({ label: 'Keep it running' }),
        Dialog.warnButton({ label: 'Cancel job' })
      ]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await apiDelete(`jobs/${encodeURIComponent(job.id)}`);
    } catch (err) {
      this.problem.textContent = `cancel failed: ${(err as Error).message}`;
      this.problem.hidden = false;
      return;
    }
    await this.refresh();
  }

  private _running = false;
  private _progress = new Map<string, IProgress>();
  private _logsOpen = new Set<string>();
  private _logs = new Map<string, string>();
}
