// The top of the gpulab panel: this server's slice in words (what the status bar's
// tooltip said), and what else of the user's holds GPU (running jobs, endpoints),
// each with its stop: stopping this server leaves those holding theirs.
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';

import { apiDelete, apiGet, apiPost, getSlice, gpuLabel, plural, sliceFacts } from './api';
import { el, Section } from './section';

/** What one running job or endpoint holds, in milli-GPU. */
export function jobMilli(job: any): number {
  return (job.gpu_milli || 0) * (job.world_size || 1);
}

export function endpointMilli(dep: any): number {
  return ((dep.versions || []) as any[]).reduce(
    (sum, v) => sum + (v.gpu_milli || 0) * (v.replicas || 0),
    0
  );
}

export class SliceSection extends Section {
  constructor() {
    super('slice', 'Slice');
  }

  protected async load(): Promise<void> {
    const slice = await getSlice();
    const box = el('div', 'gpulab-list');
    const head = el('div', 'gpulab-row-head');
    head.append(el('span', 'gpulab-name gpulab-slice-text', slice.text));
    box.append(head);
    for (const f of sliceFacts(slice)) {
      box.append(el('div', 'gpulab-facts', f));
    }
    if (slice.service_problem) {
      box.append(el('div', 'gpulab-error', `gpulab service: ${slice.service_problem}`));
    }
    if (slice.managed) {
      box.append(await this.hibernation(slice.server_name || ''));
      box.append(await this.elsewhere());
    }
    this.body.replaceChildren(box);
  }

  /** This server's last hibernation, and the button that hibernates it: every kernel
   * saves its variables, the server stops and its GPU goes back. */
  private async hibernation(server: string): Promise<HTMLElement> {
    const part = el('div', 'gpulab-hibernation');
    const rows = (await apiGet(
      `hibernations?server=${encodeURIComponent(server)}`
    )) as any[];
    const last = rows && rows.length ? rows[0] : null;
    const head = el('div', 'gpulab-row-head');
    head.append(
      el(
        'span',
        'gpulab-note gpulab-hibernation-last',
        last ? `Last hibernation: ${last.summary}` : 'Never hibernated.'
      )
    );
    const button = el(
      'button',
      'jp-Button jp-mod-styled jp-mod-accept gpulab-hibernate',
      'Hibernate'
    );
    button.title =
      'Save every kernel’s variables, stop this server and give its GPU back; ' +
      'starting it again brings them back';
    button.disabled = last?.state === 'saving';
    button.onclick = () => void this.hibernate(server, button);
    const actions = el('div', 'gpulab-actions');
    actions.append(button);
    part.append(head, actions);
    return part;
  }

  private async hibernate(server: string, button: HTMLButtonElement): Promise<void> {
    const answer = await showDialog({
      title: 'Hibernate this server?',
      body:
        'Each kernel saves its variables to ~/.gpulab/hibernate, then this server ' +
        'stops and its GPU slice goes back. Start it again (any size) and open your ' +
        'notebooks: each gets its variables back. Open files, sockets and generators ' +
        'do not come back.',
      buttons: [
        Dialog.cancelButton({ label: 'Keep running' }),
        Dialog.okButton({ label: 'Hibernate' })
      ]
    });
    if (!answer.button.accept) {
      return;
    }
    button.disabled = true;
    button.textContent = 'Hibernating…';
    try {
      await apiPost('hibernations', { server });
    } catch (err) {
      this.problem.textContent = `not hibernated: ${(err as Error).message}`;
      this.problem.hidden = false;
      button.disabled = false;
      button.textContent = 'Hibernate';
      return;
    }
    // This server stops in a few seconds: say where to start it again.
    const note = el(
      'div',
      'gpulab-note gpulab-hibernating',
      'Hibernating: each kernel saves its variables, then this server stops. Start it ' +
        'again from the '
    );
    const home = el('a', '', 'hub’s home page');
    home.href = URLExt.join(PageConfig.getOption('hubPrefix') || '/hub/', 'home');
    note.append(home, '.');
    button.parentElement?.replaceChildren(note);
  }

  /** The user's running jobs and endpoints that hold GPU, each with its stop. */
  private async elsewhere(): Promise<HTMLElement> {
    const [jobs, deps] = await Promise.all([apiGet('jobs'), apiGet('deployments')]);
    const holding = el('div', 'gpulab-holding');
    const rows: HTMLElement[] = [];
    for (const job of (jobs || []) as any[]) {
      if ((job.state === 'running' || job.state === 'queued') && jobMilli(job)) {
        const what =
          job.state === 'running'
            ? `holds ${gpuLabel(jobMilli(job))} (${plural(job.world_size || 1, 'rank')})`
            : `waits for ${gpuLabel(jobMilli(job))}`;
        rows.push(
          this.holder('job', job.name || job.id, what, 'Cancel', () =>
            this.stop(
              'Cancel this job?',
              `${job.name || job.id} stops on every rank and its GPU slices are released.`,
              'Cancel job',
              `jobs/${encodeURIComponent(job.id)}`
            )
          )
        );
      }
    }
    for (const dep of (deps || []) as any[]) {
      if (endpointMilli(dep)) {
        rows.push(
          this.holder(
            'endpoint',
            dep.name,
            `holds ${gpuLabel(endpointMilli(dep))} (${plural(dep.replicas || 0, 'replica')})`,
            'Stop',
            () =>
              this.stop(
                'Stop this endpoint?',
                `${dep.name} stops answering calls and its GPU slices are released.`,
                'Stop endpoint',
                `deployments/${encodeURIComponent(dep.name)}`
              )
          )
        );
      }
    }
    if (!rows.length) {
      holding.append(el('div', 'gpulab-note', 'Nothing else of yours holds GPU.'));
      return holding;
    }
    holding.append(
      el(
        'div',
        'gpulab-note',
        'Also holding GPU (stopping this server does not stop them):'
      ),
      ...rows
    );
    return holding;
  }

  private holder(
    kind: string,
    name: string,
    what: string,
    label: string,
    onStop: () => Promise<void>
  ): HTMLElement {
    const row = el('div', `gpulab-row gpulab-held gpulab-held-${kind}`);
    row.dataset.name = name;
    const head = el('div', 'gpulab-row-head');
    head.append(el('span', 'gpulab-name', `${kind} ${name}`), el('span', 'gpulab-facts', what));
    const stop = el('button', 'jp-Button jp-mod-styled jp-mod-warn gpulab-held-stop', label);
    stop.onclick = () => void onStop();
    const actions = el('div', 'gpulab-actions');
    actions.append(stop);
    row.append(head, actions);
    return row;
  }

  private async stop(title: string, body: string, label: string, path: string): Promise<void> {
    const answer = await showDialog({
      title,
      body,
      buttons: [Dialog.cancelButton({ label: 'Keep it' }), Dialog.warnButton({ label })]
    });
    if (!answer.button.accept) {
      return;
    }
    try {
      await apiDelete(path);
    } catch (err) {
      this.problem.textContent = `not stopped: ${(err as Error).message}`;
      this.problem.hidden = false;
      return;
    }
    await this.refresh();
  }
}
