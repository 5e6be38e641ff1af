"""Request bodies: read as they arrive, never more than a route takes, parsed in one place.

Every API route streams its body (``tornado.web.stream_request_body``) so that
a body over the route's limit is refused with a JSON 413 without a byte of it
being kept, and so that the model upload can go straight to disk
(:mod:`gpulab.service.endpoints.uploads`). Bad bytes are bad
input: a body that is not UTF-8, not JSON, not an object, or that holds
numbers JSON cannot carry (NaN, Infinity, 1e400) is a 400 that says so, never
a 500; so is a denormal number (``1e-320``) or one that underflows to 0
(``1e-400``), and an object that names a key twice (which value would count
differs between parsers).
"""

from __future__ import annotations

import json
import math
import sys
import weakref
from collections import Counter

import orjson
from tornado import web

#: What a JSON route takes unless it says otherwise (allocations, sharing, probes).
JSON_BODY_LIMIT = 1 << 20
#: How far past its limit a body is still read (and dropped) to answer 413 cleanly.
DRAIN_LIMIT = 256 << 20
#: The bytes of bodies over JSON_BODY_LIMIT one caller may have in the service's
#: memory at once: a job's (up to 341 MiB of base64) takes about three times its size
#: while it is parsed and decoded, and eight sent at once took all the service's
#: memory. One such body at a time, smaller ones beside it.
BODY_BYTES_PER_CALLER = 512 << 20

#: Per application: each caller's bytes of bodies held (see BoundedBody.hold_body_room).
_bodies_held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mib(n: int) -> str:
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


def too_large(what: str, size: int | None, limit: int, setting: str = "") -> web.HTTPError:
    sent = f" ({mib(size)})" if size is not None else ""
    where = setting if "." in setting else f"GpuLabService.{setting}"  # JobQueue.max_job_vars_mib
    fix = f"; an admin can raise c.{where}" if setting else ""
    return web.HTTPError(
        413, f"{what}{sent} is larger than the {mib(limit)} this route takes: send less{fix}"
    )


#: The range of a number a body may hold: 0, or a size a double keeps exactly to its
#: 15 digits (below sys.float_info.min a double is denormal and loses digits).
NUMBER_RANGE = f"0 or between {sys.float_info.min:.3g} and {sys.float_info.max:.3g} in size"


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number; send a finite number")


def _normal_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise ValueError(f"{text} is out of range, not a finite number; send {NUMBER_RANGE}")
    digits = text.lower().partition("e")[0]
    if (value != 0 and abs(value) < sys.float_info.min) or (
        value == 0 and any(d in "123456789" for d in digits)  # 1e-400 parses to 0.0
    ):
        raise ValueError(f"{text} is too small to be a number here; send {NUMBER_RANGE}")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            # Which one would win differs between parsers; say so instead of guessing.
            raise ValueError(f"the key {key!r} appears twice in one object; send it once")
        out[key] = value
    return out


def _key_count(raw: bytes) -> int:
    """How many object keys valid JSON text holds: its strings followed by a colon.
    Found quote to quote with ``bytes.find`` (C's speed over a long string: a regular
    expression took 30 to 400 ms over the 2 MB vectors_base64 of a 1,000-row insert)."""
    keys, end = 0, len(raw)
    start = raw.find(b'"')
    while start >= 0:
        close = raw.find(b'"', start + 1)
        while True:  # a quote after an odd number of backslashes is inside the string
            back = close - 1
            while raw[back] == 0x5C:
                back -= 1
            if (close - 1 - back) % 2 == 0:
                break
            close = raw.find(b'"', close + 1)
        after = close + 1
        while after < end and raw[after] in b" \t\r\n":
            after += 1
        keys += after < end and raw[after] == 0x3A
        start = raw.find(b'"', after)
    return keys


#: Floats the fast parser reads as the checked one does: at least the smallest normal
#: double (orjson reads 1e-320 as a denormal and 1e-400 as 0, which the checked parser
#: refuses; a body with a 0.0 in it is left to the checked parser, which knows which
#: it was) and below 2**63 (orjson reads an integer past 64 bits as a float).
_LOW, _HIGH = sys.float_info.min, float(2**63)


