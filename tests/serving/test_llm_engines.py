"""The engines in-process: what they generate greedily is what ``model.generate``
says for each prompt alone, whoever shares the batch and whenever they join; a
cancelled sequence leaves the batch; a full engine refuses."""

import asyncio
import time

import pytest
import torch
from tiny_lm import tiny_llama

from gpulab.serving.llm_engine import (
    QueueFull,
    SamplingParams,
    StepBatchEngine,
    TransformersCBEngine,
    choose_engine,
)

PROMPTS = ["The quick brown fox", "Hello!", "A GPU slice serves a language model to every user"]


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(max_position_embeddings=512)


def alone(model, ids, n):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
    return out[0, len(ids) :].tolist()


async def collect(engine, ids, n, delay=0.0):
    await asyncio.sleep(delay)  # joins a batch that is already running
    return [t async for t in engine.generate(ids, SamplingParams(max_tokens=n, temperature=0))]


def run(engine, coro):
    engine.start()
    try:
        return asyncio.run(coro)
    finally:
        engine.stop()


@pytest.mark.parametrize("engine_class", [StepBatchEngine, TransformersCBEngine])
def test_batched_greedy_text_is_each_prompt_alone(llama, engine_class):
    model, tokenizer = llama
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    lengths = [20, 7, 13]
    expected = [alone(model, ids, n) for ids, n in zip(prompts, lengths, strict=True)]

    async def main():
        return await asyncio.gather(
            *(
                collect(engine, ids, n, delay=0.01 * i)
                for i, (ids, n) in enumerate(zip(prompts, lengths, strict=True))
            )
        )

    engine = engine_class(model, max_num_seqs=2)  # the third waits for a slot
    assert run(engine, main()) == expected


def test_a_closed_stream_leaves_the_batch(llama):
    model, tokenizer = llama
    engine = StepBatchEngine(model, max_num_seqs=1, max_queue=1)
    ids = tokenizer(PROMPTS[0]).input_ids

    async def main():
        tokens = engine.generate(ids, SamplingParams(max_tokens=400, temperature=0))
        await anext(tokens)
        await tokens.aclose()  # the client went away
        # The next caller gets the slot and its whole answer.
        return await collect(engine, ids, 5)

    assert run(engine, main()) == alone(model, ids, 5)
    assert engine.tokens_made < 400


