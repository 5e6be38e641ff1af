// One section of the gpulab panel (Jobs, Endpoints, Alerts, Usage): polls the
// service while it is visible, shows an empty state or a short error in words.
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';
import { serverGone } from './api';

export const POLL_MS = 3000;
/** How often a section looks whether its next poll is due. */
const TICK_MS = 1000;

/** A DOM element with a class and optional text. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text) {
    e.textContent = text;
  }
  return e;
}

export function ago(iso: string | null | undefined): string {
  if (!iso) {
    return '';
  }
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 90) {
    return `${Math.round(s)} s ago`;
  }
  if (s < 5400) {
    return `${Math.round(s / 60)} min ago`;
  }
  if (s < 172800) {
    return `${Math.round(s / 3600)} h ago`;
  }
  return `${Math.round(s / 86400)} days ago`;
}

export abstract class Section extends Widget {
  constructor(readonly key: string, label: string) {
    super();
    this.id = `gpulab-section-${key}-${Private.count++}`;
    this.title.label = label;
    this.addClass('gpulab-Section');
    this.addClass(`gpulab-Section-${key}`);
    this.problem = el('div', 'gpulab-problem');
    this.problem.hidden = true;
    this.body = el('div', 'gpulab-body');
    this.node.append(this.problem, this.body);
    this._timer = window.setInterval(() => {
      const due = Date.now() - this._loaded >= this.pollMs();
      if (this.isVisible && !document.hidden && !serverGone() && due) {
        void this.refresh();
      }
    }, TICK_MS);
  }

  /** How often to poll while visible (a section showing live progress polls faster). */
  protected pollMs(): number {
    return POLL_MS;
  }

  /** Draw the section's current state into ``this.body``. */
  protected abstract load(): Promise<void>;

  async refresh(): Promise<void> {
    if (this._busy) {
      return;
    }
    this._busy = true;
    this._loaded = Date.now();
    try {
      await this.load();
      this.problem.hidden = true;
    } catch (err) {
      this.problem.textContent = (err as Error).message;
      this.problem.hidden = false;
    } finally {
      this._busy = false;
    }
  }

  /** Replace the body with an empty state in words. */
  protected empty(text: string): void {
    this.body.replaceChildren(el('div', 'gpulab-empty', text));
  }

  dispose(): void {
    window.clearInterval(this._timer);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    void this.refresh();
  }

  protected onAfterAttach(msg: Message): void {
    void this.refresh();
  }

  protected problem: HTMLDivElement;
  protected body: HTMLDivElement;
  private _timer: number;
  private _busy = false;
  private _loaded = 0;
}

namespace Private {
  export let count = 0;
}
