"""What a client may send to a collection, checked before the engine sees it.

Each check raises :class:`Refused` (an HTTP status and one line that says what was
wrong and what to do); nothing is written until every row of a request passed.
"""

from __future__ import annotations

import binascii
import re
import uuid
from dataclasses import dataclass

import numpy as np

from gpulab.scheduler.slices import noun

from . import filters, row_cost
from .engine import ID_MAX, METRICS

NAME = re.compile(r"[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?")  # fullmatch: "$" lets "x\n" by
#: A metadata key a dict filter may name.
KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
METADATA_MAX = 64 * 1024  # bytes of JSON per row
#: Keys and list items in one row's metadata, nested ones too. Held in the engine as
#: Python objects, each costs about 70 bytes however short its JSON: 64 KiB of small
#: keys took about 15 times its JSON in the engine's memory.
METADATA_ITEMS_MAX = 256
TEXT_MAX = 8192  # characters per text
#: The key of a row's metadata in the engine that keeps the text it was made from
#: (returned as the hit's ``text``, not in its metadata). Not a key a client may send.
TEXT_KEY = "_text"
K_MAX = 1000
#: The types a vector's values may have (JSON numbers; not bool, which is an int too).
NUMBER_TYPES = {int, float}
#: What only a ``\uD800``-``\uDFFF`` escape in a JSON body can make: a lone surrogate
#: (the bytes themselves are checked to be UTF-8 by the body parser).
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: The largest value a vector may hold: the engines keep vectors as float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CollectionLimits:
    max_rows: int
    max_dim: int
    max_per_user: int
    #: Query vectors in one search, and query vectors times k (the hits it returns).
    max_queries: int = 100
    max_hits: int = 10_000
    #: Rows one owner's collections hold together.
    max_rows_per_user: int = 5_000_000
    #: Bytes they may cost the embedded engine together (:mod:`.row_cost`).
    max_bytes_per_user: int = 8192 << 20


