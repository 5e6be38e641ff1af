"""A language model served by gpulab, against its own engine and against others:
16 streaming chat clients, tokens/s and time to first token, one run, side by side.

    .venv/bin/python benchmarks/llm_serving.py [--clients 16] [--tokens 32] [--rounds 3]
        [--only gateway,engine,client-floor,transformers-serve,one-at-a-time,one-batch]
        [--connections kept|new]

A 33.4M-parameter Llama with random weights and a byte-level BPE tokenizer, both
made here (tests/tiny_lm.py; throughput does not depend on what the weights say),
saved once as a Hugging Face folder. Every target gets the same ``--clients`` chat
requests at once, each for ``--tokens`` tokens, greedy. Every target starts first
and stays up idle; then ``--rounds`` rounds run them in turn (never two under load
at once, the order reversed every other round), and the table shows each target's
medians: on a shared machine one slow spell moves one round, not the figure.

* ``gateway``: a real hub (``gpulab up``, one simulated GPU) started here; the model
  deployed as a user does (the ``causal-lm`` archive, one replica on the whole GPU,
  whose CPU share is then the whole host, as the in-process targets'); the unmodified
  ``openai`` SDK's async client streams through ``<hub>/services/gpulab/v1`` with the
  user's hub token (configurable-http-proxy, the service's gateway, the replica);
  with ``--connections kept`` (the default) one client serves the whole run and its
  connections stay open between rounds, as an application holds its ``AsyncOpenAI``;
  ``new`` makes a client each round, so every request opens a connection through
  the proxy (the case of a script that starts, calls and exits);
* ``engine``: the same engine the replica chose (``choose_engine``), on the same
  folder, called directly in this process with the chat template's token ids
  (no HTTP, no detokenizing): the anchor of "the gateway costs little";
* ``transformers-serve``: ``transformers serve --continuous-batching`` on the same
  folder, its own OpenAI server, the same openai client (needs fastapi and uvicorn:
  ``pip install -e .[bench]``);
* ``one-at-a-time``: one ``generate`` per request, in turn, in this process (what a
  server without batching does; request i's first token waits for all before it);
* ``client-floor``: the same openai client against a server that computes nothing
  (``_openai_floor.py``, its own process): it answers a burst at once when the last
  call of it is in, as a batching engine does after its prefill, so its time to first
  token is the client's own (building and sending 16 calls, reading their first
  events: 2 to 3 ms of CPU a call here), which a call through the gateway pays on
  top of the engine's; the table says how much of the gateway's added time it is;
* ``one-batch``: one ``generate`` of all prompts at once, left-padded: the ceiling
  (nothing streams, nobody joins late);
* ``vllm-serve``: ``vllm serve`` (its OpenAI server) alone on the same folder, with
  the memory share of the gateway's slice (GPU machines where vLLM is installed;
  ``make gpu-check`` runs ``--only gateway,vllm-serve --real-gpus``).

``--real-gpus``: the gateway's hub uses the machine's GPUs (NVML) instead of a
simulated one, and deploys on half a GPU, the slice ``vllm-serve`` gets too.

Prints tokens/s (completion tokens over the wall time from the first request to the
last token) and TTFT p50/p99 per target, then the issue's goals, each the median of
the rounds' ratios or differences (a round's targets ran back to back): gateway >= 0.9x
its engine and <= 15 ms added to TTFT p50; >= 4x one-at-a-time; ahead of
transformers serve; the share of the one-batch ceiling (aim 0.8x).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hub import RunningHub, percentile  # noqa: E402

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
from tiny_lm import BENCH_33M, tiny_llama  # noqa: E402

# Below the ephemeral range: a port the kernel handed out is the next client's.
from gpulab.hub_ext.ports import free_port  # noqa: E402

TOPICS = ["GPUs", "notebooks", "tokens", "schedulers", "caches", "foxes", "dogs", "slices"]


def messages(n: int) -> list[list[dict]]:
    """``n`` different chat requests of a few dozen tokens each."""
    return [
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {
                "role": "user",
                "content": f"Tell me story {i} about {TOPICS[i % len(TOPICS)]} "
                + "and shared compute " * (1 + i % 3),
            },
        ]
        for i in range(n)
    ]


def summary(wall: float, firsts: list[float], tokens: int) -> dict:
    return {"tok_s": tokens / wall, "ttft": firsts, "tokens": tokens, "wall": wall}


# --- OpenAI-compatible servers (the gateway, transformers serve) -----------------------


def _openai_client(base_url: str, api_key: str, connections: int):
    import httpx
    from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=600,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=connections + 4)),
    )


async def _stream_clients(client, model: str, chats, tokens: int) -> dict:
    start = time.perf_counter()
    firsts: list[float] = []
    counted = 0

    async def one(chat):
        nonlocal counted
        first = None
        pieces = 0
        stream = await client.chat.completions.create(
            model=model,
            messages=chat,
            max_tokens=tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        used = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces += 1
                if first is None:
                    first = time.perf_counter() - start
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        firsts.append(first if first is not None else time.perf_counter() - start)
        counted += used if used is not None else pieces

    await asyncio.gather(*(one(c) for c in chats))
    return summary(time.perf_counter() - start, firsts, counted)


#: How the openai clients connect (--connections): ``kept``, one client for the whole
#: run whose connections stay open between rounds, as an application holds its
#: ``AsyncOpenAI``; ``new``, a new client each round (every request a new connection
#: through the proxy too).
CONNECTIONS = ("kept", "new")


@contextlib.contextmanager
def openai_rounds(base_url: str, api_key: str, model: str, clients: int, connections: str):
    """Rounds against an OpenAI server: yields ``(chats, tokens) -> summary``, warmed
    up (with ``kept``, ``clients`` calls at once, so that as many connections are open)."""
    with asyncio.Runner() as runner:
        kept = None
        if connections == "kept":
            kept = runner.run(_make_client(base_url, api_key, clients))

        def one_round(chats, tokens: int) -> dict:
            if kept is not None:
                return runner.run(_stream_clients(kept, model, chats, tokens))
            return runner.run(_with_new_client(base_url, api_key, model, chats, tokens))

        try:
            one_round(messages(clients if kept is not None else 2), 4)  # lazy setup
            yield one_round
        finally:
            if kept is not None:
                runner.run(kept.close())


async def _make_client(base_url: str, api_key: str, connections: int):
    return _openai_client(base_url, api_key, connections)  # made on the runner's loop


async def _with_new_client(base_url: str, api_key: str, model: str, chats, tokens: int):
    client = _openai_client(base_url, api_key, len(chats))
    try:
        return await _stream_clients(client, model, chats, tokens)
    finally:
        await client.close()


#: The slice the gateway deploys on with --real-gpus, and vllm-serve's memory share.
REAL_GPU_MILLI = 500


@contextlib.contextmanager
def gateway(folder: str, work: str, clients: int, connections: str, real_gpus: bool = False):
    """Deploy the archive ``folder`` on a fresh hub as a user; yields a round through
    the gateway and the engine the replica says serves it."""
    from gpulab.client import Client

    # One simulated GPU, deployed whole: its share of the host is every core, as the
    # in-process targets have (a 1/2 slice of two GPUs on 2 cores holds 0.5 core).
    # With real GPUs: the machine's, half of one (the engine's memory share).
    hub = RunningHub(os.path.join(work, "hub"), simulate="" if real_gpus else "1xA100-80GB")
    try:
        token = hub.create_user("bench")
        client = Client(hub.api, token=token)
        spec = {
            "name": "chat",
            "min_replicas": 1,
            "max_replicas": 1,
            "gpu_milli": REAL_GPU_MILLI if real_gpus else 1000,
            "max_batch_size": clients,
        }
        dep = client.create_deployment(folder, spec)
        deadline, running_since = time.monotonic() + 600, None
        while True:
            if dep["state"] == "failed" or time.monotonic() > deadline:
                raise RuntimeError(f"the deployment did not start: {dep.get('message')}")
            if dep["state"] == "running":
                # The engine's name is asked of the replica in the background: a nicety.
                running_since = running_since or time.monotonic()
                if dep.get("engine") or time.monotonic() - running_since > 10:
                    break
            time.sleep(0.5)
            dep = client.get_deployment("chat")
        base = f"{hub.url}/services/gpulab/v1"
        with openai_rounds(base, token, "chat", clients, connections) as one_round:
            yield one_round, dep.get("engine")
    except Exception:
        print(f"the hub's log ends:\n{hub.log_tail(6000)}", file=sys.stderr)
        raise
    finally:
        hub.stop()


def transformers_serve(folder: str, work: str, clients: int, connections: str):
    exe = shutil.which("transformers", path=os.path.dirname(sys.executable))
    if exe is None:
        raise RuntimeError("the transformers command is not installed beside this python")
    port = free_port()
    argv = (
        [exe, "serve", "--continuous-batching", "--host", "127.0.0.1", "--port", str(port)]
        # Its default sizes the paged cache from free memory; here (24 GiB shared)
        # the OOM killer ended it. 256 blocks of 32 tokens hold 16 x 512 tokens.
        + ["--cb-num-blocks", "256", "--cb-block-size", "32"]
        + ["--device", "cpu", "--log-level", "warning", folder]
    )
    return openai_server(argv, port, "transformers serve", work, folder, clients, connections)


def client_floor(work: str, clients: int, connections: str):
    """The openai client against a server that computes nothing (_openai_floor.py)."""
    port = free_port()
    floor = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_openai_floor.py")
    argv = [sys.executable, floor, str(port), str(clients)]
    return openai_server(argv, port, "client floor", work, "floor", clients, connections)


def vllm_serve(folder: str, work: str, clients: int, connections: str):
    """``vllm serve`` alone on ``folder``, with the gateway's slice's memory share."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("vLLM is not installed beside this python (pip install vllm)")
    port = free_port()
    argv = (
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder]
        + ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(clients)]
        + ["--gpu-memory-utilization", f"{REAL_GPU_MILLI / 1000:g}"]
    )
    return openai_server(argv, port, "vllm serve", work, folder, clients, connections)


