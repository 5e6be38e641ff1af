"""Errors in OpenAI's shape, for the gateway (:mod:`.openai_gateway`).

OpenAI's clients (the ``openai`` package, LangChain, LiteLLM...) read an error as
``{"error": {"message", "type", "param", "code"}}`` and pick the exception by the
status (400 ``BadRequestError``, 404 ``NotFoundError``, 429 ``RateLimitError``...),
so the gateway answers every refusal this way, never gpulab's ``{"error": "..."}``.
"""

from __future__ import annotations

import json

#: The ``type`` OpenAI gives each status.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIError(Exception):
    """A refusal: the status, a one-line message, and OpenAI's ``param``/``code``;
    ``retry_after`` (seconds) goes out as ``Retry-After``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> bytes:
        return error_body(self.status, str(self), param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json", "Cache-Control": "no-store"}
        if self.retry_after is not None:
            out["Retry-After"] = str(self.retry_after)
        return out


def error_type(status: int) -> str:
    if status in TYPES:
        return TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    ).encode()


def model_not_found(model: str) -> OpenAIError:
    """404 for a model that does not exist and one the caller may not use alike: a
    stranger is not told which endpoints exist."""
    return OpenAIError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def as_openai(status: int, data: bytes) -> bytes:
    """A replica's or gpulab's error body in OpenAI's shape (kept if it already is)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        return data
    message = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(message, str):
        message = data.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    return error_body(status, message)
