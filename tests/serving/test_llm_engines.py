"""The engines in-process: what they generate greedily is what ``model.generate``
says for each prompt alone, whoever shares the batch and whenever they join; a
cancelled sequence leaves the batch; a full engine refuses."""

import asyncio

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
