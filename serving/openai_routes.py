"""The OpenAI routes of a replica serving a causal language model (card kind ``causal-lm``).

    GET  /v1/models             the model this replica serves
    POST /v1/chat/completions   the tokenizer's chat template, then generation
    POST /v1/completions        a text prompt (or token ids), then generation

``stream: true`` answers Server-Sent Events (``data: {chunk}`` ... ``data:
[DONE]``), with a last chunk carrying ``usage`` when ``stream_options.include_usage``
asks for it; other answers always carry ``usage``. Errors have OpenAI's shape
(:mod:`.openai_protocol`): 400 for bad input (the context limit named), 429 when
every slot and the waiting line are taken, 503 while the model loads. A client
that goes away mid-answer cancels its sequence: the engine frees the slot at its
next step. The health routes, the token check and ``/metrics`` are the model
server's own (:mod:`.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time

import tornado.web
from prometheus_client import Gauge
from tornado.iostream import StreamClosedError

from .llm_engine import Engine, EngineStopped, QueueFull, SamplingParams
from .metrics import ServingMetrics
from .openai_protocol import Answer, OpenAIError, Request, parse

#: Characters of prompt text per token of the context that a request may send. No
#: tokenizer makes a token of more than a few dozen characters, so a longer text is
#: over the context anyway; refused before the tokenizer (and the chat template) run
#: on the event loop over a body of up to 16 MiB.
CHARS_PER_TOKEN = 32


class LlmServer:
    """A causal LM behind an engine; what the routes and the health checks read."""

    def __init__(self, model, tokenizer, card: dict, engine: Engine, *, token: str = ""):
        self.model, self.tokenizer, self.card = model, tokenizer, card
        self.name = card.get("name", "llm")
        self.engine = engine
        self.token = token
        self.ready = False
        self.max_model_len = int(card["max_model_len"])
        self.max_prompt_chars = self.max_model_len * CHARS_PER_TOKEN
        self.metrics = ServingMetrics()
        self.metrics.track_queue(self.name, lambda: engine.load)
        Gauge(
            "gpulab_serving_generated_tokens",
            "Tokens the engine made since the server started (all requests)",
            ["model"],
            registry=self.metrics.registry,
        ).labels(model=self.name).set_function(lambda: engine.tokens_made)
        eos = {tokenizer.eos_token_id}
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(config_eos) if isinstance(config_eos, list) else {config_eos}
        self.stop_token_ids = tuple(t for t in eos if t is not None)

    @property
    def card_name(self) -> str:
        return self.name

    def start(self) -> None:
        # The engine started before the warm-up (load_llm_server); now requests come.
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        await asyncio.to_thread(self.engine.stop)

    async def warm_up(self) -> None:
        """One short generation, so the first request does not pay for lazy setup."""
        params = SamplingParams(max_tokens=2, temperature=0)
        async for _ in self.engine.generate(self.tokenizer("warm up").input_ids or [0], params):
            pass

    def routes(self) -> list:
        args = {"server": self}
        return [
            (r"/v1/models/?", ModelsHandler, args),
            (r"/v1/chat/completions/?", CompletionHandler, {**args, "chat": True}),
            (r"/v1/completions/?", CompletionHandler, {**args, "chat": False}),
        ]

    # -- from a request to token ids ------------------------------------------------
    def prompt_ids(self, req: Request) -> list[int]:
        tok = self.tokenizer
        if not req.chat:
            if isinstance(req.prompt, list):
                if max(req.prompt) >= len(tok):
                    raise OpenAIError(400, f"token ids must be below {len(tok)}", "prompt")
                return req.prompt
            self._check_chars(len(req.prompt), "prompt")
            return tok(req.prompt).input_ids
        if not getattr(tok, "chat_template", None):
            raise OpenAIError(
                400,
                f"{self.name!r} has no chat template; call /v1/completions with a prompt, "
                "or deploy a tokenizer that has one",
                "messages",
            )
        self._check_chars(sum(len(m["content"]) for m in req.messages), "messages")
        try:
            text = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # the template refused the conversation (its raise_exception)
            raise OpenAIError(
                400, f"the chat template refused the messages: {exc}", "messages"
            ) from None
        self._check_chars(len(text), "messages")  # a template may repeat what it is given
        # The template wrote the special tokens it wants; the tokenizer adds none.
        return tok(text, add_special_tokens=False).input_ids

    def _check_chars(self, chars: int, param: str) -> None:
        if chars > self.max_prompt_chars:
            raise OpenAIError(
                400,
                f"the prompt text is {chars} characters, over the {self.max_prompt_chars} "
                f"this model reads ({CHARS_PER_TOKEN} per token of its "
                f"{self.max_model_len}-token context); shorten it",
                param,
                "context_length_exceeded",
            )

    def adapter_of(self, model: str) -> str | None:
        """The LoRA adapter a request's ``model`` names: ``NAME:ADAPTER`` (any prefix
        before the colon: ``alice/chat:sql``) or an adapter's own name as the last
        part (``alice/sql``); None: the base model."""
        adapters = self.card.get("adapters") or []
        if ":" in model:
            adapter = model.rsplit(":", 1)[1]
            if adapter not in adapters:
                have = "adapters " + ", ".join(adapters) if adapters else "no adapters"
                raise OpenAIError(
                    404,
                    f"The model `{model}` does not exist: {self.name!r} has {have}",
                    "model",
                    "model_not_found",
                )
            return adapter
        last = model.rsplit("/", 1)[-1]
        return last if last in adapters else None

    def sampling(self, req: Request, prompt_len: int) -> SamplingParams:
        room = self.max_model_len - prompt_len
        if room < 1:
            raise OpenAIError(
                400,
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {prompt_len}: shorten it",
                "messages" if req.chat else "prompt",
                "context_length_exceeded",
            )
        if req.max_tokens is not None and req.max_tokens > room:
            raise OpenAIError(
                400,
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {prompt_len} and max_tokens asks for {req.max_tokens}: lower max_tokens "
                f"to {room} or less",
                "max_tokens",
                "context_length_exceeded",
            )
        return SamplingParams(
            adapter=self.adapter_of(req.model),
            max_tokens=req.max_tokens or room,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop_token_ids=self.stop_token_ids,
        )


class TextStream:
    """Token ids in, text out as it becomes final: an unfinished UTF-8 character
    and anything that may be the start of a stop string are held back.

    Each token decodes a short window (from the token before the last emitted
    one), not the whole answer again, as text-generation-inference does: the diff
    between the window with and without the new tokens is the new text, so
    tokenizers that drop a leading space at the start of a decode stay right.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far
        self.sent = 0  # characters of it already given out
        self.prefix = self.read = 0  # the window: ids[prefix:read] is decoded
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # a character split across tokens: wait for the rest
        searched = max(0, len(self.text) - self.hold)
        self.text += after[len(before) :]
        self.prefix, self.read = self.read, len(self.ids)
        for s in self.stop:
            at = self.text.find(s, searched)
            if at != -1:
                self.stopped = True
                return self._take(at)
        return self._take(max(self.sent, len(self.text) - self.hold))

    def flush(self) -> str:
        return "" if self.stopped else self._take(len(self.text))

    def _take(self, end: int) -> str:
        new = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return new


