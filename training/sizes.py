"""Sizes in bytes written by people: ``16M``, ``20GiB``, ``500GB``, ``1073741824``.

One rule for every size gpulab reads (``%gpulab nettest --size``, the all-reduce
probe, ``GPULAB_CACHE_CAPACITY_BYTES`` and ``capacity_bytes=``):

- a bare number is bytes: ``65536``; ``B`` may follow: ``65536B``;
- ``K``, ``M``, ``G``, ``T`` alone are powers of 1024, as in ``16M`` (the habit of
  nccl-tests, ``dd`` and ``torchrun`` users): ``16M`` = 16 MiB;
- ``KiB``, ``MiB``, ``GiB``, ``TiB`` (or Kubernetes' ``Ki``, ``Mi``, ``Gi``, ``Ti``)
  are powers of 1024 too;
- ``KB``, ``MB``, ``GB``, ``TB`` are powers of 1000 (SI, as disks are sold):
  ``500GB`` = 500 * 10**9;
- units are case-insensitive, a space may stand before them, and the number may
  have a fraction (``1.5TiB``); the result is rounded down to whole bytes.

Standard library only: training ranks, the dataset cache and the magics all
import it (``gpulab.training`` imports no torch at package level).
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?b|i)?|(b))?\s*", re.IGNORECASE)

EXAMPLES = "65536, 64K, 16M, 20GiB or 500GB"


def unit_bytes(prefix: str, suffix: str | None) -> int:
    """Bytes per unit: prefix ``K|M|G|T``, then ``None``, ``B``, ``i`` or ``iB``."""
    prefix = prefix.lower()
    if (suffix or "").lower() == "b":
        return _DECIMAL[prefix]
    return _BINARY[prefix]


def parse_size(text: str | int) -> int:
    """Bytes (an int >= 0) from a size written as the module docstring says.

    >>> parse_size("16M"), parse_size("16MiB"), parse_size("16MB")
    (16777216, 16777216, 16000000)

    Raises ``ValueError`` saying what to write instead.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size {text!r}: a size cannot be negative")
        return text
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(
            f"size {text!r}: expected bytes like {EXAMPLES}: a number with an optional "
            "unit (K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB "
            "powers of 1000)"
        )
    number, prefix, suffix, _bytes = match.groups()
    scale = unit_bytes(prefix, suffix) if prefix else 1
    return int(Fraction(number) * scale)


def size_words(n: int) -> str:
    """Bytes for people, in powers of 1000 as disks are sold: ``1.2 GB``, ``850 MB``,
    ``12 kB``, ``0 B`` (one decimal below 10 unless whole, none above)."""
    n = max(0, int(n))
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            value = n / scale
            whole = value >= 10 or value == int(value)
            return f"{value:.0f} {unit}" if whole else f"{value:.1f} {unit}"
    return f"{n} B"
