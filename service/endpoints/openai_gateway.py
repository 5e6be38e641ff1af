"""The OpenAI-compatible gateway: ``<hub>/services/gpulab/v1``.

Every SDK, agent framework and evaluation harness speaks OpenAI's API; this is that
API over gpulab's endpoints:

    GET  v1/models              the language and embedding endpoints the caller may use
    POST v1/chat/completions    forwarded to a replica of a causal-LM endpoint
    POST v1/completions         the same
    POST v1/embeddings          an embedding endpoint (sentence-transformers), over
                                :meth:`~gpulab.service.endpoints.calls.EndpointCalls.embed_on`

The API key is a hub token (``Authorization: Bearer`` as the ``openai`` package
sends it, or ``token``); the front (the endpoint router, or the service's own route
where there is none) says who it is and hands the call to :meth:`OpenAIGateway.answer`
with a :class:`Reply` to write to. ``model`` is ``NAME`` (the caller's own endpoint)
or ``OWNER/NAME``, with ``:ADAPTER`` for a LoRA adapter served on that endpoint's
replicas (``GET v1/models`` lists each as a model of its own); who may use which is
the endpoints' sharing rule
(:meth:`~gpulab.service.endpoints.calls.EndpointCalls.callable_endpoint`), and a model
the caller may not use is as unknown as one that does not exist (404).

A generation goes to a ready replica as any endpoint call does (version by weight,
canary included, the least busy replica, the replicas' own secret); a streamed
answer passes through as its server-sent events arrive, never held back. The
replica is always asked for the usage (``stream_options.include_usage``), so every
call's tokens are counted (:mod:`.token_meter`), as far as they can be true: the
replica runs its owner's code, so its numbers are held to the model's context and the
call's ``max_tokens`` (:func:`token_caps`). The usage chunk is dropped when the caller
did not ask for it. Refusals are in OpenAI's shape (:mod:`.openai_errors`).
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import sys
import time
from collections.abc import Callable
from typing import Protocol

from gpulab.service.endpoints.calls import EMBEDDING_KIND, CallRefused
from gpulab.service.endpoints.file_answer import FileAnswer
from gpulab.service.endpoints.openai_errors import (
    OpenAIError,
    as_openai,
    error_body,
    model_not_found,
)
from gpulab.service.endpoints.proxy import AnswerTooLarge, off_loop_if_large, read_answer
from gpulab.service.endpoints.token_meter import TokenMeter

#: The card kind of a language model's endpoint (gpulab.serving.llm_export).
CAUSAL_LM_KIND = "causal-lm"
#: The routes, and the card kind each serves.
GENERATION = {"chat/completions": CAUSAL_LM_KIND, "completions": CAUSAL_LM_KIND}
SSE = "text/event-stream"
JSON = "application/json"
#: The longest one server-sent event of a replica may be (a chunk of a few tokens is
#: well under a KiB); the service holds an event whole before it passes it on.
MAX_EVENT_BYTES = 1 << 20
#: Events past this size are passed on without being parsed (a token's chunk or the
#: usage is a few hundred bytes; parsing a 1 MiB event on the loop at every event is not).
MAX_READ_EVENT_BYTES = 64 << 10
#: The largest body of a generation or embedding call (a 128k-token context is under
#: 1 MiB of text); only an upload (``POST files``) may send up to ``max_upload_mib``.
MAX_CALL_BYTES = 16 << 20
#: Texts one embedding call may carry, as OpenAI's API allows.
MAX_EMBEDDING_INPUTS = 2048
#: An embedding answer of more floats than this is made in a thread (about 1 MiB).
EMBEDDING_FLOATS_ON_LOOP = 1 << 16
#: The most context a card may claim for counting tokens (16M, past any model's): the
#: card is the endpoint owner's upload, as is the replica that reports the usage.
MAX_CONTEXT_TOKENS = 1 << 24


def body_limit(method: str, path: str, max_upload_mib: int) -> int:
    """The largest body the gateway takes for ``method path`` (``path`` after ``v1/``)."""
    if method == "POST" and path.strip("/") == "files":
        return max_upload_mib << 20
    return MAX_CALL_BYTES


#: Seconds one write to a caller may wait for it to read: a caller that stops reading a
#: stream (its window shut) would hold its stream slot and a replica's connection for
#: good. Past it the call ends as if the caller had gone.
WRITE_TIMEOUT_S = 60.0


class Reply(Protocol):
    """Where an answer goes: the front's response (aiohttp's or Tornado's)."""

    started: bool

    async def start(self, status: int, headers: dict[str, str]) -> None:
        """Send the status and headers."""

    async def write(self, data: bytes) -> None:
        """Send ``data`` now (a streamed answer's events are not held back)."""


