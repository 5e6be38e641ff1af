// The status-bar item: this server's slice in words, e.g. "1/4 A100-80GB · 20 GiB ·
// simulated". Click opens the gpulab panel.
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { getSlice, gpuLabel, ISlice } from './api';

const REFRESH_MS = 5000;

export class SliceStatus extends Widget {
  constructor(icon: LabIcon, onClick: () => void) {
    super();
    this.addClass('gpulab-SliceStatus');
    this.node.title = 'gpulab: this server’s GPU slice';
    const iconNode = document.createElement('span');
    iconNode.className = 'gpulab-SliceStatus-icon';
    icon.element({ container: iconNode, height: '16px', width: '16px' });
    this._text = document.createElement('span');
    this._text.className = 'gpulab-SliceStatus-text';
    this._text.textContent = 'gpulab: …';
    this.node.append(iconNode, this._text);
    this.node.addEventListener('click', onClick);
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
    let slice: ISlice;
    try {
      slice = await getSlice();
    } catch (err) {
      this._text.textContent = 'gpulab: ?';
      this.node.title = `gpulab: ${(err as Error).message}`;
      return;
    }
    this._text.textContent = slice.text;
    this.node.dataset.milli = String(slice.milli);
    const lines = [
      slice.milli
        ? `${gpuLabel(slice.milli)} on ${slice.gpus.join(', ')}`
        : 'no GPU in this server’s slice',
      slice.enforcement ? `held by: ${slice.enforcement}` : '',
      slice.memory_note ? `memory in use: ${slice.memory_note}` : '',
      slice.limits ? `limits: ${slice.limits}` : '',
      slice.service_problem ? `gpulab service: ${slice.service_problem}` : '',
      'click: open the gpulab panel'
    ];
    this.node.title = lines.filter(Boolean).join('\n');
  }

  private _timer: number;
  private _text: HTMLSpanElement;
}