@contextlib.contextmanager
def openai_server(
    argv, port: int, what: str, work: str, model: str, clients: int, connections: str
):
    """Start another project's OpenAI server (``argv``, on ``port``); yields a round
    against it once it answers /health; stops it."""
    with open(os.path.join(work, what.replace(" ", "-") + ".log"), "w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_health(proc, log, f"http://127.0.0.1:{port}/health", what)
            base = f"http://127.0.0.1:{port}/v1"
            with openai_rounds(base, "none", model, clients, connections) as one_round:
                yield one_round, None
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_health(proc, log, url: str, what: str) -> None:
    import httpx

    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{what} exited:\n{log.read()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer /health in 300 s")
        time.sleep(0.5)


# --- in-process ------------------------------------------------------------------------


def prompt_ids(tokenizer, chats) -> list[list[int]]:
    out = []
    for chat in chats:
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


@contextlib.contextmanager
def engine_direct(folder: str, clients: int):
    """The replica's engine (the same choice) called directly in this process."""
    from gpulab.serving.llm_engine import SamplingParams, build_engine, choose_engine
    from gpulab.serving.llm_export import load_causal_lm

    model, tokenizer, card = load_causal_lm(folder)
    kind, why = choose_engine("auto")
    engine = build_engine(
        kind,
        model,
        max_num_seqs=clients,
        max_queue=clients,
        max_model_len=card["max_model_len"],
    )

    async def clients_of(prompts, n):
        params = SamplingParams(max_tokens=n, temperature=0.0)
        start = time.perf_counter()
        firsts: list[float] = []
        counted = 0

        async def one(p):
            nonlocal counted
            first = None
            async for _ in engine.generate(p, params):
                if first is None:
                    first = time.perf_counter() - start
                counted += 1
            firsts.append(first)

        await asyncio.gather(*(one(p) for p in prompts))
        return summary(time.perf_counter() - start, firsts, counted)

    def one_round(chats, tokens: int) -> dict:
        return asyncio.run(clients_of(prompt_ids(tokenizer, chats), tokens))

    engine.start()
    try:
        one_round(messages(2), 4)  # warm up
        yield one_round, why
    finally:
        engine.stop()


def _greedy(tokenizer, tokens: int):
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


@contextlib.contextmanager
def one_at_a_time(folder: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    class FirstToken(BaseStreamer):
        """Notes when the first new token comes (the first put is the prompt)."""

        def __init__(self):
            self.puts, self.at = 0, None

        def put(self, value):
            self.puts += 1
            if self.puts == 2 and self.at is None:
                self.at = time.perf_counter()

        def end(self):
            pass

    def one_round(chats, tokens: int) -> dict:
        prompts = prompt_ids(tokenizer, chats)
        with torch.inference_mode():
            start, firsts, counted = time.perf_counter(), [], 0
            for p in prompts:
                streamer = FirstToken()
                out = model.generate(
                    torch.tensor([p]),
                    generation_config=_greedy(tokenizer, tokens),
                    streamer=streamer,
                )
                firsts.append(streamer.at - start)
                counted += out.shape[1] - len(p)
        return summary(time.perf_counter() - start, firsts, counted)

    one_round(messages(1), 2)  # warm up
    yield one_round, None


@contextlib.contextmanager
def one_batch(folder: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def one_round(chats, tokens: int) -> dict:
        prompts = prompt_ids(tokenizer, chats)
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(
                ids, attention_mask=mask, generation_config=_greedy(tokenizer, tokens)
            )
            wall = time.perf_counter() - start
        return summary(wall, [wall] * len(prompts), (out.shape[1] - width) * len(prompts))

    one_round(messages(2), 2)  # warm up
    yield one_round, None


# --- the table ---------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}"


def p50(r: dict) -> float:
    return percentile(r["ttft"], 50)


def median_of(rounds: list[dict], figure) -> float:
    return statistics.median(figure(r) for r in rounds)


def paired(results: dict, a: str, b: str, figure) -> float:
    """The median over rounds of ``figure(a's round, b's round)``: each round's
    targets ran back to back, so a slow spell of the machine weighs on both."""
    return statistics.median(figure(x, y) for x, y in zip(results[a], results[b], strict=False))


def report(results: dict, notes: dict) -> None:
    rounds = max((len(r) for r in results.values() if isinstance(r, list)), default=0)
    print(f"medians of {rounds} rounds")
    print(f"{'target':<20} {'tokens/s':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tokens':>7}")
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name:<20} {'-':>9} {'-':>12} {'-':>12} {'-':>7}  ({r})")
            continue
        print(
            f"{name:<20} {median_of(r, lambda x: x['tok_s']):9.1f} {ms(median_of(r, p50)):>12} "
            f"{ms(median_of(r, lambda x: percentile(x['ttft'], 99))):>12} {r[0]['tokens']:7d}"
        )
    for name, r in results.items():
        if isinstance(r, list):
            each = ", ".join(f"{x['tok_s']:.0f}/{ms(p50(x))}" for x in r)
            print(f"  {name} rounds (tokens/s / TTFT p50 ms): {each}")
    for name, note in notes.items():
        if note:
            print(f"  {name} engine: {note}")

    def ok(name):
        return isinstance(results.get(name), list)

    def ratio(a, b):
        return paired(results, a, b, lambda x, y: x["tok_s"] / y["tok_s"])

    print("goals (medians of the rounds' ratios and differences):")
    if ok("gateway") and ok("engine"):
        added = paired(results, "gateway", "engine", lambda x, y: p50(x) - p50(y))
        print(f"  gateway / engine tokens/s: {ratio('gateway', 'engine'):.2f}x (goal >= 0.9x)")
        print(f"  gateway TTFT p50 added: {added * 1e3:+.1f} ms (goal <= 15 ms)")
        if ok("client-floor"):
            floor = median_of(results["client-floor"], p50)
            print(
                f"    of which the openai client's own (its TTFT p50 against a server that "
                f"computes nothing): {floor * 1e3:.1f} ms; the rest, the gateway's path and "
                f"the replica's prefill against the in-process engine's (which shares its "
                f"process with the clients' tasks): {(added - floor) * 1e3:+.1f} ms"
            )
    best = "gateway" if ok("gateway") else "engine" if ok("engine") else None
    if best and ok("one-at-a-time"):
        print(
            f"  {best} / one-at-a-time tokens/s: {ratio(best, 'one-at-a-time'):.2f}x (goal >= 4x)"
        )
    if best and ok("transformers-serve"):
        print(
            f"  {best} / transformers serve --continuous-batching: "
            f"{ratio(best, 'transformers-serve'):.2f}x (goal > 1x)"
        )
    if ok("gateway") and ok("vllm-serve"):
        added = paired(results, "gateway", "vllm-serve", lambda x, y: p50(x) - p50(y))
        print(
            f"  gateway / vllm serve alone tokens/s: {ratio('gateway', 'vllm-serve'):.2f}x "
            "(goal >= 0.9x)"
        )
        print(f"  gateway TTFT p50 added to vllm serve's: {added * 1e3:+.1f} ms")
    if best and ok("one-batch"):
        print(f"  {best} / one-batch ceiling: {ratio(best, 'one-batch'):.2f}x (aim 0.8x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of every target, interleaved (the table shows their medians)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated targets (default: gateway,engine,client-floor,"
        "transformers-serve,one-at-a-time,one-batch)",
    )
    parser.add_argument(
        "--connections",
        choices=CONNECTIONS,
        default="kept",
        help="kept: one openai client per target for the run, its connections open "
        "between rounds (as an application holds one); new: a new client each round",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--real-gpus",
        action="store_true",
        help="the gateway's hub on this machine's GPUs (half of one), not a simulated one",
    )
    args = parser.parse_args()
    targets = [
        "gateway",
        "engine",
        "client-floor",
        "transformers-serve",
        "one-at-a-time",
        "one-batch",
    ]
    known = [*targets, "vllm-serve"]
    only = [t for t in args.only.split(",") if t] or targets
    for t in only:
        if t not in known:
            raise SystemExit(f"--only: no target {t!r}; one of {', '.join(known)}")
    chats = messages(args.clients)
    with tempfile.TemporaryDirectory(prefix="gpulab-llm-bench-") as work:
        os.chmod(work, 0o755)  # the user's account reads the archive through it
        from gpulab.serving.llm_export import save_causal_lm

        # The causal-lm archive %deploy uploads (model.json and hf/); hf/ is the plain
        # Hugging Face folder the others load.
        archive = os.path.join(work, "llama-33m")
        model, tokenizer = tiny_llama(**BENCH_33M)
        save_causal_lm(model, tokenizer, archive, max_num_seqs=args.clients)
        folder = os.path.join(archive, "hf")
        n_params = sum(p.numel() for p in model.parameters()) / 1e6
        del model
        print(
            f"Llama {n_params:.1f}M parameters, {args.clients} streaming clients x "
            f"{args.tokens} tokens, {os.cpu_count()} CPUs, {args.rounds} rounds, "
            f"{args.connections} connections"
        )
        setups = {
            "gateway": lambda: gateway(
                archive, work, args.clients, args.connections, real_gpus=args.real_gpus
            ),
            "engine": lambda: engine_direct(archive, args.clients),
            "transformers-serve": lambda: transformers_serve(
                folder, work, args.clients, args.connections
            ),
            "one-at-a-time": lambda: one_at_a_time(folder),
            "one-batch": lambda: one_batch(folder),
            "vllm-serve": lambda: vllm_serve(folder, work, args.clients, args.connections),
            "client-floor": lambda: client_floor(work, args.clients, args.connections),
        }
        results: dict = {}
        notes: dict = {}
        rounds: dict = {}
        with contextlib.ExitStack() as stack:
            # Every target starts first and stays up (idle, each waits for work); then
            # the rounds run them in turn, never two under load at once, the order
            # reversed every other round so that neither end of a round is favoured.
            for target in only:
                print(f"starting {target}...", flush=True)
                try:
                    rounds[target], notes[target] = stack.enter_context(setups[target]())
                    results[target] = []
                except Exception as e:  # noqa: BLE001 - one target's failure is a row
                    results[target] = f"not run: {type(e).__name__}: {_first_line(e)}"
            for n in range(args.rounds):
                order = list(rounds) if n % 2 == 0 else list(reversed(rounds))
                for target in order:
                    if not isinstance(results[target], list):
                        continue
                    try:
                        r = rounds[target](chats, args.tokens)
                    except Exception as e:  # noqa: BLE001
                        results[target] = f"failed: {type(e).__name__}: {_first_line(e)}"
                        continue
                    results[target].append(r)
                    print(
                        f"  round {n + 1} {target}: {r['tok_s']:.1f} tokens/s, TTFT p50 "
                        f"{ms(p50(r))} ms",
                        flush=True,
                    )
        report(results, notes)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": as_json(results), "notes": notes}, f, indent=1)


def as_json(results: dict) -> dict:
    """Per target its medians (``tok_s``, ``ttft_p50``, ``ttft_p99``: what
    ``gpu_check`` reads) and its rounds, or why it did not run."""
    out = {}
    for name, r in results.items():
        if not isinstance(r, list) or not r:
            out[name] = r if isinstance(r, str) else "no round ran"
            continue
        out[name] = {
            "tok_s": median_of(r, lambda x: x["tok_s"]),
            "ttft_p50": median_of(r, p50),
            "ttft_p99": median_of(r, lambda x: percentile(x["ttft"], 99)),
            "tokens": r[0]["tokens"],
            "rounds": r,
        }
    return out


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0][:120]


if __name__ == "__main__":
    main()
