// The status-bar item: this server's slice in words, e.g. "1/4 A100-80GB · 20 GiB ·
// simulated", and a badge with the number of the user's alerts firing. Click opens
// the gpulab panel (on the Alerts tab while some fire, else on the Slice tab). Where
// the site sets GPU-hour budgets (or a price), what is left this period follows.
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { apiGet, getSlice, ISlice, plural, serverGone, sliceFacts } from './api';
import { budgetLines, budgetShort, IBudget } from './budget';

const REFRESH_MS = 5000;
/** Alerts are asked for every third refresh: they change on the service's minute. */
const ALERTS_EVERY = 3;

export class SliceStatus extends Widget {
  constructor(
    icon: LabIcon,
    onClick: (firing: number) => void,
    onAlerts: (firing: number) => void = () => undefined
  ) {
    super();
    this.addClass('gpulab-SliceStatus');
    this.node.title = 'gpulab: this server’s GPU slice';
    const iconNode = document.createElement('span');
    iconNode.className = 'gpulab-SliceStatus-icon';
    icon.element({ container: iconNode, height: '16px', width: '16px' });
    this._text = document.createElement('span');
    this._text.className = 'gpulab-SliceStatus-text';
    this._text.textContent = 'gpulab: …';
    this._badge = document.createElement('span');
    this._badge.className = 'gpulab-alert-badge';
    this._badge.hidden = true;
    this.node.append(iconNode, this._text, this._badge);
    this.node.addEventListener('click', () => onClick(this._firing));
    this._onAlerts = onAlerts;
    void this.refresh();
    this._timer = window.setInterval(() => void this.refresh(), REFRESH_MS);
  }

  dispose(): void {
    window.clearInterval(this._timer);
    super.dispose();
  }

  async refresh(): Promise<void> {
    if (document.hidden && this._text.textContent !== 'gpulab: …') {
      return; // a background browser tab: no polling
    }
    if (serverGone()) {
      this._text.textContent = 'gpulab: server stopped';
      return; // api.ts asks the hub why, and resumes or leaves the tab
    }
    let slice: ISlice;
    try {
      slice = await getSlice();
    } catch (err) {
      this._text.textContent = 'gpulab: ?';
      this.node.title = `gpulab: ${(err as Error).message}`;
      return;
    }
    if (this._polls++ % ALERTS_EVERY === 0) {
      await this.readAlerts();
      await this.readBudget();
    }
    const left = this._budget ? budgetShort(this._budget) : '';
    this._text.textContent = left ? `${slice.text} · ${left}` : slice.text;
    this.node.dataset.budget = left;
    this.node.dataset.milli = String(slice.milli);
    const lines = [
      ...sliceFacts(slice),
      ...(this._budget ? budgetLines(this._budget) : []),
      slice.service_problem ? `gpulab service: ${slice.service_problem}` : '',
      this._firing ? `${plural(this._firing, 'alert')} firing` : '',
      this._firing ? 'click: open the gpulab panel on its alerts' : 'click: open the gpulab panel'
    ];
    this.node.title = lines.filter(Boolean).join('\n');
  }

  private async readAlerts(): Promise<void> {
    let firing = 0;
    try {
      firing = Number((await apiGet('alerts')).firing) || 0;
    } catch {
      return; // the slice's line says what is wrong with the service
    }
    this._firing = firing;
    this._badge.textContent = String(firing);
    this._badge.title = `${plural(firing, 'alert')} firing`;
    this._badge.hidden = firing === 0;
    this._onAlerts(firing);
  }

  private async readBudget(): Promise<void> {
    try {
      const b = (await apiGet('budget')) as IBudget;
      // Nothing to say where no budget applies and no price is set.
      this._budget = b.set || b.price_per_gpu_hour ? b : null;
    } catch {
      this._budget = null; // an older service without budgets
    }
  }

  private _budget: IBudget | null = null;
  private _timer: number;
  private _text: HTMLSpanElement;
  private _badge: HTMLSpanElement;
  private _firing = 0;
  private _polls = 0;
  private _onAlerts: (firing: number) => void;
}