def model_id(who, dep: dict) -> str:
    """How ``who`` names the endpoint: its name for their own, else owner/name."""
    return dep["name"] if dep["user"] == who.name else f"{dep['user']}/{dep['name']}"


def parse_body(body: bytes | None) -> dict:
    """The request's JSON object with a ``model``; 400 in OpenAI's shape if not."""
    try:
        text = (body or b"").decode("utf-8")
    except UnicodeDecodeError:
        raise OpenAIError(400, "the request body is not UTF-8; send JSON in UTF-8") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise OpenAIError(400, f"the request body is not JSON ({e}); send a JSON object") from None
    if not isinstance(doc, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model.strip():
        raise OpenAIError(
            400,
            'name the model: "model": "NAME" (your endpoint) or "OWNER/NAME" (one shared '
            "with you); GET /v1/models lists them",
            param="model",
        )
    return doc


def embedding_texts(doc: dict) -> list[str]:
    texts = doc.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise OpenAIError(
            400,
            "input must be a string or a non-empty list of strings (this endpoint embeds "
            "text, not token ids)",
            param="input",
        )
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise OpenAIError(
            400,
            f"input holds {len(texts)} texts, over the {MAX_EMBEDDING_INPUTS} one call "
            f"embeds; send them in batches of {MAX_EMBEDDING_INPUTS}",
            param="input",
        )
    return texts


def encode_embedding(row: list[float], fmt: str):
    if fmt == "float":
        return row
    packed = array.array("f", row)  # float32, as OpenAI's base64 carries them
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


class SseRelay:
    """Passes a replica's server-sent events on as they come, whole events only.
    Reads each event to time the tokens and take the usage; drops the usage chunk
    where the caller did not ask for it (``keep_usage`` False)."""

    def __init__(
        self, keep_usage: bool, started: float, on_gap: Callable[[float], None] | None = None
    ):
        self.keep_usage = keep_usage
        self.started = started
        #: Told each gap between two tokens as it happens (a stream may be endless:
        #: nothing is kept per token).
        self.on_gap = on_gap
        self._buf = bytearray()
        self.usage: dict | None = None
        self.content_chunks = 0
        self.first_token_s: float | None = None
        self._last: float | None = None

    def feed(self, data: bytes) -> bytes:
        """The whole events ``data`` completes, to send on; AnswerTooLarge when an
        event passes :data:`MAX_EVENT_BYTES` (the replica runs its owner's code)."""
        # What is held has no event end in it: look only where ``data`` could make one.
        start = max(0, len(self._buf) - 1)
        self._buf += data
        cut = self._buf.rfind(b"\n\n", start)
        if cut < 0:
            if len(self._buf) > MAX_EVENT_BYTES:
                raise AnswerTooLarge(MAX_EVENT_BYTES)
            return b""
        events = bytes(self._buf[:cut]).split(b"\n\n")
        del self._buf[: cut + 2]
        return b"".join(e + b"\n\n" for e in events if self._keep(e))

    def rest(self) -> bytes:
        """Whatever the replica sent after its last whole event."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    def _keep(self, event: bytes) -> bool:
        payload = event.strip()
        if not payload.startswith(b"data:"):
            return True  # a comment or another field: as it is
        payload = payload[5:].strip()
        if payload == b"[DONE]" or len(payload) > MAX_READ_EVENT_BYTES:
            return True  # passed on unread: a token or the usage is a small event
        try:
            chunk = json.loads(payload)
        except (ValueError, RecursionError):
            return True
        if not isinstance(chunk, dict):
            return True
        if chunk.get("usage") and not chunk.get("choices"):
            self.usage = chunk["usage"]
            return self.keep_usage
        if any(_has_text(c) for c in chunk.get("choices") or ()):
            now = time.monotonic()
            self.content_chunks += 1
            if self._last is None:
                self.first_token_s = now - self.started
            elif self.on_gap is not None:
                self.on_gap(now - self._last)
            self._last = now
        return True


def _usage_of(answer: bytes) -> dict | None:
    """The ``usage`` of a replica's whole (not streamed) answer, if it says one."""
    try:
        usage = json.loads(answer).get("usage")
    except (ValueError, AttributeError, RecursionError):
        return None
    return usage if isinstance(usage, dict) else None


def _adapters(card: dict) -> list[str]:
    """A language model's LoRA adapters, as its card names them (the upload checked them)."""
    adapters = card.get("adapters")
    return [a for a in adapters if isinstance(a, str)] if isinstance(adapters, list) else []


def _has_text(choice) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict) and delta.get("content"):
        return True
    return bool(choice.get("text"))


