// Calls to this server's gpulab routes (lab/handlers.py). The browser holds no
// token: jupyter_server's own login cookie and XSRF header authenticate it, and the
// server calls the gpulab service with its hub token.
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const UNREACHABLE =
  'gpulab service unreachable — is the hub running?';

/** How often, and how many times, a tab whose server stopped asks the hub why. */
const GONE_CHECK_MS = 3000;
const GONE_CHECKS = 40;
/** What the hub's proxy (no route: 424 from the hub, 502/503 from the proxy) answers
 * for a server that no longer runs. */
const SERVER_GONE = [424, 502, 503];

let gone = false;

/** True while this server seems stopped: the pollers (status bar, panel sections,
 * dashboard) skip their turns, so a stopped server is not asked every few seconds. */
export function serverGone(): boolean {
  return gone;
}

/**
 * This server stopped answering. Ask the hub (its own page, /hub/gpulab/held, with
 * the hub's login cookie) whether it was hibernated: then this tab goes to the hub's
 * home page, which says so and starts it again (waking its notebooks). The server
 * answering again resumes the pollers; after GONE_CHECKS asks without either, the
 * tab stops asking (JupyterLab's own dialog says the server is gone).
 */
function noteServerGone(): void {
  if (gone) {
    return;
  }
  gone = true;
  const hub = PageConfig.getOption('hubPrefix');
  const server = PageConfig.getOption('hubServerName') || '';
  let checks = 0;
  const check = async (): Promise<void> => {
    checks++;
    try {
      const settings = ServerConnection.makeSettings();
      const r = await ServerConnection.makeRequest(
        URLExt.join(settings.baseUrl, 'gpulab', 'slice'),
        {},
        settings
      );
      if (r.ok && (r.headers.get('Content-Type') || '').includes('json')) {
        gone = false; // it answers again: back to work
        return;
      }
    } catch {
      // still gone
    }
    if (hub) {
      try {
        const r = await fetch(URLExt.join(hub, 'gpulab/held'), {
          headers: { Accept: 'application/json' },
          credentials: 'same-origin'
        });
        const held = r.ok ? await r.json() : {};
        const ours = (held.hibernated || []).some((h: any) => h.server === server);
        if (ours) {
          window.location.assign(URLExt.join(hub, 'home'));
          return;
        }
      } catch {
        // the hub does not answer either: ask again
      }
    }
    if (checks < GONE_CHECKS) {
      window.setTimeout(() => void check(), GONE_CHECK_MS);
    }
  };
  void check();
}

async function send(
  path: string,
  init: RequestInit = {},
  asText = false
): Promise<any> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpulab', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (err) {
    // No answer from this server itself (it stopped, or the network went).
    noteServerGone();
    throw new Error('this Jupyter server does not answer — is it still running?');
  }
  const text = await response.text();
  if (!response.ok) {
    let data: any = null;
    try {
      data = JSON.parse(text);
    } catch {
      // not this server's extension answering (a page of the hub or its proxy)
    }
    // The extension answers {"error"} (a 502 when the service is down); the hub's 424
    // or the proxy's page means this server itself is gone.
    if (!(data && data.error) && SERVER_GONE.includes(response.status)) {
      noteServerGone();
      throw new Error('this Jupyter server has stopped');
    }
    // Never a page's HTML in the panel: the status in words.
    let message =
      (data && (data.error || data.message)) ||
      `this Jupyter server answered HTTP ${response.status}`;
    if (!data && response.status === 404) {
      message =
        'gpulab server extension not enabled here (jupyter server extension enable gpulab.lab)';
    }
    throw new Error(message);
  }
  if ((response.headers.get('Content-Type') || '').includes('text/html')) {
    // Sent on to the hub's pages: this server is gone.
    noteServerGone();
    throw new Error('this Jupyter server has stopped');
  }
  if (asText) {
    return text;
  }
  return text ? JSON.parse(text) : null;
}

