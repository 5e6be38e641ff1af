"""A language model served by gpulab, against its own engine and against others:
16 streaming chat clients, tokens/s and time to first token, one run, side by side.

    .venv/bin/python benchmarks/llm_serving.py [--clients 16] [--tokens 32]
        [--only gateway,engine,transformers-serve,one-at-a-time,one-batch]

A 33.4M-parameter Llama with random weights and a byte-level BPE tokenizer, both
made here (tests/tiny_lm.py; throughput does not depend on what the weights say),
saved once as a Hugging Face folder. Every target gets the same ``--clients`` chat
requests at once, each for ``--tokens`` tokens, greedy; the targets take turns
(never two under load at once):

* ``gateway``: a real hub (``gpulab up``, one simulated GPU) started here; the model
  deployed as a user does (the ``causal-lm`` archive, one replica on the whole GPU,
  whose CPU share is then the whole host, as the in-process targets'); the unmodified
  ``openai`` SDK's async client streams through ``<hub>/services/gpulab/v1`` with the
  user's hub token (configurable-http-proxy, the service's gateway, the replica);
* ``engine``: the same engine the replica chose (``choose_engine``), on the same
  folder, called directly in this process with the chat template's token ids
  (no HTTP, no detokenizing): the anchor of "the gateway costs little";
* ``transformers-serve``: ``transformers serve --continuous-batching`` on the same
  folder, its own OpenAI server, the same openai client (needs fastapi and uvicorn:
  ``pip install -e .[bench]``);
* ``one-at-a-time``: one ``generate`` per request, in turn, in this process (what a
  server without batching does; request i's first token waits for all before it);
* ``one-batch``: one ``generate`` of all prompts at once, left-padded: the ceiling
  (nothing streams, nobody joins late);
* ``vllm-serve``: ``vllm serve`` (its OpenAI server) alone on the same folder, with
  the memory share of the gateway's slice (GPU machines where vLLM is installed;
  ``make gpu-check`` runs ``--only gateway,vllm-serve --real-gpus``).

``--real-gpus``: the gateway's hub uses the machine's GPUs (NVML) instead of a
simulated one, and deploys on half a GPU, the slice ``vllm-serve`` gets too.

Prints tokens/s (completion tokens over the wall time from the first request to the
last token) and TTFT p50/p99 per target, then the issue's goals: gateway >= 0.9x
its engine and <= 15 ms added to TTFT p50; >= 4x one-at-a-time; ahead of
transformers serve; the share of the one-batch ceiling (aim 0.8x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
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


async def _stream_clients(base_url: str, api_key: str, model: str, chats, tokens: int) -> dict:
    import httpx
    from openai import AsyncOpenAI

    client = AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        max_retries=0,
        timeout=600,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=len(chats) + 4)),
    )
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

    try:
        await asyncio.gather(*(one(c) for c in chats))
        wall = time.perf_counter() - start
    finally:
        await client.close()
    return summary(wall, firsts, counted)


def openai_load(base_url: str, api_key: str, model: str, chats, tokens: int) -> dict:
    asyncio.run(_stream_clients(base_url, api_key, model, chats[:2], 4))  # warm up
    return asyncio.run(_stream_clients(base_url, api_key, model, chats, tokens))


#: The slice the gateway deploys on with --real-gpus, and vllm-serve's memory share.
REAL_GPU_MILLI = 500


def gateway(
    folder: str, work: str, chats, tokens: int, real_gpus: bool = False
) -> tuple[dict, str]:
    """Deploy the archive ``folder`` on a fresh hub as a user; drive it through the gateway."""
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
            "max_batch_size": len(chats),
        }
        dep = client.create_deployment(folder, spec)
        deadline = time.monotonic() + 600
        while dep["state"] != "running":
            if dep["state"] == "failed" or time.monotonic() > deadline:
                raise RuntimeError(f"the deployment did not start: {dep.get('message')}")
            time.sleep(0.5)
            dep = client.get_deployment("chat")
        engine = dep.get("engine") or "?"
        result = openai_load(f"{hub.url}/services/gpulab/v1", token, "chat", chats, tokens)
        return result, engine
    except Exception:
        print(f"the hub's log ends:\n{hub.log_tail(6000)}", file=sys.stderr)
        raise
    finally:
        hub.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transformers_serve(folder: str, work: str, chats, tokens: int) -> dict:
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
    return openai_server(argv, port, "transformers serve", work, folder, chats, tokens)


def vllm_serve(folder: str, work: str, chats, tokens: int) -> dict:
    """``vllm serve`` alone on ``folder``, with the gateway's slice's memory share."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("vLLM is not installed beside this python (pip install vllm)")
    port = free_port()
    argv = (
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder]
        + ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(len(chats))]
        + ["--gpu-memory-utilization", f"{REAL_GPU_MILLI / 1000:g}"]
    )
    return openai_server(argv, port, "vllm serve", work, folder, chats, tokens)