def token_caps(card: dict, doc: dict) -> tuple[int, int]:
    """The most prompt and completion tokens one call can use: the model's context
    (its card's ``max_model_len``) and the call's ``max_completion_tokens`` or
    ``max_tokens`` (as the replica reads them), else the context."""
    context = card.get("max_model_len")
    if type(context) is not int or not 1 <= context <= MAX_CONTEXT_TOKENS:
        context = MAX_CONTEXT_TOKENS
    asked = doc.get("max_completion_tokens")
    if asked is None:
        asked = doc.get("max_tokens")
    return context, asked if type(asked) is int and 1 <= asked <= context else context


def _tokens(n, cap: int) -> int:
    # type(), not isinstance(): true is not a count.
    return min(n, cap) if type(n) is int and n > 0 else 0


def _usage_counts(usage, caps: tuple[int, int]) -> tuple[int, int]:
    """A replica's usage as far as it can be true: the replica runs its owner's code,
    and the numbers go to the caller's token limit and usage rows. Whole numbers above
    0 only, at most ``caps`` (:func:`token_caps`); anything else counts 0."""
    if not isinstance(usage, dict):
        return 0, 0
    prompt_cap, completion_cap = caps
    return (
        _tokens(usage.get("prompt_tokens"), prompt_cap),
        _tokens(usage.get("completion_tokens"), completion_cap),
    )


