"""The dynamic batcher in-process: rows go back to their requests, the queue is bounded,
stop answers what is queued. The model is a function gated by events, not by sleeps."""

import asyncio
import threading

import numpy as np
import pytest

from gpulab.serving.batcher import Closed, DynamicBatcher, QueueFull

WAIT_S = 30  # bound on any wait for another thread


class GatedModel:
    """Doubles its input; each call waits for `gate` (open by default) and records its rows."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches: list[int] = []

    def __call__(self, inputs):
        self.batches.append(inputs[0].shape[0])
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        return [inputs[0] * 2, inputs[0][:, :1]]


async def until(event: threading.Event):
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, WAIT_S)


async def test_each_request_gets_its_own_rows_back():
    model = GatedModel()
    batcher = DynamicBatcher(model, max_batch_size=8, max_queue_delay_ms=50, max_queue=64)
    batcher.start()
    model.gate.clear()  # the first call holds, the rest pile up and must batch
    requests = [np.full((1 + i % 4, 3), i, dtype=np.float32) for i in range(12)]
    tasks = [asyncio.ensure_future(batcher.submit([r])) for r in requests]
    await until(model.entered)
    model.gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    for r, (doubled, first) in zip(requests, results, strict=False):
        np.testing.assert_array_equal(doubled, r * 2)
        np.testing.assert_array_equal(first, r[:, :1])
    assert sum(model.batches) == sum(r.shape[0] for r in requests)
    assert max(model.batches) <= 8 and len(model.batches) < len(requests)
    await batcher.stop()


async def test_full_queue_refuses_at_once():
    model = GatedModel()
    model.gate.clear()
    batcher = DynamicBatcher(model, max_batch_size=1, max_queue_delay_ms=0, max_queue=2)
    batcher.start()
    running = asyncio.ensure_future(batcher.submit([np.ones((1, 2), np.float32)]))
    await until(model.entered)  # the first request is in the model, not in the queue
    queued = [
        asyncio.ensure_future(batcher.submit([np.ones((1, 2), np.float32)])) for _ in range(2)
    ]
    await asyncio.sleep(0)  # let them enqueue (a scheduling step, not a timing guess)
    assert batcher.depth == 2
    with pytest.raises(QueueFull, match="queue full"):
        await batcher.submit([np.ones((1, 2), np.float32)])
    model.gate.set()
    await asyncio.wait_for(asyncio.gather(running, *queued), WAIT_S)
    await batcher.stop()


async def test_stop_answers_the_queue_then_refuses():
    model = GatedModel()
    model.gate.clear()
    batcher = DynamicBatcher(model, max_batch_size=1, max_queue_delay_ms=0, max_queue=8)
    batcher.start()
    tasks = [asyncio.ensure_future(batcher.submit([np.ones((1, 2), np.float32)])) for _ in range(3)]
    await until(model.entered)
    stopping = asyncio.ensure_future(batcher.stop())
    await asyncio.sleep(0)
    with pytest.raises(Closed):
        await batcher.submit([np.ones((1, 2), np.float32)])
    model.gate.set()
    await asyncio.wait_for(stopping, WAIT_S)
    assert all(t.done() and t.exception() is None for t in tasks)


async def test_a_model_error_reaches_every_request_of_the_batch():
    def broken(inputs):
        raise RuntimeError("boom")

    batcher = DynamicBatcher(broken, max_batch_size=4, max_queue_delay_ms=1, max_queue=8)
    batcher.start()
    results = await asyncio.gather(
        *(batcher.submit([np.ones((1, 2), np.float32)]) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) and "boom" in str(r) for r in results)
    await batcher.stop()


async def test_a_request_larger_than_a_batch_is_refused():
    batcher = DynamicBatcher(GatedModel(), max_batch_size=4, max_queue_delay_ms=1, max_queue=8)
    with pytest.raises(ValueError, match="exceeds max batch size 4"):
        await batcher.submit([np.ones((5, 2), np.float32)])