def openai_server(argv, port: int, what: str, work: str, model: str, chats, tokens) -> dict:
    """Start another project's OpenAI server (``argv``, on ``port``), drive it with the
    clients once it answers /health, stop it."""
    with open(os.path.join(work, what.replace(" ", "-") + ".log"), "w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_health(proc, log, f"http://127.0.0.1:{port}/health", what)
            return openai_load(f"http://127.0.0.1:{port}/v1", "none", model, chats, tokens)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_health(proc, log, url: str, what: str) -> None:
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


def engine_direct(folder: str, chats, tokens: int) -> tuple[dict, str]:
    """The replica's engine (the same choice) called directly in this process."""
    from gpulab.serving.llm_engine import SamplingParams, build_engine, choose_engine
    from gpulab.serving.llm_export import load_causal_lm

    model, tokenizer, card = load_causal_lm(folder)
    kind, why = choose_engine("auto")
    engine = build_engine(
        kind,
        model,
        max_num_seqs=len(chats),
        max_queue=len(chats),
        max_model_len=card["max_model_len"],
    )
    prompts = prompt_ids(tokenizer, chats)

    async def clients(batch, n):
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

        await asyncio.gather(*(one(p) for p in batch))
        return summary(time.perf_counter() - start, firsts, counted)

    engine.start()
    try:
        asyncio.run(clients(prompts[:2], 4))  # warm up
        return asyncio.run(clients(prompts, tokens)), why
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


def one_at_a_time(folder: str, chats, tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = prompt_ids(tokenizer, chats)

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

    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), generation_config=_greedy(tokenizer, 2))
        start, firsts, counted = time.perf_counter(), [], 0
        for p in prompts:
            streamer = FirstToken()
            out = model.generate(
                torch.tensor([p]), generation_config=_greedy(tokenizer, tokens), streamer=streamer
            )
            firsts.append(streamer.at - start)
            counted += out.shape[1] - len(p)
    return summary(time.perf_counter() - start, firsts, counted)


def one_batch(folder: str, chats, tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = prompt_ids(tokenizer, chats)
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        model.generate(ids[:2], attention_mask=mask[:2], generation_config=_greedy(tokenizer, 2))
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=_greedy(tokenizer, tokens))
        wall = time.perf_counter() - start
    return summary(wall, [wall] * len(prompts), (out.shape[1] - width) * len(prompts))


# --- the table ---------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}"


def report(results: dict, notes: dict) -> None:
    print(f"{'target':<20} {'tokens/s':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tokens':>7}")
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name:<20} {'-':>9} {'-':>12} {'-':>12} {'-':>7}  ({r})")
            continue
        print(
            f"{name:<20} {r['tok_s']:9.1f} {ms(percentile(r['ttft'], 50)):>12} "
            f"{ms(percentile(r['ttft'], 99)):>12} {r['tokens']:7d}"
        )
    for name, note in notes.items():
        print(f"  {name}: {note}")

    def ok(name):
        return isinstance(results.get(name), dict)

    print("goals:")
    if ok("gateway") and ok("engine"):
        g, e = results["gateway"], results["engine"]
        ratio = g["tok_s"] / e["tok_s"]
        added = percentile(g["ttft"], 50) - percentile(e["ttft"], 50)
        print(f"  gateway / engine tokens/s: {ratio:.2f}x (goal >= 0.9x)")
        print(f"  gateway TTFT p50 added: {added * 1e3:+.1f} ms (goal <= 15 ms)")
    best = "gateway" if ok("gateway") else "engine" if ok("engine") else None
    if best and ok("one-at-a-time"):
        ratio = results[best]["tok_s"] / results["one-at-a-time"]["tok_s"]
        print(f"  {best} / one-at-a-time tokens/s: {ratio:.2f}x (goal >= 4x)")
    if best and ok("transformers-serve"):
        ratio = results[best]["tok_s"] / results["transformers-serve"]["tok_s"]
        print(f"  {best} / transformers serve --continuous-batching: {ratio:.2f}x (goal > 1x)")
    if ok("gateway") and ok("vllm-serve"):
        g, v = results["gateway"], results["vllm-serve"]
        ratio = g["tok_s"] / v["tok_s"]
        added = percentile(g["ttft"], 50) - percentile(v["ttft"], 50)
        print(f"  gateway / vllm serve alone tokens/s: {ratio:.2f}x (goal >= 0.9x)")
        print(f"  gateway TTFT p50 added to vllm serve's: {added * 1e3:+.1f} ms")
    if best and ok("one-batch"):
        ratio = results[best]["tok_s"] / results["one-batch"]["tok_s"]
        print(f"  {best} / one-batch ceiling: {ratio:.2f}x (aim 0.8x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated targets (default: gateway,engine,transformers-serve,"
        "one-at-a-time,one-batch)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--real-gpus",
        action="store_true",
        help="the gateway's hub on this machine's GPUs (half of one), not a simulated one",
    )
    args = parser.parse_args()
    targets = ["gateway", "engine", "transformers-serve", "one-at-a-time", "one-batch"]
    known = [*targets, "vllm-serve"]
    only = [t for t in args.only.split(",") if t] or targets
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
            f"{args.tokens} tokens, {os.cpu_count()} CPUs"
        )
        results: dict = {}
        notes: dict = {}
        for target in only:
            print(f"running {target}...", flush=True)
            try:
                if target == "gateway":
                    results[target], notes["gateway engine"] = gateway(
                        archive, work, chats, args.tokens, real_gpus=args.real_gpus
                    )
                elif target == "engine":
                    results[target], notes["engine"] = engine_direct(archive, chats, args.tokens)
                elif target == "transformers-serve":
                    results[target] = transformers_serve(folder, work, chats, args.tokens)
                elif target == "one-at-a-time":
                    results[target] = one_at_a_time(folder, chats, args.tokens)
                elif target == "one-batch":
                    results[target] = one_batch(folder, chats, args.tokens)
                elif target == "vllm-serve":
                    results[target] = vllm_serve(folder, work, chats, args.tokens)
                else:
                    raise SystemExit(f"--only: no target {target!r}; one of {', '.join(known)}")
            except Exception as e:  # noqa: BLE001 - one target's failure is a row, not the end
                results[target] = f"not run: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            r = results[target]
            if isinstance(r, dict):
                print(
                    f"  {target}: {r['tok_s']:.1f} tokens/s, TTFT p50 "
                    f"{ms(percentile(r['ttft'], 50))} ms",
                    flush=True,
                )
        report(results, notes)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": results, "notes": notes}, f, indent=1)


if __name__ == "__main__":
    main()
