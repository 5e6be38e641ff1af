"""Reading kernel counter files, and turning two readings into rates."""

from __future__ import annotations


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:  # gone, or EINVAL as "speed" answers for a link that is down
        return None


def read_int(path: str) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def rates_since(
    previous: tuple[float, int, int] | None, now: float, rx: int, tx: int
) -> tuple[float | None, float | None]:
    """Bytes per second since ``previous = (time, rx, tx)``; None when unknown.

    A counter that went down means the device was recreated (or a 32-bit
    counter wrapped); the rate is unknown then rather than negative.
    """
    if previous is None:
        return None, None
    t0, rx0, tx0 = previous
    elapsed = now - t0
    if elapsed <= 0 or rx < rx0 or tx < tx0:
        return None, None
    return (rx - rx0) / elapsed, (tx - tx0) / elapsed
