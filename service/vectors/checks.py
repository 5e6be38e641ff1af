"""What a client may send to a collection, checked before the engine sees it.

Each check raises :class:`Refused` (an HTTP status and one line that says what was
wrong and what to do); nothing is written until every row of a request passed.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass

from gpulab.scheduler.slices import noun

from .engine import ID_MAX, METRICS

NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
#: A metadata key a dict filter may name (it is written into the engine's expression).
KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
METADATA_MAX = 64 * 1024  # bytes of JSON per row
TEXT_MAX = 8192  # characters per text
K_MAX = 1000
FILTER_MAX = 4096


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CollectionLimits:
    max_rows: int
    max_dim: int
    max_per_user: int


def fields(body: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise Refused(
            400,
            f"unknown {noun(len(unknown), 'field')}: {', '.join(unknown)}; "
            f"this route takes {', '.join(known)}",
        )


def name(value) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise Refused(
            400,
            f"collection name {value!r}: use 1-63 of a-z, 0-9, '_', '.', '-', "
            f"starting and ending with a letter or digit",
        )
    return value


def metric(value) -> str:
    if value not in METRICS:
        raise Refused(400, f"unknown metric {value!r}; use one of {', '.join(METRICS)}")
    return value


def dimension(value, limits: CollectionLimits) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limits.max_dim:
        raise Refused(400, f"dim must be a whole number from 1 to {limits.max_dim}, not {value!r}")
    return value


def rows_count(n: int, limits: CollectionLimits, what: str) -> None:
    if n == 0:
        raise Refused(400, f"no {what} given")
    if n > limits.max_rows:
        raise Refused(413, f"{n} {what} in one request; send at most {limits.max_rows} per request")


def vectors(values, dim: int, limits: CollectionLimits, what: str = "vectors") -> list:
    if not isinstance(values, list):
        raise Refused(400, f"{what} must be a list of lists of {dim} numbers")
    rows_count(len(values), limits, what)
    out = []
    for i, v in enumerate(values):
        if not isinstance(v, list) or len(v) != dim:
            got = f"{len(v)} numbers" if isinstance(v, list) else type(v).__name__
            raise Refused(400, f"{what}[{i}] has {got}; this collection holds {dim}-d vectors")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
            raise Refused(400, f"{what}[{i}] holds something that is not a number")
        if not all(math.isfinite(x) for x in v):  # the body parser refuses NaN; ints may be huge
            raise Refused(400, f"{what}[{i}] holds a value that is not finite")
        out.append([float(x) for x in v])
    return out


def texts(values, limits: CollectionLimits) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(t, str) for t in values):
        raise Refused(400, "texts must be a list of strings")
    rows_count(len(values), limits, "texts")
    for i, t in enumerate(values):
        if not t.strip():
            raise Refused(400, f"texts[{i}] is empty")
        if len(t) > TEXT_MAX:
            raise Refused(413, f"texts[{i}] has {len(t)} characters; at most {TEXT_MAX}")
    return values


def ids(values, n: int) -> list[str]:
    """The rows' ids: given (strings or whole numbers, unique), or new ones."""
    if values is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if not isinstance(values, list) or len(values) != n:
        raise Refused(400, f"ids must be a list of {n} ids, one per row")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise Refused(400, f"ids[{i}] must be a string or a whole number")
        s = str(v)
        if not 1 <= len(s) <= ID_MAX or "\x00" in s:
            raise Refused(400, f"ids[{i}] must have 1-{ID_MAX} characters and no NUL")
        out.append(s)
    if len(set(out)) != len(out):
        raise Refused(400, "ids holds the same id twice")
    return out


def metadata(values, n: int) -> list[dict]:
    if values is None:
        return [{} for _ in range(n)]
    if not isinstance(values, list) or len(values) != n:
        raise Refused(400, f"metadata must be a list of {n} objects, one per row")
    for i, m in enumerate(values):
        if not isinstance(m, dict):
            raise Refused(400, f"metadata[{i}] must be an object")
        if len(json.dumps(m)) > METADATA_MAX:
            raise Refused(413, f"metadata[{i}] is over {METADATA_MAX // 1024} KiB of JSON")
    return values


def k(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= K_MAX:
        raise Refused(400, f"k must be a whole number from 1 to {K_MAX}, not {value!r}")
    return value


def filter_expression(value) -> str:
    """The engine's filter: Milvus's expression as given, or ``{key: value}`` pairs that
    must all match (``{"lang": "en"}`` is ``metadata["lang"] == "en"``)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        if len(value) > FILTER_MAX or "\x00" in value:
            raise Refused(400, f"filter is over {FILTER_MAX} characters or holds a NUL")
        return value
    if isinstance(value, dict) and value:
        parts = []
        for key, v in value.items():
            if not KEY.match(key):
                raise Refused(400, f"filter key {key!r}: use letters, digits, '_', '.', '-'")
            if isinstance(v, dict | list) or v is None:
                raise Refused(400, f"filter value of {key!r} must be a string, number or bool")
            parts.append(f"metadata[{json.dumps(key)}] == {json.dumps(v)}")
        return " and ".join(parts)
    raise Refused(
        400, 'filter must be an expression (\'metadata["lang"] == "en"\') or {"lang": "en"}'
    )
