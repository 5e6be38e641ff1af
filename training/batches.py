"""The same global batch at any world size: which samples a rank takes at a step.

An elastic job (``--nodes MIN:MAX``) changes its world size while it trains.
For its result not to depend on that, every step must see the same samples with
the same weights whatever the number of ranks: the *global batch* stays what the
user asked for, each rank takes its share of it, and gradient accumulation over
micro-batches makes up for fewer ranks.

- The sample order is fixed by the step alone: step ``s`` takes positions
  ``[s * global_batch, (s + 1) * global_batch)`` of an endless stream of epochs,
  each a permutation of the dataset seeded by ``(seed, epoch)``. A job resumed at
  step ``s``, at any size, goes on with the same samples.
- Rank ``r`` of ``W`` takes a contiguous share of the global batch (sizes differ by
  at most one) and splits it into micro-batches of at most ``micro_batch``.
- Each micro-batch carries a ``weight``: multiply its mean loss by it. DDP
  averages gradients over the ``W`` ranks, so a micro-batch of ``m`` samples gets
  ``m * W / global_batch`` and the step's gradient is the mean over the global
  batch, exactly as one process taking all of it would compute (up to the order
  of float additions).

::

    for step in checkpoint.resume_range(ctx, total_steps=300, state=state):
        opt.zero_grad()
        for mb in ctx.micro_batches(step, len(X), global_batch=64, micro_batch=16):
            with ctx.accumulating(model, mb):
                loss = loss_fn(model(X[mb.indices]), Y[mb.indices]) * mb.weight
                loss.backward()
        opt.step()
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass


class BatchError(ValueError):
    """Batch sizes that cannot work (says which and what to use)."""


@dataclass(frozen=True)
class MicroBatch:
    indices: list[int]  # positions in the dataset
    weight: float  # multiply this micro-batch's mean loss by it
    last: bool  # this rank's last of the step: DDP exchanges gradients after it


def _check(dataset_size: int, global_batch: int, micro_batch: int, world_size: int) -> None:
    for name, value in (
        ("dataset_size", dataset_size),
        ("global_batch", global_batch),
        ("micro_batch", micro_batch),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BatchError(f"{name} must be a whole number >= 1, got {value!r}")
    if global_batch < world_size:
        raise BatchError(
            f"global_batch {global_batch} is smaller than the {world_size} ranks: every "
            f"rank needs a sample; use global_batch >= {world_size} (or fewer --nodes)"
        )


@functools.lru_cache(maxsize=2)
def _epoch_order(dataset_size: int, seed: int, epoch: int):
    # Kept: every step of an epoch reads the same permutation (a 1 M-sample one
    # takes milliseconds to draw, which would be paid again at each step).
    import torch

    return torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed + epoch))


def step_samples(step: int, dataset_size: int, global_batch: int, seed: int = 0) -> list[int]:
    """The dataset positions of step ``step``'s global batch, in order."""
    first = step * global_batch
    out: list[int] = []
    epoch, offset = divmod(first, dataset_size)
    while len(out) < global_batch:
        order = _epoch_order(dataset_size, seed, epoch)
        take = order[offset : offset + global_batch - len(out)].tolist()
        out += take
        epoch, offset = epoch + 1, 0
    return out


def share(global_batch: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s share of the global batch: ``(start, stop)`` within it."""
    base, extra = divmod(global_batch, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def accumulation(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per step on the rank with the largest share."""
    return math.ceil(math.ceil(global_batch / world_size) / micro_batch)


def micro_batches(
    step: int,
    dataset_size: int,
    *,
    global_batch: int,
    micro_batch: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
) -> list[MicroBatch]:
    """This rank's micro-batches of step ``step`` (see the module's docstring)."""
    _check(dataset_size, global_batch, micro_batch, world_size)
    samples = step_samples(step, dataset_size, global_batch, seed)
    start, stop = share(global_batch, world_size, rank)
    mine = samples[start:stop]
    chunks = [mine[i : i + micro_batch] for i in range(0, len(mine), micro_batch)]
    return [
        MicroBatch(c, len(c) * world_size / global_batch, i == len(chunks) - 1)
        for i, c in enumerate(chunks)
    ]