#: How deep a body's arrays and objects may nest: more than any route reads, and far
#: below what would exhaust Python's stack in the code that walks a body afterwards.
MAX_NESTING = 64
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _too_deep(value) -> bool:
    """Whether ``value`` nests arrays and objects more than MAX_NESTING deep (without
    recursing: a body at Python's own limit must not take the handler down)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        items = v.values() if isinstance(v, dict) else v
        if set(map(type, items)) <= _SCALARS:  # a vector: looked at in C
            continue
        if depth >= MAX_NESTING:
            return True
        stack.extend((x, depth + 1) for x in items if isinstance(x, (dict, list)))
    return False


def _checked_shape(value) -> int | None:
    """How many keys the objects in ``value`` hold; None where a float is outside what
    the fast parser surely reads right (a list of numbers is looked at in C)."""
    if isinstance(value, dict):
        total = len(value)
        for v in value.values():
            n = _checked_shape(v)
            if n is None:
                return None
            total += n
        return total
    if isinstance(value, list):
        types = set(map(type, value))
        if types <= {float, int}:
            if float in types and not (
                min(map(abs, value)) >= _LOW and max(map(abs, value)) < _HIGH
            ):
                return None
            return 0
        total = 0
        for v in value:
            n = _checked_shape(v)
            if n is None:
                return None
            total += n
        return total
    if isinstance(value, float) and not _LOW <= abs(value) < _HIGH:
        return None
    return 0


def _fast(raw: bytes) -> dict | None:
    """``raw`` parsed by orjson (a tenth of the checked parser's time on a 384-float
    vector, which was most of a search request's time in the service) when that is
    sure to give what the checked parser gives; else None, and the checked parser
    reads it (and says what is wrong). orjson refuses NaN, Infinity, infinities, lone
    surrogates and bad UTF-8 itself; what it would read otherwise (denormals, numbers
    that underflow to 0, integers past 64 bits, a key named twice in one object, where
    it keeps the last) is looked for here."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or _too_deep(body):
        return None  # the checked parser says what is wrong
    if _key_count(raw) != _checked_shape(body):  # a key twice, or a float
        return None
    return body


def parse_json_object(raw: bytes | str, what: str = "request body") -> dict:
    """``raw`` as a JSON object, or a 400 saying what is wrong with it."""
    if isinstance(raw, bytes) and raw:
        body = _fast(raw)
        if body is not None:
            return body
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise web.HTTPError(
                400, f"{what} is not UTF-8 text (byte {e.start}); send JSON encoded as UTF-8"
            ) from None
    try:
        body = json.loads(
            raw or "{}",
            parse_constant=_refuse_constant,
            parse_float=_normal_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as e:
        raise web.HTTPError(400, f"{what} is not valid JSON: {e}") from None
    except ValueError as e:  # NaN/Infinity, 1e400, an integer of thousands of digits
        raise web.HTTPError(400, f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise web.HTTPError(400, f"{what} is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise web.HTTPError(
            400, f"{what} must be a JSON object ({{...}}), not {type(body).__name__}"
        )
    if _too_deep(body):
        raise web.HTTPError(400, f"{what} nests arrays and objects more than {MAX_NESTING} deep")
    return body


class BoundedBody:
    """Mixin of streaming handlers: buffers at most :meth:`body_limit` bytes.

    Call :meth:`check_body_size` in ``prepare``; read with :meth:`raw_body` or
    :meth:`json_body` (a route that streams its body elsewhere, the model
    upload, overrides ``data_received``, counts the bytes itself and calls
    :meth:`raise_refusal`).

    A body that is refused (over the limit; an upload refused before it is
    read) is read and dropped, then answered: a server that answers and hangs
    up mid-body makes the hub's proxy report its own 503 instead of the reason.
    Past :data:`DRAIN_LIMIT` over the limit it is answered at once.
    """

    #: The trait (of GpuLabService) that sets this route's limit, named in the 413.
    body_setting = ""
    #: False where the route streams its body to disk (the model upload), not memory.
    body_in_memory = True

    def body_limit(self) -> int:
        return JSON_BODY_LIMIT

    def check_body_size(self) -> None:
        self._chunks: list[bytes] = []
        self._refusal: web.HTTPError | None = None
        self._received = 0
        limit = self.body_limit()
        length = self.request.headers.get("Content-Length")
        if length is None:
            # A chunked body says its size only as it comes: read up to DRAIN_LIMIT past
            # the limit (data_received, or the model upload's parser, refuses it with a
            # 413 once it is over and drops the rest), after which tornado hangs up. A cut
            # at the limit itself would leave the client (and the hub's proxy, which then
            # answers its own 503 page) without the 413 that says the cap.
            self.request.connection.set_max_body_size(limit + DRAIN_LIMIT)
            return
        self.request.connection.set_max_body_size(limit)
        try:
            size = int(length)
        except ValueError:
            raise web.HTTPError(400, f"Content-Length {length!r} is not a number") from None
        if size > limit:
            error = too_large(f"the {self.request.method} body", size, limit, self.body_setting)
            if size > limit + DRAIN_LIMIT:
                raise error  # answering now closes the connection with the body unread
            self.request.connection.set_max_body_size(size)
            self.refuse_after_body(error)

    def hold_body_room(self, caller: str) -> None:
        """Count this body (its Content-Length, else the route's limit) against the
        ``caller``'s bodies in memory: past BODY_BYTES_PER_CALLER, with another of
        theirs still held, it is read, dropped and answered 429. Given back by
        :meth:`release_body_room` when the request ends."""
        if not self.body_in_memory or self._refusal is not None:
            return
        length = self.request.headers.get("Content-Length")
        size = int(length) if length is not None else self.body_limit()
        if size <= JSON_BODY_LIMIT:
            return
        held = _bodies_held.setdefault(self.application, Counter())
        if held[caller] and held[caller] + size > BODY_BYTES_PER_CALLER:
            self.refuse_after_body(
                web.HTTPError(
                    429,
                    f"you are already sending {mib(held[caller])} of request bodies to "
                    f"gpulab, and this one ({mib(size)}) would pass the "
                    f"{mib(BODY_BYTES_PER_CALLER)} one caller may send at once: wait for "
                    f"those to be answered, then send it again",
                )
            )
            return
        held[caller] += size
        self._body_room = (held, caller, size)

    def release_body_room(self) -> None:
        room, self._body_room = getattr(self, "_body_room", None), None
        if room is not None:
            held, caller, size = room
            held[caller] -= size
            if held[caller] <= 0:
                del held[caller]

    def refuse_after_body(self, error: web.HTTPError) -> None:
        """Answer ``error`` once the body is in, keeping none of it."""
        self._refusal = error
        self._chunks.clear()

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._refusal is None and self._received > self.body_limit():
            self.refuse_after_body(
                too_large(
                    f"the {self.request.method} body", None, self.body_limit(), self.body_setting
                )
            )
        if self._refusal is None:
            self._chunks.append(chunk)

    def raise_refusal(self) -> None:
        if self._refusal is not None:
            raise self._refusal

    def raw_body(self) -> bytes:
        self.raise_refusal()
        return b"".join(self._chunks)

    def json_body(self) -> dict:
        return parse_json_object(self.raw_body())
