"""GPU amounts in the words people read: ``1/4 GPU``, ``2 GPUs``, ``no GPU``.

The API counts in milli-GPU (``gpu_milli``, ``allocated_milli``); whatever a person
reads (tables, charts, magics' output) shows the fraction. Standard library only, so
the kernel-side packages (``widgets``, ``magics``) can use it without the scheduler;
it says the same as ``gpulab.scheduler.slices.label`` and ``plural`` (a test keeps
them equal).
"""

from __future__ import annotations

from collections.abc import Iterable

MILLI_PER_GPU = 1000


def gpu_label(gpu_milli: int) -> str:
    """``250`` -> ``1/4 GPU``; ``2000`` -> ``2 GPUs``; ``0`` -> ``no GPU``."""
    gpu_milli = int(gpu_milli)
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


def holders(slices: Iterable[dict], me: str | None = None) -> list[str]:
    """One entry per holder, their slices summed, most first: ``["alice · 1/2 GPU",
    "you · 1/4 GPU"]``. ``slices``: rows with ``user`` and ``milli`` (as the API serves
    them); ``me`` is shown as "you"."""
    held: dict[str, int] = {}
    for s in slices:
        user = str(s.get("user"))
        held[user] = held.get(user, 0) + int(s.get("milli") or 0)
    ordered = sorted(held.items(), key=lambda kv: (-kv[1], kv[0]))
    return [f"{'you' if user == me else user} · {gpu_label(milli)}" for user, milli in ordered]
