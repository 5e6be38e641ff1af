"""``<hub>/services/gpulab/v1/...``: the OpenAI-compatible gateway on the service's
own routes.

Calls with a token reach the endpoint router first where the hub's proxy routes
``<prefix>v1`` to it (:mod:`gpulab.service.endpoints.router`); this route answers the
rest (no router configured, a browser's hub cookie) with the same gateway
(:class:`~gpulab.service.endpoints.openai_gateway.OpenAIGateway`): the hub token
(``Bearer`` or ``token``) says who calls, refusals are in OpenAI's shape, streamed
answers are flushed event by event, and a caller that goes away ends its call (and
frees its stream slot) at once.
"""

from __future__ import annotations

import asyncio
import contextlib

from tornado import iostream, web

from gpulab.service.auth import APIHandler
from gpulab.service.endpoints import openai_gateway
from gpulab.service.endpoints.openai_errors import error_body
from gpulab.service.endpoints.openai_gateway import MAX_CALL_BYTES, body_limit


class TornadoReply:
    """A :class:`~gpulab.service.endpoints.openai_gateway.Reply` on a Tornado handler."""

    def __init__(self, handler: web.RequestHandler):
        self.handler = handler
        self.started = False

    async def start(self, status: int, headers: dict[str, str]) -> None:
        self.started = True
        self.handler.set_status(status)
        for k, v in headers.items():
            if k != "Content-Length":  # Tornado counts what is written
                self.handler.set_header(k, v)

    async def write(self, data: bytes) -> None:
        self.handler.write(data)
        try:
            await asyncio.wait_for(self.handler.flush(), openai_gateway.WRITE_TIMEOUT_S)
        except TimeoutError:
            self.handler.request.connection.close()  # a caller that does not read: gone
            raise iostream.StreamClosedError() from None


class _OpenAIHandler(APIHandler):
    #: The gateway's path after ``v1/``.
    path = ""

    def body_limit(self) -> int:
        return body_limit(self.request.method, self.path, self.gpulab.max_upload_mib)

    @property
    def body_setting(self) -> str:
        """The setting a 413 names: only an upload's limit is one."""
        return "max_upload_mib" if self.body_limit() > MAX_CALL_BYTES else ""

    def changes_state(self) -> bool:
        return False  # a call reads: its token may be a cached answer

    async def _answer(self, path: str) -> None:
        who = self.require_identity()
        manager = self.gpulab.deployments
        if manager is None:
            raise web.HTTPError(503, "the gpulab service is still starting; try again")
        body = self.raw_body() if self.request.method == "POST" else None
        reply = TornadoReply(self)
        # Its own task, so a caller that goes away cancels it (on_connection_close).
        self._call = asyncio.ensure_future(
            manager.gateway.answer(
                who,
                self.request.method,
                path,
                body,
                reply,
                content_type=self.request.headers.get("Content-Type", ""),
                query=self.request.query,
            )
        )
        try:
            await self._call
        except (asyncio.CancelledError, iostream.StreamClosedError):
            return  # the caller went away: nobody to answer
        if not self._finished:
            with contextlib.suppress(iostream.StreamClosedError):
                self.finish()

    def on_connection_close(self):
        call = getattr(self, "_call", None)
        if call is not None:
            call.cancel()
        super().on_connection_close()

    def write_error(self, status_code: int, **kwargs) -> None:
        """gpulab's refusals (no token, a body over the limit) in OpenAI's shape."""
        self.set_allow(status_code)
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args  # stored %-escaped without args
        elif status_code >= 500:
            message = "internal error in the gpulab service; see its log"
        self.set_header("Content-Type", "application/json")
        self.finish(error_body(status_code, message))


class ModelsHandler(_OpenAIHandler):
    """``GET v1/models``, ``GET v1/models/{model}``."""

    async def get(self, model: str | None = None):
        await self._answer("models" if model is None else f"models/{model}")


class _PostHandler(_OpenAIHandler):
    async def post(self):
        await self._answer(self.path)


class ChatHandler(_PostHandler):
    path = "chat/completions"


class CompletionsHandler(_PostHandler):
    path = "completions"


class EmbeddingsHandler(_PostHandler):
    path = "embeddings"


class _FineTuningHandler(_OpenAIHandler):
    """The fine-tuning API (:mod:`gpulab.service.endpoints.fine_tuning_api`): ``path``
    with the route's ids put in."""

    def changes_state(self) -> bool:
        return self.request.method != "GET"  # an upload, a job, a cancel: asked of the hub

    async def _here(self, *ids: str) -> None:
        await self._answer(self.path.format(*ids))


class FilesHandler(_FineTuningHandler):
    """``GET v1/files``, ``POST v1/files`` (multipart: file, purpose=fine-tune)."""

    path = "files"

    async def get(self):
        await self._here()

    async def post(self):
        await self._here()


class FileHandler(_FineTuningHandler):
    """``GET``, ``DELETE v1/files/{id}``."""

    path = "files/{}"

    async def get(self, fid: str):
        await self._here(fid)

    async def delete(self, fid: str):
        await self._here(fid)


class FileContentHandler(_FineTuningHandler):
    path = "files/{}/content"

    async def get(self, fid: str):
        await self._here(fid)


class FineTuningJobsHandler(_FineTuningHandler):
    path = "fine_tuning/jobs"

    async def get(self):
        await self._here()

    async def post(self):
        await self._here()


class FineTuningJobHandler(_FineTuningHandler):
    path = "fine_tuning/jobs/{}"

    async def get(self, ft_id: str):
        await self._here(ft_id)


class FineTuningEventsHandler(_FineTuningHandler):
    path = "fine_tuning/jobs/{}/events"

    async def get(self, ft_id: str):
        await self._here(ft_id)


class FineTuningCancelHandler(_FineTuningHandler):
    path = "fine_tuning/jobs/{}/cancel"

    async def post(self, ft_id: str):
        await self._here(ft_id)


routes = [
    (r"v1/models", ModelsHandler),
    (r"v1/models/(.+)", ModelsHandler),
    (r"v1/chat/completions", ChatHandler),
    (r"v1/completions", CompletionsHandler),
    (r"v1/embeddings", EmbeddingsHandler),
    (r"v1/files", FilesHandler),
    (r"v1/files/([^/]+)", FileHandler),
    (r"v1/files/([^/]+)/content", FileContentHandler),
    (r"v1/fine_tuning/jobs", FineTuningJobsHandler),
    (r"v1/fine_tuning/jobs/([^/]+)", FineTuningJobHandler),
    (r"v1/fine_tuning/jobs/([^/]+)/events", FineTuningEventsHandler),
    (r"v1/fine_tuning/jobs/([^/]+)/cancel", FineTuningCancelHandler),
]
