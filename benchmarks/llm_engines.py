"""Which engine generates fastest for many streaming clients on this machine.

    .venv/bin/python benchmarks/llm_engines.py [--clients 16] [--tokens 32] [--threads N]

A 33.5M-parameter Llama with random weights (throughput does not depend on what
the weights say) serves ``--clients`` requests that all arrive at once, each for
``--tokens`` tokens (no end-of-sequence stops them early), through:

* ``step-batch``: gpulab's continuous batcher (:class:`~gpulab.serving.llm_engine.StepBatchEngine`);
* ``transformers-cb``: transformers' paged ``ContinuousBatchingManager``;
* ``one-at-a-time``: one ``generate`` per request, in turn (what a server without
  batching does);
* ``one-batch``: one ``generate`` of all prompts, left-padded (the ceiling: no
  request joins late, none streams).

It prints tokens/s and time to first token p50/p99 for each, and the ratios the
issue asks for; also tokens per CPU-second of the process, which a machine shared
with other work does not distort as much as the wall clock. Engines take turns for ``--rounds`` rounds. No hub, no network: the engines are called in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from gpulab.serving.llm_engine import SamplingParams, StepBatchEngine, TransformersCBEngine


def llama_33m() -> LlamaForCausalLM:
    """33.4M parameters: 11 layers of width 384, a 16k vocabulary, untied embeddings."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=16000,
        hidden_size=384,
        intermediate_size=1152,
        num_hidden_layers=11,
        num_attention_heads=6,
        num_key_value_heads=6,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (12 + (i * 7) % 20,), generator=g).tolist() for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def _clients(engine, batch: list[list[int]], tokens: int) -> tuple[float, list[float], int]:
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    start = time.perf_counter()
    firsts: list[float] = []
    counted = 0

    async def one(prompt):
        nonlocal counted
        first = None
        async for _ in engine.generate(prompt, params):
            if first is None:
                first = time.perf_counter() - start
            counted += 1
        firsts.append(first)

    await asyncio.gather(*(one(p) for p in batch))
    return time.perf_counter() - start, firsts, counted


def run_engine(engine, batch, tokens) -> dict:
    engine.start()
    try:
        asyncio.run(_clients(engine, batch[:2], 4))  # warm up: lazy setup is not measured
        cpu = time.process_time()
        wall, firsts, counted = asyncio.run(_clients(engine, batch, tokens))
        cpu = time.process_time() - cpu
    finally:
        engine.stop()
    return {"tok_s": counted / wall, "ttft": firsts, "tokens": counted, "tok_cpu_s": counted / cpu}


def greedy(tokens: int) -> GenerationConfig:
    return GenerationConfig(
        do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0
    )


def one_at_a_time(model, batch, tokens) -> dict:
    start, firsts, counted = time.perf_counter(), [], 0
    cpu = time.process_time()
    with torch.inference_mode():
        for p in batch:
            # The first token of request i comes after every earlier request finished.
            t0 = time.perf_counter()
            model.generate(torch.tensor([p]), generation_config=greedy(1))
            firsts.append(time.perf_counter() - start)
            out = model.generate(torch.tensor([p]), generation_config=greedy(tokens))
            counted += out.shape[1] - len(p)
            del t0
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"tok_s": counted / wall, "ttft": firsts, "tokens": counted, "tok_cpu_s": counted / cpu}


def one_batch(model, batch, tokens) -> dict:
    width = max(map(len, batch))
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        model.generate(ids[:2], attention_mask=mask[:2], generation_config=greedy(2))
        start, cpu = time.perf_counter(), time.process_time()
        out = model.generate(ids, attention_mask=mask, generation_config=greedy(tokens))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    counted = (out.shape[1] - width) * len(batch)
    return {
        "tok_s": counted / wall,
        "ttft": [wall] * len(batch),
        "tokens": counted,
        "tok_cpu_s": counted / cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of every engine, interleaved; the best round of each is shown "
        "(a shared machine slows some rounds; the best is the engine's own speed)",
    )
    parser.add_argument("--only", default="", help="comma-separated engines to run (default: all)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = llama_33m()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    batch = prompts(args.clients, model.config.vocab_size)
    print(
        f"Llama {n_params:.1f}M parameters, {args.clients} clients x {args.tokens} tokens, "
        f"{torch.get_num_threads()} torch threads"
    )
    runs = {
        "step-batch": lambda: run_engine(
            StepBatchEngine(model, max_num_seqs=args.clients), batch, args.tokens
        ),
        "transformers-cb": lambda: run_engine(
            TransformersCBEngine(model, max_num_seqs=args.clients, max_model_len=128),
            batch,
            args.tokens,
        ),
        "one-at-a-time": lambda: one_at_a_time(model, batch, args.tokens),
        "one-batch": lambda: one_batch(model, batch, args.tokens),
    }
    only = [x for x in args.only.split(",") if x] or list(runs)
    results: dict[str, dict] = {}
    for _ in range(args.rounds):
        for name in only:
            r = runs[name]()
            if name not in results or r["tok_s"] > results[name]["tok_s"]:
                results[name] = r
    print(
        f"{'engine':<16} {'tokens/s':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} "
        f"{'tokens/CPU-s':>13} {'tokens':>7}"
    )
    for name, r in results.items():
        print(
            f"{name:<16} {r['tok_s']:9.1f} {statistics.median(r['ttft']) * 1e3:12.0f} "
            f"{percentile(r['ttft'], 0.99) * 1e3:12.0f} {r['tok_cpu_s']:13.1f} {r['tokens']:7d}"
        )
    best = results.get("step-batch")
    if best:
        for other in ("transformers-cb", "one-at-a-time", "one-batch"):
            if other in results:
                print(f"step-batch / {other}: {best['tok_s'] / results[other]['tok_s']:.2f}x")


if __name__ == "__main__":
    main()