def test_a_request_arriving_during_a_prefill_is_prefilled_before_the_next_decode(llama):
    """Requests over HTTP arrive milliseconds apart: one that comes while another's
    prompt is being prefilled gets its own prefill next, not after the first one's
    next token (time to first token is one prefill's wait, not a decode's too)."""
    import threading

    model, tokenizer = llama
    first, late = (tokenizer(p).input_ids for p in PROMPTS[:2])
    engine = StepBatchEngine(model, max_num_seqs=4)
    gate, busy = threading.Event(), threading.Event()
    shapes = []

    def hold_the_first_forward(module, args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        busy.set()
        assert gate.wait(60), "the test never let the first prefill go on"

    async def main():
        a = asyncio.ensure_future(collect(engine, first, 3))
        await asyncio.to_thread(busy.wait, 60)  # the first prompt's prefill is running
        tokens = engine.generate(late, SamplingParams(max_tokens=3, temperature=0))
        b = asyncio.ensure_future(anext(tokens))
        await asyncio.sleep(0)  # b is submitted: it waits while the prefill runs
        assert engine.load == 2  # the one being prefilled counts
        gate.set()
        answer_b = [await b] + [t async for t in tokens]
        return [await a, answer_b]

    hook = model.register_forward_pre_hook(hold_the_first_forward, with_kwargs=True)
    try:
        answers = run(engine, main())
    finally:
        gate.set()
        hook.remove()
    assert shapes[:3] == [(1, len(first)), (1, len(late)), (2, 1)]
    assert answers == [alone(model, first, 3), alone(model, late, 3)]


def test_a_full_engine_refuses(llama):
    """Not started, the engine generates nothing: what is submitted stays, so the
    count is exact. One running slot and one waiting place: the third is refused."""
    model, tokenizer = llama
    engine = StepBatchEngine(model, max_num_seqs=1, max_queue=1)
    ids = tokenizer(PROMPTS[0]).input_ids

    async def main():
        held = [engine.generate(ids, SamplingParams(max_tokens=4)) for _ in range(2)]
        pending = [asyncio.ensure_future(anext(g)) for g in held]
        await asyncio.sleep(0)  # both run up to their wait for a first token
        assert engine.load == 2
        with pytest.raises(QueueFull, match="1 sequences are generating and 1 wait"):
            await anext(engine.generate(ids, SamplingParams(max_tokens=1)))
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for g in held:
            await g.aclose()
        assert engine.load == 0  # a closed request leaves the waiting line

    asyncio.run(main())


def test_the_cpu_engine_says_why():
    kind, reason = choose_engine("auto")
    assert kind == "step-batch"
    assert reason.startswith("transformers continuous batching (CPU;")
    with pytest.raises(ValueError, match="--engine vllm cannot run here"):
        choose_engine("vllm")
    with pytest.raises(ValueError, match="is not one of"):
        choose_engine("fastest")


def lora(model, names):
    """``model`` with LoRA adapters ``names``, each with random (not zero) weights."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    config = dict(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft = get_peft_model(model, LoraConfig(**config), adapter_name=names[0])
    for name in names[1:]:
        peft.add_adapter(name, LoraConfig(**config))
    return peft.eval()


def test_rows_of_one_batch_each_use_their_lora_adapter():
    base, tokenizer = tiny_llama(max_position_embeddings=512)
    peft = lora(base, ["sql", "poem"])
    ids = tokenizer(PROMPTS[0]).input_ids
    with peft.disable_adapter():
        expected = {None: alone(peft, ids, 10)}
    for name in ("sql", "poem"):
        peft.set_adapter(name)
        expected[name] = alone(peft, ids, 10)
    assert len({tuple(v) for v in expected.values()}) == 3  # the adapters change the text

    async def main():
        params = [SamplingParams(max_tokens=10, temperature=0, adapter=a) for a in expected]
        return await asyncio.gather(
            *(collect_with(engine, ids, p, delay=0.01 * i) for i, p in enumerate(params))
        )

    engine = StepBatchEngine(peft, max_num_seqs=3)
    assert run(engine, main()) == list(expected.values())


async def collect_with(engine, ids, params, delay=0.0):
    await asyncio.sleep(delay)
    return [t async for t in engine.generate(ids, params)]


def test_the_admission_wait_grows_with_the_burst_and_has_a_cap():
    from gpulab.serving.llm_engine import admission_deadline

    # A lone request waits a quarter of its own pass after it came.
    assert admission_deadline(10.0, 10.0, 1, 0.02, 0.1) == pytest.approx(10.005)
    # Eight waiting would take eight prompts' pass: a pause of a quarter of that
    # (40 ms) after the latest is sat out, 160 ms from the first at most...
    assert admission_deadline(10.0, 10.03, 8, 0.02, 0.2) == pytest.approx(10.07)
    assert admission_deadline(10.0, 10.15, 8, 0.02, 0.2) == pytest.approx(10.16)
    # ... and never more than the setting; 0: no wait at all.
    assert admission_deadline(10.0, 10.09, 8, 0.02, 0.1) == pytest.approx(10.1)
    assert admission_deadline(10.0, 10.0, 8, 0.02, 0.0) == 10.0


def test_an_idle_engine_prefills_a_burst_in_one_pass(llama):
    """Requests that arrive one by one, each a moment after the other (as a burst
    comes over HTTP), are gathered into one prefill: the engine's own counters say
    one pass for all three. The wait ends because the batch is full, not on a timer
    (one prompt's prefill is set long, so the window outlasts any slow machine)."""
    model, tokenizer = llama
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    engine = StepBatchEngine(model, max_num_seqs=3, max_admission_window_s=600)
    engine.prompt_prefill_s = 60.0

    async def main():
        tasks = []
        for ids in prompts:
            tasks.append(asyncio.ensure_future(collect(engine, ids, 4)))
            await asyncio.sleep(0.001)  # the next arrives later
        return await asyncio.gather(*tasks)

    answers = run(engine, main())
    assert (engine.prefills, engine.prefilled) == (1, 3)
    assert answers == [alone(model, ids, 4) for ids in prompts]


def test_first_tokens_leave_before_the_next_decode(llama, monkeypatch):
    """After a prefill the engine lets the event loop take the first tokens out
    before it decodes again (a decode would hold the cores meanwhile)."""
    from gpulab.serving import llm_engine

    monkeypatch.setattr(llm_engine, "FIRST_TOKENS_WAIT_S", 600.0)  # no timer decides
    model, tokenizer = llama
    ids = tokenizer(PROMPTS[0]).input_ids
    engine = StepBatchEngine(model, max_num_seqs=2)
    seen_first = []
    decodes_after_first = []
    loops = []

    def note_decode(module, args, kwargs):
        if kwargs["input_ids"].shape[1] == 1:  # a decode step
            decodes_after_first.append(bool(seen_first))
        elif loops:  # the prefill: the event loop is kept busy a while meanwhile
            loops.pop().call_soon_threadsafe(time.sleep, 1.0)

    async def main():
        loops.append(asyncio.get_running_loop())
        tokens = engine.generate(ids, SamplingParams(max_tokens=3, temperature=0))
        out = [await anext(tokens)]
        seen_first.append(True)
        return out + [t async for t in tokens]

    hook = model.register_forward_pre_hook(note_decode, with_kwargs=True)
    try:
        answer = run(engine, main())
    finally:
        hook.remove()
    assert answer == alone(model, ids, 3)
    assert decodes_after_first and all(decodes_after_first)


def test_the_replica_takes_the_admission_window_setting(capsys):
    from gpulab.serving.server import main, parse_args

    assert parse_args(["--model-dir", "m"]).max_admission_window_ms == 100
    assert (
        parse_args(["--model-dir", "m", "--max-admission-window-ms", "0"]).max_admission_window_ms
        == 0
    )
    assert main(["--model-dir", "m", "--max-admission-window-ms", "-1"]) == 2
    assert "--max-admission-window-ms must be 0 or more" in capsys.readouterr().err