def fields(body: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise Refused(
            400,
            f"unknown {noun(len(unknown), 'field')}: {', '.join(unknown)}; "
            f"this route takes {', '.join(known)}",
        )


def name(value) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
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


def vectors(values, dim: int, limits: CollectionLimits, what: str = "vectors") -> np.ndarray:
    """The vectors as one (n, dim) array, each value a finite number."""
    if not isinstance(values, list):
        raise Refused(400, f"{what} must be a list of lists of {dim} numbers")
    rows_count(len(values), limits, what)
    for i, v in enumerate(values):
        if not isinstance(v, list) or len(v) != dim:
            got = f"{len(v)} numbers" if isinstance(v, list) else type(v).__name__
            raise Refused(400, f"{what}[{i}] has {got}; this collection holds {dim}-d vectors")
        # The types of a row's values, found in C (a 1,000-row insert of 384-d vectors
        # is 384,000 values: a Python loop per value took 100 ms of the service's loop).
        if not set(map(type, v)) <= NUMBER_TYPES:
            raise Refused(400, f"{what}[{i}] holds something that is not a number")
    try:
        out = np.asarray(values, dtype=np.float64).reshape(len(values), dim)
    except OverflowError:  # an int too large for a float
        out = np.full((len(values), dim), np.inf)
    finite = np.isfinite(out).all(axis=1)  # the body parser refuses NaN; ints may be huge
    if not finite.all():
        raise Refused(400, f"{what}[{int(np.argmin(finite))}] holds a value that is not finite")
    # The engines hold float32: a larger value (1e300) would be stored as inf and turn
    # the row's scores into inf or NaN.
    fits = (np.abs(out) <= FLOAT32_MAX).all(axis=1)
    if not fits.all():
        i = int(np.argmin(fits))
        value = out[i][np.argmax(np.abs(out[i]) > FLOAT32_MAX)]
        raise Refused(
            400,
            f"{what}[{i}] holds {value:g}, outside float32's range (±{FLOAT32_MAX:.4g}), "
            "in which vectors are kept: scale the vector down",
        )
    return out


def packed_vectors(value, dim: int, limits: CollectionLimits) -> np.ndarray:
    """``vectors_base64``: the vectors as base64 of their little-endian float32 values,
    row after row (as OpenAI's ``encoding_format="base64"`` gives embeddings): a 1,000-row
    insert of 384-d vectors is one 2 MB string instead of 384,000 numbers to parse."""
    what = "vectors_base64"
    if not isinstance(value, str):
        raise Refused(400, f"{what} must be a string: base64 of little-endian float32 values")
    try:
        raw = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        raise Refused(
            400, f"{what} is not base64: send base64.b64encode(array.astype('<f4').tobytes())"
        ) from None
    if len(raw) % (4 * dim):
        raise Refused(
            400,
            f"{what} holds {len(raw)} bytes, not a whole number of {dim}-d float32 "
            f"vectors ({4 * dim} bytes each)",
        )
    n = len(raw) // (4 * dim)
    rows_count(n, limits, what)
    out = np.frombuffer(raw, dtype="<f4").reshape(n, dim)
    finite = np.isfinite(out).all(axis=1)
    if not finite.all():
        raise Refused(
            400, f"{what}: vector {int(np.argmin(finite))} holds a value that is not finite"
        )
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


def texts_of_vectors(values, n: int, limits: CollectionLimits) -> list[str]:
    """Texts sent beside vectors: kept with them (one each), not embedded."""
    values = texts(values, limits)
    if len(values) != n:
        raise Refused(400, f"{len(values)} texts for {n} vectors: send one text per vector")
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
        if TEXT_KEY in m:
            raise Refused(
                400,
                f"metadata[{i}] has the key {TEXT_KEY!r}, which keeps the row's text: "
                "send the text in texts (with vectors, or alone to have it embedded)",
            )
        items = row_cost.items(m, METADATA_ITEMS_MAX)
        if items > METADATA_ITEMS_MAX:
            raise Refused(
                413,
                f"metadata[{i}] holds more than {METADATA_ITEMS_MAX} keys and list items "
                "(nested ones counted): keep a row's metadata to the fields a filter or a "
                "hit needs, and a long list or document as one string",
            )
        if row_cost.json_size(m) > METADATA_MAX:
            raise Refused(413, f"metadata[{i}] is over {METADATA_MAX // 1024} KiB of JSON")
    return values


def k(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= K_MAX:
        raise Refused(400, f"k must be a whole number from 1 to {K_MAX}, not {value!r}")
    return value


def search_size(n_queries: int, k: int, limits: CollectionLimits) -> None:
    """A search's work grows with its queries times k: 1,000 queries of k=1,000 held
    the engine 21 s for everyone."""
    if n_queries > limits.max_queries:
        raise Refused(
            400,
            f"{n_queries} query vectors in one search; at most {limits.max_queries}: "
            "send them in several searches",
        )
    if n_queries * k > limits.max_hits:
        raise Refused(
            400,
            f"{n_queries} queries with k={k} ask for {n_queries * k} hits; at most "
            f"{limits.max_hits} (queries times k) in one search: lower k or send fewer queries",
        )


def filter_expression(value, write=filters.to_milvus) -> str:
    """The engine's filter, written by us (``write``: the engine's writer) from the
    parsed filter (:mod:`.filters`): an expression (``'metadata["lang"] == "en"'``), or
    ``{key: value}`` pairs that must all match (``{"lang": "en"}``). The text a client
    sent never reaches the engine."""
    if value is None or value == "":
        return ""
    try:
        if isinstance(value, str):
            return write(filters.parse(value))
        if isinstance(value, dict) and value:
            for key in value:
                if not KEY.match(key):
                    raise Refused(400, f"filter key {key!r}: use letters, digits, '_', '.', '-'")
            return write(filters.from_pairs(value))
    except filters.FilterError as e:
        raise Refused(400, str(e)) from None
    raise Refused(
        400, 'filter must be an expression (\'metadata["lang"] == "en"\') or {"lang": "en"}'
    )


def unicode_text(body: dict, raw: bytes) -> None:
    """Refuse a body that holds a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but
    not text: the engine's client cannot encode it). Only a surrogate escape in the raw
    bytes can make one, so a large body of numbers is not walked."""
    if SURROGATE_ESCAPE.search(raw):
        _no_surrogate(body, "body")


def _no_surrogate(value, where: str) -> None:
    """Walked with a stack of its own, not by recursion (a body nested thousands deep
    gets the 400, not a RecursionError); a place is written out only for the answer
    (each level's name built on the way down would cost the depth squared)."""
    stack = [(value, (None, where, True))]
    while stack:
        value, place = stack.pop()
        if isinstance(value, str):
            for i, ch in enumerate(value):
                if 0xD800 <= ord(ch) < 0xE000:
                    raise Refused(
                        400,
                        f"{_written(place)} holds a lone UTF-16 surrogate (\\u{ord(ch):04x}) "
                        f"at character {i}, which is not text: send valid Unicode "
                        "(surrogates come in pairs)",
                    )
        elif isinstance(value, dict):
            top = place[0] is None and place[1] == "body"
            for key, item in reversed(value.items()):  # found in the body's order
                stack.append(
                    (item, (place, str(key), True) if top else (place, f"[{key!r}]", False))
                )
                stack.append((key, (place, ": a key", False)))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((value[i], (place, f"[{i}]", False)))


def _written(place: tuple, most: int = 32) -> str:
    """A place of :func:`_no_surrogate` (parent, step, whole): its steps from the last
    whole one down, the last ``most`` of them."""
    steps = []
    while place is not None:
        parent, step, whole = place
        if len(steps) == most:
            steps.append("body...")
            break
        steps.append(step)
        if whole:
            break
        place = parent
    return "".join(reversed(steps))