class OpenAIHandler(tornado.web.RequestHandler):
    def initialize(self, server: LlmServer, chat: bool = False) -> None:
        self.server, self.chat = server, chat

    def prepare(self) -> None:
        token = self.server.token
        sent = self.request.headers.get("Authorization", "")
        if token and not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            self.fail(
                OpenAIError(
                    401,
                    "this model server is reached through the gpulab service's "
                    "endpoint URL, with a hub token",
                )
            )

    def fail(self, error: OpenAIError) -> None:
        self.set_status(error.status)
        if error.status == 429:
            self.set_header("Retry-After", "1")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error.body()))

    def write_error(self, status_code: int, **kwargs) -> None:
        self.fail(OpenAIError(status_code, self._reason))


class ModelsHandler(OpenAIHandler):
    def get(self) -> None:
        card = self.server.card
        self.finish(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.server.name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "gpulab",
                        "max_model_len": self.server.max_model_len,
                        "max_num_seqs": self.server.engine.max_num_seqs,
                        "engine": self.server.engine.reason,  # what serves, and why
                    }
                ]
                + [
                    {
                        "id": f"{self.server.name}:{a}",
                        "object": "model",
                        "created": 0,
                        "owned_by": "gpulab",
                        "parent": self.server.name,
                    }
                    for a in card.get("adapters", [])
                ],
            }
        )


