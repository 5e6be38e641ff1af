// Alerts: GET /alerts, firing first, then the newest; a firing alert nobody has
// acknowledged yet has an Acknowledge button (POST /alerts/{id}/ack).
import { apiGet, apiPost } from './api';
import { ago, el, Section } from './section';

export class AlertsSection extends Section {
  constructor() {
    super('alerts', 'Alerts');
  }

  protected async load(): Promise<void> {
    const data = await apiGet('alerts');
    const alerts = ((data && data.alerts) || []) as any[];
    alerts.sort((a, b) => {
      const firing = Number(b.state === 'firing') - Number(a.state === 'firing');
      return firing || String(b.since).localeCompare(String(a.since));
    });
    if (!alerts.length) {
      this.empty('No alerts in the last 24 h.');
      return;
    }
    const list = el('div', 'gpulab-list');
    list.append(el('div', 'gpulab-facts', `${data.firing} firing now`));
    for (const a of alerts.slice(0, 100)) {
      const row = el('div', `gpulab-row gpulab-alert gpulab-alert-${a.state}`);
      const head = el('div', 'gpulab-row-head');
      head.append(
        el('span', `gpulab-severity gpulab-severity-${a.severity}`, a.severity),
        el('span', 'gpulab-name', a.name),
        el('span', `gpulab-state gpulab-state-${a.state}`, a.state)
      );
      row.append(head, el('div', 'gpulab-message', a.message));
      const when =
        a.state === 'firing' ? `since ${ago(a.since)}` : `resolved ${ago(a.resolved_at)}`;
      const seen = a.acknowledged_by ? ` · acknowledged by ${a.acknowledged_by}` : '';
      row.append(el('div', 'gpulab-facts', `${a.subject_kind} ${a.subject} · ${when}${seen}`));
      if (a.state === 'firing' && !a.acknowledged_at) {
        const button = el('button', 'jp-mod-styled gpulab-action', 'Acknowledge');
        button.title =
          a.name === 'JobFailed'
            ? 'You have seen it: it resolves'
            : 'You have seen it: it stops counting as firing, and resolves when its cause is gone';
        button.onclick = () => void this.acknowledge(a.id, button);
        row.append(button);
      }
      list.append(row);
    }
    this.body.replaceChildren(list);
  }

  private async acknowledge(id: number, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    button.textContent = 'Acknowledging…';
    try {
      await apiPost(`alerts/${id}/ack`, {});
    } catch (err) {
      button.disabled = false;
      button.textContent = 'Acknowledge';
      this.problem.textContent = `Could not acknowledge alert #${id}: ${(err as Error).message}`;
      this.problem.hidden = false;
      return;
    }
    await this.refresh();
  }
}
