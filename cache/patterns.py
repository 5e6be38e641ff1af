"""Shard lists from patterns, the way WebDataset users write them.

``http://host/train-{0000..0099}.tar`` expands brace ranges (zero padding
kept, several ranges multiply); ``s3://bucket/train-*.tar`` expands through
the store's own listing (fsspec ``glob``), sorted so every rank and epoch sees
the same order.
"""

from __future__ import annotations

import itertools
import re

from .remote import filesystem_for

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_GLOB = re.compile(r"[*?\[]")


def expand_braces(pattern: str) -> list[str]:
    """``a{08..10}b`` -> ``['a08b', 'a09b', 'a10b']``."""
    parts = _RANGE.split(pattern)
    literals, ranges = parts[0::3], list(zip(parts[1::3], parts[2::3], strict=True))
    choices = []
    for start, stop in ranges:
        lo, hi = int(start), int(stop)
        if hi < lo:
            raise ValueError(
                f"{pattern}: range {{{start}..{stop}}} counts down; write {{{stop}..{start}}}"
            )
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        choices.append([str(n).zfill(width) for n in range(lo, hi + 1)])
    urls = []
    for picked in itertools.product(*choices):
        pieces = [literals[0]]
        for value, literal in zip(picked, literals[1:], strict=True):
            pieces += [value, literal]
        urls.append("".join(pieces))
    return urls


def expand(spec: str) -> list[str]:
    """The shard URLs a pattern names, in a stable order."""
    urls = expand_braces(spec)
    if not any(_GLOB.search(u.split("://", 1)[-1]) for u in urls):
        return urls
    found = []
    for url in urls:
        fs, path = filesystem_for(url)
        matches = sorted(fs.glob(path))
        if not matches:
            raise FileNotFoundError(
                f"{url}: the pattern matches no files; check it, or list the shard URLs explicitly"
            )
        found += [m if "://" in m else fs.unstrip_protocol(m) for m in matches]
    return found