class OpenAIGateway:
    """OpenAI's routes over ``calls`` (an :class:`~.calls.EndpointCalls`); ``meter``
    admits calls under the limits and counts their tokens."""

    def __init__(self, calls, meter: TokenMeter):
        self.calls = calls
        self.meter = meter
        #: version id -> the engine its replicas say serve it, and why (``%deploy --list``).
        self.engines: dict[str, str] = {}
        self._asking: set[str] = set()
        #: More routes under ``v1/``, each added by the part that answers them as it is
        #: built (the fine-tuning API: ``files``, ``fine_tuning/...``).
        self.more_routes: list = []

    def note_ready(self, dep: dict, unit, spawn) -> None:
        """A version has a replica ready: for a language model, ask it once which
        engine serves it (``spawn`` runs the question in the background)."""
        vid = unit.row["id"]
        if vid in self.engines or vid in self._asking:
            return
        if (self.calls.card(unit) or {}).get("kind") != CAUSAL_LM_KIND:
            return
        self._asking.add(vid)
        spawn(self._ask_engine(dep, unit))

    async def _ask_engine(self, dep: dict, unit) -> None:
        vid = unit.row["id"]
        try:
            for _, url in self.calls.ready(dep, unit)[:1]:
                answer = await self.calls.proxy.forward(
                    url, self.calls.token(unit), "GET", "v1/models", {}, None
                )
                if answer is not None and answer[0] == 200:
                    (model, *_) = json.loads(answer[3])["data"]
                    if isinstance(model.get("engine"), str):
                        self.engines[vid] = model["engine"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # asked again at its next check
        finally:
            self._asking.discard(vid)

    async def answer(
        self,
        who,
        method: str,
        path: str,
        body: bytes | None,
        reply: Reply,
        *,
        content_type: str = "",
        query: str = "",
    ) -> None:
        """Answer ``method path`` (``path`` after ``v1/``) for ``who`` on ``reply``;
        ``content_type`` and ``query`` matter to the fine-tuning API's routes."""
        try:
            routes = next((r for r in self.more_routes if r.handles(path.strip("/"))), None)
            if routes is not None:
                status, kind, data = await routes.answer(
                    who, method, path.strip("/"), query, body, content_type
                )
                if isinstance(data, FileAnswer):
                    await data.send(reply, status, kind)
                    return
                await reply.start(
                    status,
                    {
                        "Content-Type": kind,
                        "Cache-Control": "no-store",
                        "Content-Length": str(len(data)),
                    },
                )
                await reply.write(data)
                return
            await self._route(who, method, path.strip("/"), body, reply)
        except (OpenAIError, CallRefused) as e:
            if not isinstance(e, OpenAIError):
                e = OpenAIError(e.status, str(e), retry_after=e.retry_after)
            if not reply.started:
                await reply.start(e.status, e.headers())
                await reply.write(e.body())
            else:  # mid-stream: OpenAI's clients raise on an error event
                await reply.write(b"data: " + e.body() + b"\n\n")

    async def _route(self, who, method: str, path: str, body, reply: Reply) -> None:
        known = ("models", *GENERATION, "embeddings")
        if path not in known and not path.startswith("models/"):
            raise OpenAIError(
                404,
                f"no route /v1/{path}: the gateway answers GET /v1/models, POST "
                "/v1/chat/completions, /v1/completions and /v1/embeddings",
            )
        wanted = "GET" if path.startswith("models") else "POST"
        if method != wanted and not (method == "HEAD" and wanted == "GET"):
            raise OpenAIError(405, f"/v1/{path} answers {wanted}, not {method}")
        if path == "models":
            await self._json(reply, {"object": "list", "data": self.models(who)})
        elif path.startswith("models/"):
            wanted_id = path[len("models/") :]
            for m in self.models(who):
                if m["id"] == wanted_id:
                    await self._json(reply, m)
                    return
            raise model_not_found(wanted_id)
        else:
            # Up to MAX_CALL_BYTES of JSON: a large one parsed off the event loop.
            doc = await off_loop_if_large(body or b"", parse_body, body)
            if path == "embeddings":
                await self.embeddings(who, doc, reply)
            else:
                await self.generate(who, path, doc, reply)

    @staticmethod
    async def _json(reply: Reply, doc, status: int = 200) -> None:
        """``doc`` as JSON (bytes: written already)."""
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        await reply.start(
            status,
            {"Content-Type": JSON, "Cache-Control": "no-store", "Content-Length": str(len(data))},
        )
        await reply.write(data)

    # -- models ----------------------------------------------------------------------------
    def _card(self, dep: dict) -> dict:
        """The card of the endpoint's newest version with one ({} if none)."""
        try:
            units = self.calls.record(dep["id"]).by_version()
        except KeyError:
            return {}
        for unit in reversed(units):
            card = self.calls.card(unit)
            if card:
                return card
        return {}

    def models(self, who) -> list[dict]:
        out = []
        for dep in self.calls.endpoints():
            if not self.calls.can_use(who, dep):
                continue
            card = self._card(dep)
            kind = card.get("kind")
            if kind not in (CAUSAL_LM_KIND, EMBEDDING_KIND):
                continue  # tensor models: OIP v2 only
            created = dep.get("created")
            base = {
                "id": model_id(who, dep),
                "object": "model",
                "created": int(created.timestamp()) if hasattr(created, "timestamp") else 0,
                "owned_by": dep["user"],
                "kind": kind,
            }
            out.append(base)
            if kind == CAUSAL_LM_KIND:  # each LoRA adapter: a model of its own on the base
                out += [
                    {**base, "id": f"{base['id']}:{a}", "parent": base["id"]}
                    for a in self._served_adapters(dep)
                ]
        return sorted(out, key=lambda m: m["id"])

    def _served_adapters(self, dep: dict) -> list[str]:
        """The adapters some version taking calls has (what :meth:`_with_adapter` finds)."""
        try:
            units = self.calls.record(dep["id"]).units.values()
        except KeyError:
            return []
        return sorted({a for u in units if u.row["weight"] > 0 for a in self._adapters_of(u)})

    def resolve(self, who, model: str, kind: str) -> tuple[dict, object]:
        """The endpoint ``model`` names and the version the call goes to; 404 for one
        unknown or not shared with ``who``, 400 for one of another kind."""
        # NAME:ADAPTER is a LoRA adapter on endpoint NAME (endpoint names have no ':');
        # the replica selects it from the model string, which goes on unchanged.
        base, colon, adapter = model.strip().partition(":")
        owner, _, name = base.rpartition("/")
        owner = owner or who.name
        if not name or "/" in owner:
            raise model_not_found(model)
        try:
            dep = self.calls.callable_endpoint(who, owner, name)
        except CallRefused:
            raise model_not_found(model) from None
        unit = self.calls.choose(dep, who)
        if colon:
            unit = self._with_adapter(dep, unit, adapter)
            if unit is None:
                raise model_not_found(model)  # as unknown as a model that does not exist
        card = self.calls.card(unit) or {}
        have = card.get("kind") or "torch-export"
        if have != kind:
            what = "language model" if kind == CAUSAL_LM_KIND else "embedding model"
            how = (
                "%deploy MODEL --name NAME --tokenizer TOK"
                if kind == CAUSAL_LM_KIND
                else "%deploy a SentenceTransformer"
            )
            raise OpenAIError(
                400,
                f"the model `{model}` is a {have} endpoint, not a {what}; call it over OIP "
                f"v2 at endpoints/{dep['user']}/{dep['name']}/v2, or deploy a {what} ({how})",
                param="model",
                code="model_not_supported",
            )
        return dep, unit

    def _with_adapter(self, dep: dict, unit, adapter: str):
        """The version a call for ``adapter`` goes to: the one chosen by weight if it
        has the adapter, else the heaviest that has it (a canary saved without it must
        not turn some of the adapter's calls into 404s); None if no version has it."""
        if adapter in self._adapters_of(unit):
            return unit
        try:
            units = self.calls.record(dep["id"]).units.values()
        except KeyError:
            return None
        having = [u for u in units if adapter in self._adapters_of(u) and u.row["weight"] > 0]
        return max(having, key=lambda u: u.row["weight"]) if having else None

    def _adapters_of(self, unit) -> list[str]:
        card = self.calls.card(unit) or {}
        return _adapters(card) if card.get("kind") == CAUSAL_LM_KIND else []

    # -- generation ------------------------------------------------------------------------
    async def generate(self, who, path: str, doc: dict, reply: Reply) -> None:
        started = time.monotonic()
        model = doc["model"]
        dep, unit = self.resolve(who, model, GENERATION[path])
        caps = token_caps(self.calls.card(unit) or {}, doc)
        stream = doc.get("stream") is True
        wants_usage = False
        if stream:
            options = doc.get("stream_options")
            if options is not None and not isinstance(options, dict):
                raise OpenAIError(400, "stream_options must be an object", param="stream_options")
            options = dict(options or {})
            wants_usage = options.get("include_usage") is True
            # Always asked: the tokens of every call are counted.
            doc["stream_options"] = {**options, "include_usage": True}
        self.meter.check_rate(who)
        version = unit.row["version"]
        adapter = model.strip().partition(":")[2]  # counted by adapter (resolve checked it)
        with self.meter.stream_slot(who):
            body = json.dumps(doc).encode()
            headers = {"Content-Type": JSON}
            async with self.calls.open(
                dep, unit, "POST", f"v1/{path}", headers, body, who=who
            ) as resp:
                if resp.status != 200 or SSE not in resp.headers.get("Content-Type", ""):
                    try:
                        data = await read_answer(resp)
                    except AnswerTooLarge as e:
                        resp.close()
                        raise OpenAIError(502, str(e)) from None
                    if resp.status == 200:
                        usage = await off_loop_if_large(data, _usage_of, data)
                        self.meter.count(who, dep, version, *_usage_counts(usage, caps), adapter)
                    else:
                        data = await off_loop_if_large(data, as_openai, resp.status, data)
                    out = {"Content-Type": JSON, "Cache-Control": "no-store"}
                    if "Retry-After" in resp.headers:
                        out["Retry-After"] = resp.headers["Retry-After"]
                    await reply.start(resp.status, out)
                    await reply.write(data)
                    return
                await self._relay(
                    who, dep, version, resp, wants_usage, started, reply, caps, adapter=adapter
                )

    async def _relay(
        self,
        who,
        dep,
        version,
        resp,
        wants_usage,
        started,
        reply: Reply,
        caps: tuple[int, int],
        adapter: str = "",
    ) -> None:
        relay = SseRelay(
            keep_usage=wants_usage,
            started=started,
            on_gap=self.meter.itl.labels(dep["id"]).observe,
        )
        await reply.start(
            200, {"Content-Type": SSE, "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        try:
            async for data in resp.content.iter_any():
                events = relay.feed(data)
                if events:
                    await reply.write(events)
            rest = relay.rest()
            if rest.strip():
                await reply.write(rest)
        except AnswerTooLarge as e:
            resp.close()
            await reply.write(b"data: " + error_body(502, str(e)) + b"\n\n")
        finally:
            # Counted however the stream ended: a caller that went away used what the
            # replica generated until then (its usage never came: the chunks count).
            prompt, completion = _usage_counts(relay.usage, caps)
            if relay.usage is None:
                completion = min(relay.content_chunks, caps[1])
            self.meter.count(who, dep, version, prompt, completion, adapter)
            if relay.first_token_s is not None:
                self.meter.ttft.labels(dep["id"]).observe(relay.first_token_s)

    # -- embeddings ------------------------------------------------------------------------
    async def embeddings(self, who, doc: dict, reply: Reply) -> None:
        model = doc["model"]
        texts = embedding_texts(doc)
        fmt = doc.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise OpenAIError(
                400, "encoding_format must be float or base64", param="encoding_format"
            )
        dep, unit = self.resolve(who, model, EMBEDDING_KIND)
        self.meter.check_rate(who)
        with self.meter.stream_slot(who):  # a call in flight, as a generation is
            rows = await self.calls.embed_on(dep, unit, texts, who)
        dims = doc.get("dimensions")
        if dims is not None and rows and dims != len(rows[0]):
            raise OpenAIError(
                400,
                f"the model `{model}` gives {len(rows[0])} dimensions, not {dims}; "
                "leave dimensions out",
                param="dimensions",
            )
        # The embedding server does not report tokens: words count as its tokens.
        words = sum(len(t.split()) for t in texts)
        self.meter.count(who, dep, unit.row["version"], words, 0)

        def answer() -> bytes:
            doc = {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": encode_embedding(r, fmt)}
                    for i, r in enumerate(rows)
                ],
                "model": model,
                "usage": {"prompt_tokens": words, "total_tokens": words},
            }
            return json.dumps(doc).encode()

        # Up to 2048 rows of the replica's width: written in a thread when large.
        large = sum(len(r) for r in rows) > EMBEDDING_FLOATS_ON_LOOP
        await self._json(reply, await asyncio.to_thread(answer) if large else answer())