/** GET gpulab/api/v1/<path>: the service's JSON. */
export function apiGet(path: string): Promise<any> {
  return send(URLExt.join('api/v1', path));
}

/** GET gpulab/api/v1/<path> as text (job logs). */
export function apiText(path: string): Promise<string> {
  return send(URLExt.join('api/v1', path), {}, true);
}

export function apiDelete(path: string): Promise<any> {
  return send(URLExt.join('api/v1', path), { method: 'DELETE' });
}

/** POST gpulab/api/v1/<path> with a JSON body. */
export function apiPost(path: string, body: any): Promise<any> {
  return send(URLExt.join('api/v1', path), {
    method: 'POST',
    body: JSON.stringify(body)
  });
}

/** One call to an endpoint (the lab's "Try it"): its status and body, and how long
 * it took; a refusal is an answer too, not an error. */
export interface ITryAnswer {
  status: number;
  text: string;
  ms: number;
}

export async function tryEndpoint(
  user: string,
  name: string,
  body: string
): Promise<ITryAnswer> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(
    settings.baseUrl,
    'gpulab/try',
    encodeURIComponent(user),
    encodeURIComponent(name),
    'v2/models',
    encodeURIComponent(name),
    'infer'
  );
  const start = performance.now();
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'POST', body }, settings);
  } catch (err) {
    throw new Error('this Jupyter server does not answer — is it still running?');
  }
  const text = await response.text();
  return { status: response.status, text, ms: performance.now() - start };
}

/** One chat turn with a language model through the gateway (the lab's "Try it" of a
 * causal LM): POST gpulab/chat, which this server passes on to
 * <hub>/services/gpulab/v1/chat/completions with its token. */
export async function chatEndpoint(
  model: string,
  messages: { role: string; content: string }[],
  maxTokens = 128
): Promise<ITryAnswer> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gpulab/chat');
  const body = JSON.stringify({ model, messages, max_tokens: maxTokens });
  const start = performance.now();
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'POST', body }, settings);
  } catch (err) {
    throw new Error('this Jupyter server does not answer — is it still running?');
  }
  const text = await response.text();
  return { status: response.status, text, ms: performance.now() - start };
}

/** This server's slice (GET gpulab/slice). */
export interface ISlice {
  managed: boolean;
  milli: number;
  gpus: string[];
  model: string | null;
  memory_limit_mib: number | null;
  memory_used_mib: number | null;
  memory_note: string;
  simulated: boolean;
  enforcement: string | null;
  short: string | null;
  limits: string | null;
  text: string;
  service_problem: string | null;
  server_name: string;
}

export function getSlice(): Promise<ISlice> {
  return send('slice');
}

/** The slice's facts, a line each: its GPUs, what holds it, memory, limits. */
export function sliceFacts(slice: ISlice): string[] {
  return [
    slice.milli
      ? `${gpuLabel(slice.milli)} on ${slice.gpus.join(', ')}`
      : 'no GPU in this server’s slice',
    slice.enforcement ? `held by: ${slice.enforcement}` : '',
    slice.memory_note ? `memory in use: ${slice.memory_note}` : '',
    slice.limits ? `limits: ${slice.limits}` : ''
  ].filter(Boolean);
}

/**
 * A slice in the one unit people read: "1/4 GPU", "2 GPUs", "no GPU" (the same
 * words as gpulab.client.units.gpu_label; milli-GPU stays in API fields).
 */
export function plural(n: number, word: string): string {
  return n === 1 ? `${n} ${word}` : `${n} ${word}s`;
}

export function gpuLabel(milli: number): string {
  if (!milli) {
    return 'no GPU';
  }
  if (milli % 1000 === 0) {
    const n = milli / 1000;
    return n === 1 ? '1 GPU' : `${n} GPUs`;
  }
  for (const d of [2, 3, 4, 5, 8, 10, 20]) {
    if ((milli * d) % 1000 === 0) {
      return `${(milli * d) / 1000}/${d} GPU`;
    }
  }
  return `${Number((milli / 1000).toPrecision(3))} GPU`;
}
