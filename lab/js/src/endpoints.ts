// Endpoints: the user's deployments with their URL, versions and traffic, and a
// "Copy curl" control giving the curl line %deploy prints (magics/deploy.py).
import { Clipboard } from '@jupyterlab/apputils';

import { apiGet } from './api';
import { el, Section } from './section';

/** A float as Python prints it (0.0, not 0). */
class PyFloat {
  constructor(readonly value: number) {}
}

/** Python's json.dumps layout (", " and ": "), so the line reads as %deploy's. */
function pyJson(value: any): string {
  if (value instanceof PyFloat) {
    const v = value.value;
    return Number.isInteger(v) ? v.toFixed(1) : String(v);
  }
  if (Array.isArray(value)) {
    return `[${value.map(pyJson).join(', ')}]`;
  }
  if (value && typeof value === 'object') {
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}: ${pyJson(v)}`)
      .join(', ')}}`;
  }
  return JSON.stringify(value);
}

/** The endpoint's URL as the user's browser reaches the hub. */
export function endpointUrl(dep: any): string {
  return window.location.origin + dep.path;
}

/** The curl line for one call: a batch of one, zeros in the model card's shape. */
export function curlLine(dep: any): string {
  const infer = `${endpointUrl(dep)}/v2/models/${dep.name}/infer`;
  const inputs = ((dep.model || {}).inputs || []) as any[];
  const rows = inputs.map(spec => {
    const shape = (spec.shape || [-1]).map((d: number, i: number) =>
      i === 0 || d < 0 ? 1 : d
    );
    const size = shape.reduce((a: number, b: number) => a * b, 1);
    const zero = String(spec.datatype || '').startsWith('FP') ? new PyFloat(0) : 0;
    return {
      name: spec.name,
      shape,
      datatype: spec.datatype,
      data: size <= 16 ? new Array(size).fill(zero) : '...'
    };
  });
  const body = pyJson({ inputs: rows });
  return (
    'curl -H "Authorization: token $JUPYTERHUB_API_TOKEN" ' +
    "-H 'Content-Type: application/json' \\\n" +
    `    -d '${body}' \\\n` +
    `    ${infer}`
  );
}

function num(v: number | null | undefined, digits = 1): string {
  return v === null || v === undefined ? '–' : v.toFixed(digits);
}

export class EndpointsSection extends Section {
  constructor() {
    super('endpoints', 'Endpoints');
  }

  protected async load(): Promise<void> {
    const deps: any[] = await apiGet('deployments');
    if (!deps.length) {
      this.empty(
        'No endpoints. Deploy a model from a notebook with %deploy MODEL --name NAME --example X.'
      );
      return;
    }
    const list = el('div', 'gpulab-list');
    for (const dep of deps) {
      list.append(this.row(dep));
    }
    this.body.replaceChildren(list);
  }

  private row(dep: any): HTMLElement {
    const row = el('div', 'gpulab-row gpulab-endpoint');
    row.dataset.name = dep.name;
    const head = el('div', 'gpulab-row-head');
    head.append(
      el('span', 'gpulab-name', dep.name),
      el('span', `gpulab-state gpulab-state-${dep.state}`, dep.state)
    );
    row.append(head);
    const url = el('div', 'gpulab-url', endpointUrl(dep));
    url.title = 'POST <url>/v2/models/<name>/infer with a hub token';
    row.append(url);
    row.append(
      el(
        'div',
        'gpulab-facts',
        [
          `${dep.replicas_ready}/${dep.replicas} replicas ready`,
          `${num(dep.requests_per_second)} req/s`,
          `p99 ${dep.p99_latency_ms === null || dep.p99_latency_ms === undefined ? '–' : num(dep.p99_latency_ms) + ' ms'}`,
          `${dep.requests_total || 0} calls`
        ].join(' · ')
      )
    );
    const versions = (dep.versions || []) as any[];
    if (versions.length > 1) {
      const table = el('table', 'gpulab-table gpulab-versions');
      const head = el('tr');
      for (const h of ['version', 'traffic', 'state', 'req/s', 'p99 ms', 'errors']) {
        head.append(el('th', '', h));
      }
      table.append(head);
      for (const v of versions) {
        const tr = el('tr');
        for (const cell of [
          `v${v.version}`,
          `${v.weight}%`,
          v.state,
          num(v.requests_per_second),
          num(v.p99_latency_ms),
          `${((v.error_rate || 0) * 100).toFixed(1)}%`
        ]) {
          tr.append(el('td', '', cell));
        }
        table.append(tr);
      }
      row.append(table);
    } else if (versions.length === 1) {
      row.append(el('div', 'gpulab-facts', `v${versions[0].version}: all traffic`));
    }
    if (dep.message && dep.state !== 'running') {
      row.append(el('div', 'gpulab-message', dep.message));
    }
    const actions = el('div', 'gpulab-actions');
    const copy = el('button', 'jp-Button jp-mod-styled jp-mod-reject gpulab-copy-curl', 'Copy curl');
    copy.title = 'Copy a curl call of this endpoint (uses $JUPYTERHUB_API_TOKEN)';
    copy.onclick = () => {
      Clipboard.copyToSystem(curlLine(dep));
      copy.textContent = 'Copied';
      window.setTimeout(() => (copy.textContent = 'Copy curl'), 1500);
    };
    actions.append(copy);
    row.append(actions);
    return row;
  }
}
