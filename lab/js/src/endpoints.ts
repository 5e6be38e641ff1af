// Endpoints: the user's deployments with their URL, versions and traffic, a
// "Copy curl" control giving the curl line %deploy prints (magics/deploy.py), and
// "Try it": a call from the panel with inputs in the model's shapes, its answer shown;
// for a language model (model_kind "causal-lm") a small chat through the OpenAI gateway.
import { Clipboard } from '@jupyterlab/apputils';

import { apiGet, chatEndpoint, tryEndpoint } from './api';
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

/** Inputs of one call in the model card's shapes (a batch of one), zeros as data;
 * an input of more than ``limit`` values gets "..." (to fill in). */
export function exampleInputs(dep: any, limit = 16): any[] {
  const inputs = ((dep.model || {}).inputs || []) as any[];
  return inputs.map(spec => {
    const shape = (spec.shape || [-1]).map((d: number, i: number) =>
      i === 0 || d < 0 ? 1 : d
    );
    const size = shape.reduce((a: number, b: number) => a * b, 1);
    const zero = String(spec.datatype || '').startsWith('FP') ? new PyFloat(0) : 0;
    return {
      name: spec.name,
      shape,
      datatype: spec.datatype,
      data: size <= limit ? new Array(size).fill(zero) : '...'
    };
  });
}

/** The curl line for one call: a batch of one, zeros in the model card's shape. */
export function curlLine(dep: any): string {
  if (dep.model_kind === 'causal-lm') {
    // A language model answers on the OpenAI-compatible gateway, as %deploy prints.
    const gateway = window.location.origin + dep.path.split('/endpoints/')[0] + '/v1';
    const body = pyJson({
      model: `${dep.user}/${dep.name}`,
      messages: [{ role: 'user', content: 'Hello!' }],
      max_tokens: 32
    });
    return (
      'curl -H "Authorization: Bearer $JUPYTERHUB_API_TOKEN" ' +
      "-H 'Content-Type: application/json' \\\n" +
      `    -d '${body}' \\\n` +
      `    ${gateway}/chat/completions`
    );
  }
  const infer = `${endpointUrl(dep)}/v2/models/${dep.name}/infer`;
  const body = pyJson({ inputs: exampleInputs(dep) });
  return (
    'curl -H "Authorization: token $JUPYTERHUB_API_TOKEN" ' +
    "-H 'Content-Type: application/json' \\\n" +
    `    -d '${body}' \\\n` +
    `    ${infer}`
  );
}

/** What "Try it" sends first: the inputs as JSON, one per line. */
export function tryBody(dep: any): string {
  const rows = exampleInputs(dep, 4096).map(r => '  ' + pyJson(r));
  return `{"inputs": [\n${rows.join(',\n')}\n]}`;
}

/** An answer in a few lines: each output's name, shape and first values. */
export function tryAnswerText(status: number, text: string, ms: number): string {
  const head = `HTTP ${status} in ${ms.toFixed(0)} ms`;
  let data: any;
  try {
    data = JSON.parse(text);
  } catch {
    return `${head}\n${text.slice(0, 2000)}`;
  }
  if (status >= 400 || !Array.isArray(data.outputs)) {
    return `${head}\n${data.error || JSON.stringify(data, null, 2).slice(0, 2000)}`;
  }
  const lines = (data.outputs as any[]).map(o => {
    const values = (o.data || []) as any[];
    const shown = values.slice(0, 16).map(v => (typeof v === 'number' ? Number(v.toPrecision(4)) : v));
    const more = values.length > 16 ? `, … (${values.length} values)` : '';
    return `${o.name} ${o.datatype} [${(o.shape || []).join(', ')}]: [${shown.join(', ')}${more}]`;
  });
  return [head, ...lines].join('\n');
}

/** The assistant's words of a chat answer, or the refusal in one line. */
export function chatAnswerText(status: number, text: string, ms: number): {
  ok: boolean;
  text: string;
  facts: string;
} {
  let data: any;
  try {
    data = JSON.parse(text);
  } catch {
    return { ok: false, text: `HTTP ${status}: ${text.slice(0, 500)}`, facts: '' };
  }
  if (status >= 400 || !Array.isArray(data.choices) || !data.choices.length) {
    const error = data.error;
    const message = typeof error === 'string' ? error : (error && error.message) || text;
    return { ok: false, text: `HTTP ${status}: ${String(message).slice(0, 500)}`, facts: '' };
  }
  const usage = data.usage || {};
  return {
    ok: true,
    text: (data.choices[0].message || {}).content || '',
    facts: `${usage.prompt_tokens ?? '?'} prompt + ${usage.completion_tokens ?? '?'} tokens in ${ms.toFixed(0)} ms`
  };
}

function num(v: number | null | undefined, digits = 1): string {
  return v === null || v === undefined ? '–' : v.toFixed(digits);
}

export class EndpointsSection extends Section {
  constructor() {
    super('endpoints', 'Endpoints');
  }

  protected async load(): Promise<void> {
    const active = document.activeElement;
    if (active instanceof HTMLTextAreaElement && this.node.contains(active)) {
      return; // a request being typed in "Try it": drawn again once it is left
    }
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
    const open = el('button', 'jp-Button jp-mod-styled jp-mod-reject gpulab-try-open', 'Try it');
    open.title = 'Call this endpoint from here with inputs in its model\'s shapes';
    actions.append(open);
    row.append(actions);
    row.append(dep.model_kind === 'causal-lm' ? this.chatView(dep, open) : this.tryView(dep, open));
    return row;
  }

