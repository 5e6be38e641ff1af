"""Slices of a GPU, counted in milli-GPU (1000 = one whole card).

A slice request is one integer, ``gpu_milli``:

- ``0`` means no GPU;
- ``1..999`` is a fraction of one GPU (``250`` = a quarter);
- a multiple of ``1000`` is that many whole GPUs on one node.

Every other value is rejected with a message that says what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

MILLI_PER_GPU = 1000

#: The sizes the spawn form offers by default.
DEFAULT_SLICE_SIZES = (0, 100, 250, 500, 1000, 2000)


class SliceError(ValueError):
    """A slice request that cannot be understood (bad type, unknown size)."""


@dataclass(frozen=True)
class SliceShape:
    """How a request in milli-GPU maps onto physical GPUs."""

    num_gpus: int  # GPUs touched; 0 for a CPU-only request
    milli_per_gpu: int  # share of each touched GPU, 1..1000

    @property
    def total_milli(self) -> int:
        return self.num_gpus * self.milli_per_gpu


def shape_of(gpu_milli: int) -> SliceShape:
    """Map a validated request onto GPUs: fractions use one GPU, wholes use n."""
    if gpu_milli == 0:
        return SliceShape(0, 0)
    if gpu_milli < MILLI_PER_GPU:
        return SliceShape(1, gpu_milli)
    return SliceShape(gpu_milli // MILLI_PER_GPU, MILLI_PER_GPU)


def label(gpu_milli: int) -> str:
    """A human name for a size: ``1/4 GPU``, ``2 GPUs``, ``no GPU``."""
    if gpu_milli == 0:
        return "no GPU"
    if gpu_milli % MILLI_PER_GPU == 0:
        n = gpu_milli // MILLI_PER_GPU
        return f"{n} GPU" if n == 1 else f"{n} GPUs"
    for denom in (2, 3, 4, 5, 8, 10, 20):
        if (gpu_milli * denom) % MILLI_PER_GPU == 0:
            return f"{gpu_milli * denom // MILLI_PER_GPU}/{denom} GPU"
    return f"{gpu_milli / MILLI_PER_GPU:.3g} GPU"


def noun(n: int, word: str) -> str:
    """``word`` for one, ``words`` for any other count (``unknown fields: a, b``)."""
    return word if n == 1 else f"{word}s"


def plural(n: int, word: str) -> str:
    """``1 rank``, ``2 ranks``: a count in words, never ``rank(s)``."""
    return f"{n} {noun(n, word)}"


def parse_gpu_milli(value: object, allowed: tuple[int, ...] | None = None) -> int:
    """Validate a ``gpu_milli`` value from a user; raise :class:`SliceError`.

    ``allowed`` restricts the request to the sizes an operator offers; ``None``
    accepts any well-formed size.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SliceError(
            f"gpu_milli must be an integer number of milli-GPUs (250 = 1/4 GPU), got {value!r}"
        )
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SliceError(
                f"gpu_milli must be an integer number of milli-GPUs (250 = 1/4 GPU), got {value!r}"
            ) from None
    if value < 0:
        raise SliceError(f"gpu_milli cannot be negative, got {value}")
    if value > MILLI_PER_GPU and value % MILLI_PER_GPU:
        raise SliceError(
            f"gpu_milli={value} is more than one GPU but not a whole number of GPUs; "
            f"use a fraction up to 1000 or a multiple of 1000"
        )
    if allowed is not None and value not in allowed:
        offered = ", ".join(label(m) for m in allowed)
        raise SliceError(
            f"{label(value)} is not a slice size offered here; choose one of: {offered}"
        )
    return value
