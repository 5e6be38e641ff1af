"""The same global batch at any world size (gpulab.training.batches), in process.

The ranks are simulated: each rank's micro-batches are run in turn and their
gradients averaged, as DDP's all-reduce does.
"""

import pytest
import torch

from gpulab.training.batches import BatchError, accumulation, micro_batches, step_samples


def step_gradient(world: int, step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(100, 4, generator=g, dtype=torch.float64)
    Y = torch.randn(100, 1, generator=g, dtype=torch.float64)
    w = torch.ones(4, 1, dtype=torch.float64, requires_grad=True)
    total = torch.zeros_like(w)
    for rank in range(world):
        w.grad = None
        for mb in micro_batches(
            step, len(X), global_batch=24, micro_batch=micro, rank=rank, world_size=world
        ):
            loss = ((X[mb.indices] @ w - Y[mb.indices]) ** 2).mean() * mb.weight
            loss.backward()
        total += w.grad
    return total / world  # DDP averages the ranks' gradients


@pytest.mark.parametrize("world,micro", [(2, 12), (2, 5), (3, 4), (5, 3), (24, 1)])
def test_every_world_size_computes_the_one_process_gradient(world, micro):
    for step in (0, 3, 9):  # step 9 crosses into the third epoch of 100 samples
        one = step_gradient(1, step, 24)
        torch.testing.assert_close(step_gradient(world, step, micro), one, rtol=1e-12, atol=1e-12)


def test_the_samples_of_a_step_depend_on_the_step_alone():
    first = step_samples(4, 100, 24)
    assert step_samples(4, 100, 24) == first and len(set(first)) == 24
    # The steps of one epoch cover the dataset once before any sample repeats.
    epoch = [i for s in range(4) for i in step_samples(s, 96, 24)]
    assert sorted(epoch) == list(range(96))
    # Every rank's share together is the step's global batch, once.
    shares = [
        i
        for rank in range(3)
        for mb in micro_batches(4, 100, global_batch=24, micro_batch=5, rank=rank, world_size=3)
        for i in mb.indices
    ]
    assert shares == first


def test_accumulation_grows_as_the_world_shrinks():
    assert [accumulation(64, 8, w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert accumulation(10, 3, 3) == 2  # shares of 4, 3, 3: the largest needs 2


def test_bad_sizes_say_what_to_use():
    with pytest.raises(BatchError, match="global_batch 2 is smaller than the 4 ranks"):
        micro_batches(0, 10, global_batch=2, micro_batch=1, world_size=4)
    with pytest.raises(BatchError, match="micro_batch must be a whole number >= 1"):
        micro_batches(0, 10, global_batch=8, micro_batch=0)