class CompletionHandler(OpenAIHandler):
    _task: asyncio.Task | None = None

    def on_connection_close(self) -> None:
        # The client went away: stop generating for it (the slot frees at the next step).
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def post(self) -> None:
        server = self.server
        started = time.perf_counter()
        status = 200
        self._task = asyncio.current_task()
        try:
            if not server.ready:
                raise OpenAIError(503, "the model is loading; retry shortly")
            req = parse(self.request.body, self.chat)
            prompt = server.prompt_ids(req)
            params = server.sampling(req, len(prompt))
            engine = server.engine
            if engine.load >= engine.max_num_seqs + engine.max_queue:
                raise OpenAIError(
                    429,
                    f"{engine.max_num_seqs} sequences are generating and {engine.max_queue} "
                    "wait; retry shortly",
                    code="server_busy",
                )
            answer = Answer(req)
            if req.stream:
                await self._stream(req, answer, prompt, params)
            else:
                await self._whole(req, answer, prompt, params)
        except OpenAIError as exc:
            status = exc.status
            if not self._finished:
                self.fail(exc)
        except asyncio.CancelledError:
            status = 499  # the client closed the connection
        finally:
            server.metrics.requests.labels(model=server.name, code=str(status)).inc()
            server.metrics.duration.labels(model=server.name).observe(time.perf_counter() - started)

    async def _tokens(self, prompt, params):
        try:
            async with contextlib.aclosing(self.server.engine.generate(prompt, params)) as tokens:
                async for t in tokens:
                    yield t
        except QueueFull as exc:
            raise OpenAIError(429, str(exc), code="server_busy") from None
        except EngineStopped as exc:
            raise OpenAIError(503, str(exc)) from None

    async def _whole(self, req, answer, prompt, params) -> None:
        text, count = TextStream(self.server.tokenizer, req.stop), 0
        out = []
        async with contextlib.aclosing(self._tokens(prompt, params)) as tokens:
            async for t in tokens:
                count += 1
                out.append(text.push(t))
                if text.stopped:
                    break
        out.append(text.flush())
        finish = "length" if count >= params.max_tokens and not text.stopped else "stop"
        self.finish(answer.response("".join(out), finish, answer.usage(len(prompt), count)))

    async def _stream(self, req, answer, prompt, params) -> None:
        text, count = TextStream(self.server.tokenizer, req.stop), 0
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")
        try:
            if req.chat:
                await self._send(answer.chunk(role=True))
            async with contextlib.aclosing(self._tokens(prompt, params)) as tokens:
                async for t in tokens:
                    count += 1
                    piece = text.push(t)
                    if piece:
                        await self._send(answer.chunk(piece))
                    if text.stopped:
                        break
            rest = text.flush()
            if rest:
                await self._send(answer.chunk(rest))
            finish = "length" if count >= params.max_tokens and not text.stopped else "stop"
            await self._send(answer.chunk(None if req.chat else "", finish))
            if req.include_usage:
                await self._send(answer.usage_chunk(answer.usage(len(prompt), count)))
        except OpenAIError as exc:  # the headers are out: the error travels as an event
            await self._send(exc.body())
        except StreamClosedError:
            return
        self.write("data: [DONE]\n\n")
        self.finish()

    async def _send(self, doc: dict) -> None:
        self.write(f"data: {json.dumps(doc)}\n\n")
        await self.flush()