  /** "Try it" of a language model: a chat through the gateway (not streamed), the
   * conversation kept across the section's polls. */
  private chatView(dep: any, open: HTMLButtonElement): HTMLElement {
    const key = `${dep.user}/${dep.name}`;
    const state = this._chats.get(key) || { open: false, draft: '', turns: [], note: '' };
    this._chats.set(key, state);
    const view = el('div', 'gpulab-try gpulab-chat');
    view.hidden = !state.open;
    const log = el('div', 'gpulab-chat-log');
    const draw = () => {
      log.replaceChildren(
        ...state.turns.map(t => el('div', `gpulab-chat-turn gpulab-chat-${t.role}`, t.content))
      );
      note.textContent = state.note;
      note.hidden = !state.note;
    };
    const input = el('textarea', 'gpulab-try-body gpulab-chat-input');
    input.value = state.draft;
    input.rows = 2;
    input.placeholder = 'Say something to the model (Enter sends, Shift+Enter: new line)';
    input.oninput = () => (state.draft = input.value);
    const send = el('button', 'jp-Button jp-mod-styled jp-mod-accept gpulab-try-send', 'Send');
    const clear = el('button', 'jp-Button jp-mod-styled jp-mod-reject gpulab-chat-clear', 'Clear');
    const note = el('div', 'gpulab-facts gpulab-chat-note', state.note);
    // The model id the gateway takes: NAME for one's own, OWNER/NAME for another's.
    const model = `${dep.user}/${dep.name}`;
    const submit = async () => {
      const words = input.value.trim();
      if (!words) {
        return;
      }
      send.disabled = true;
      state.turns.push({ role: 'user', content: words });
      state.draft = input.value = '';
      state.note = 'generating…';
      draw();
      try {
        const r = await chatEndpoint(model, state.turns);
        const a = chatAnswerText(r.status, r.text, r.ms);
        if (a.ok) {
          state.turns.push({ role: 'assistant', content: a.text });
        } else {
          state.turns.pop(); // not answered: it can be sent again
          state.draft = input.value = words;
        }
        state.note = a.ok ? a.facts : a.text;
      } catch (err) {
        state.turns.pop();
        state.draft = input.value = words;
        state.note = (err as Error).message;
      }
      draw();
      send.disabled = false;
    };
    send.onclick = () => void submit();
    input.onkeydown = (e: KeyboardEvent) => {
      if (e.key === 'Enter' && !e.shiftKey && !send.disabled) {
        e.preventDefault();
        void submit();
      }
    };
    clear.onclick = () => {
      state.turns = [];
      state.note = '';
      draw();
    };
    open.onclick = () => {
      state.open = !state.open;
      view.hidden = !state.open;
    };
    const bar = el('div', 'gpulab-actions');
    bar.append(send, clear, el('span', 'gpulab-facts', `POST …/services/gpulab/v1/chat/completions · model ${model}`));
    draw();
    view.append(log, input, bar, note);
    return view;
  }

  /** The "Try it" view: the request (editable), Send, and the answer. It keeps what
   * was typed and answered across the section's polls. */
  private tryView(dep: any, open: HTMLButtonElement): HTMLElement {
    const key = `${dep.user}/${dep.name}`;
    const state = this._tries.get(key) || { open: false, body: tryBody(dep), answer: '' };
    this._tries.set(key, state);
    const view = el('div', 'gpulab-try');
    view.hidden = !state.open;
    const input = el('textarea', 'gpulab-try-body');
    input.value = state.body;
    input.spellcheck = false;
    input.rows = Math.min(8, input.value.split('\n').length + 1);
    input.oninput = () => (state.body = input.value);
    const send = el('button', 'jp-Button jp-mod-styled jp-mod-accept gpulab-try-send', 'Send');
    const answer = el('pre', 'gpulab-try-answer', state.answer);
    answer.hidden = !state.answer;
    send.onclick = async () => {
      send.disabled = true;
      try {
        JSON.parse(input.value);
      } catch (err) {
        state.answer = `not sent: the request is not JSON (${(err as Error).message})`;
        answer.textContent = state.answer;
        answer.hidden = false;
        send.disabled = false;
        return;
      }
      try {
        const r = await tryEndpoint(dep.user, dep.name, input.value);
        state.answer = tryAnswerText(r.status, r.text, r.ms);
      } catch (err) {
        state.answer = (err as Error).message;
      }
      answer.textContent = state.answer;
      answer.hidden = false;
      send.disabled = false;
    };
    open.onclick = () => {
      state.open = !state.open;
      view.hidden = !state.open;
    };
    const bar = el('div', 'gpulab-actions');
    bar.append(send, el('span', 'gpulab-facts', `POST …/v2/models/${dep.name}/infer`));
    view.append(input, bar, answer);
    return view;
  }

  private _tries = new Map<string, { open: boolean; body: string; answer: string }>();
  private _chats = new Map<
    string,
    { open: boolean; draft: string; turns: { role: string; content: string }[]; note: string }
  >();
}
