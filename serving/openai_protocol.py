"""OpenAI's request and response shapes for chat and text completions.

Requests are checked here, before anything reaches the engine: every mistake is
an :class:`OpenAIError` (status, one-line message, the parameter at fault) that
the routes answer as ``{"error": {"message", "type", "param", "code"}}``.
Responses and stream chunks are built here too, so the routes only move them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

#: Roles a chat message may have (OpenAI's; "developer" is the new name of "system").
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4  # as OpenAI allows


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    @property
    def type(self) -> str:
        if self.status == 429:
            return "rate_limit_error" if self.code == "rate_limit" else "server_busy"
        if self.status >= 500:
            return "server_error"
        if self.status == 401:
            return "authentication_error"
        if self.status == 404:
            return "not_found_error"
        return "invalid_request_error"

    def body(self) -> dict:
        return {
            "error": {
                "message": str(self),
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Request:
    """A checked chat or completion request."""

    chat: bool
    model: str
    messages: list[dict] = field(default_factory=list)  # chat
    prompt: str | list[int] = ""  # completions: text or token ids
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def _number(body: dict, name: str, default, lo: float, hi: float, integer=False):
    value = body.get(name)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:
        what = "an integer" if integer else "a number"
        raise OpenAIError(
            400, f"'{name}' must be {what} from {lo:g} to {hi:g}; got {value!r}", name
        )
    return value


def _text(content, where: str) -> str:
    """A message's content: a string, or a list of text parts (the newer form)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise OpenAIError(
                    400,
                    f"{where}.content: only text parts ({{'type': 'text', 'text': ...}}) "
                    "are served; this model reads no images or audio",
                    "messages",
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise OpenAIError(400, f"{where}.content must be a string or a list of text parts", "messages")


def parse(raw: bytes, chat: bool) -> Request:
    """The request in ``raw`` (a JSON body), checked."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise OpenAIError(400, "the body is not UTF-8; send JSON encoded as UTF-8") from None
    except ValueError as exc:
        raise OpenAIError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "'model' is required: the name of the model to call", "model")
    req = Request(chat=chat, model=model)
    if chat:
        req.messages = _messages(body.get("messages"))
    else:
        req.prompt = _prompt(body.get("prompt"))
    n = body.get("n", 1)
    if n != 1:
        raise OpenAIError(400, f"'n' must be 1 (one choice per request); got {n!r}", "n")
    for unsupported in ("logprobs", "echo", "tools", "best_of"):
        value = body.get(unsupported)
        if value not in (None, False, [], 1 if unsupported == "best_of" else None):
            raise OpenAIError(
                400, f"'{unsupported}' is not supported by this server; leave it out", unsupported
            )
    limit = body.get("max_completion_tokens")
    name = "max_completion_tokens"
    if limit is None:
        limit, name = body.get("max_tokens"), "max_tokens"
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise OpenAIError(400, f"'{name}' must be an integer >= 1; got {limit!r}", name)
    req.max_tokens = limit
    req.temperature = float(_number(body, "temperature", 1.0, 0, 2))
    req.top_p = float(_number(body, "top_p", 1.0, 0, 1))
    if req.top_p == 0:
        req.temperature = 0.0  # nothing but the likeliest token
    req.seed = _number(body, "seed", None, -(2**63), 2**63 - 1, integer=True)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise OpenAIError(
            400, f"'stop' must be a string or up to {MAX_STOP} non-empty strings", "stop"
        )
    req.stop = stop or []
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError(400, "'stream' must be true or false", "stream")
    req.stream = stream
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise OpenAIError(400, "'stream_options' must be an object", "stream_options")
        req.include_usage = bool(options.get("include_usage"))
    return req


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(
            400, "'messages' must be a non-empty list of {'role': ..., 'content': ...}", "messages"
        )
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise OpenAIError(
                400, f"{where} must be an object with 'role' and 'content'", "messages"
            )
        role = m.get("role")
        if role not in ROLES:
            raise OpenAIError(
                400, f"{where}.role {role!r} is unknown; use one of {', '.join(ROLES)}", "messages"
            )
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _text(m.get("content"), where),
            }
        )
    return out


def _prompt(prompt) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # one prompt in a list, as the SDK may send it
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return prompt
    raise OpenAIError(
        400,
        "'prompt' must be a non-empty string (or one list of token ids); one prompt per request",
        "prompt",
    )


class Answer:
    """The ids, timestamps and shapes of one answer (a response or its chunks)."""

    def __init__(self, req: Request):
        self.req = req
        self.id = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if req.chat else "text_completion"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _head(self, obj: str, choices: list) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.req.model,
            "choices": choices,
        }

    def response(self, text: str, finish: str, usage: dict) -> dict:
        if self.req.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(finish_reason=finish, logprobs=None)
        return {**self._head(self.object, [choice]), "usage": usage}

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        if self.req.chat:
            delta = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta}
            obj = "chat.completion.chunk"
        else:
            choice, obj = {"index": 0, "text": text or ""}, "text_completion"
        choice.update(finish_reason=finish, logprobs=None)
        return self._head(obj, [choice])

    def usage_chunk(self, usage: dict) -> dict:
        obj = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {**self._head(obj, []), "usage": usage}
