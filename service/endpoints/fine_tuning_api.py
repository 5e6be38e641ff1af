"""The fine-tuning API's routes under the gateway (``<hub>/services/gpulab/v1``),
in OpenAI's shapes, so the ``openai`` package's ``files`` and ``fine_tuning.jobs``
work unchanged:

    POST   files                          multipart: file (JSONL), purpose=fine-tune
    GET    files, files/{id}, files/{id}/content
    DELETE files/{id}
    POST   fine_tuning/jobs               {model, training_file, hyperparameters, suffix}
    GET    fine_tuning/jobs, fine_tuning/jobs/{id}, fine_tuning/jobs/{id}/events
    POST   fine_tuning/jobs/{id}/cancel

Lists take ``limit`` and ``after`` (an id: what comes after it), newest first;
admins and the service also ``user`` (whose files or jobs). ``POST
fine_tuning/jobs/{id}/cancel?remove=1`` (admins and the service: a hub user being
removed) cancels the job if it runs and removes it.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

from gpulab.service.endpoints.file_answer import FileAnswer
from gpulab.service.endpoints.fine_tuning import FineTuning, job_object
from gpulab.service.endpoints.fine_tuning_files import file_object, parse_upload
from gpulab.service.endpoints.openai_errors import OpenAIError

#: The first part of the paths this answers (after ``v1/``).
PREFIXES = ("files", "fine_tuning")
MAX_LIMIT = 1000
#: How deep a request body's arrays and objects may nest (as the service's own routes
#: take them: ``gpulab.service.api.request_body.MAX_NESTING``).
MAX_NESTING = 64


def _page(items: list[dict], query: dict, default: int = 20, most: int = MAX_LIMIT) -> dict:
    """``items`` (newest first) from after ``after``, at most ``limit`` of them."""
    raw = (query.get("limit") or [str(default)])[0]
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise OpenAIError(400, f"limit must be from 1 to {most}", param="limit")
    after = (query.get("after") or [None])[0]
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    limit = int(raw)
    return {"object": "list", "data": items[:limit], "has_more": len(items) > limit}


def _too_deep(value) -> bool:
    """Whether ``value`` nests arrays and objects more than MAX_NESTING deep (walked
    without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        items = v.values() if isinstance(v, dict) else v
        inner = [x for x in items if isinstance(x, (dict, list))]
        if inner and depth >= MAX_NESTING:
            return True
        stack.extend((x, depth + 1) for x in inner)
    return False


def _json_body(body: bytes | None) -> dict:
    try:
        doc = json.loads((body or b"").decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise OpenAIError(400, "the request body must be a JSON object in UTF-8") from None
    except RecursionError:
        raise OpenAIError(
            400, f"the request body nests arrays and objects more than {MAX_NESTING} deep"
        ) from None
    if not isinstance(doc, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    if _too_deep(doc):
        raise OpenAIError(
            400, f"the request body nests arrays and objects more than {MAX_NESTING} deep"
        )
    return doc


def _user(query: dict) -> str | None:
    """``?user=``: whose files or jobs a listing is of (admins and the service)."""
    return (query.get("user") or [None])[0]


class FineTuningRoutes:
    """Answers the paths :meth:`handles` claims, for the gateway; returns
    ``(status, content type, bytes)``."""

    def __init__(self, fine_tuning: FineTuning, gateway):
        self.ft = fine_tuning
        # The one way back: these routes are added to the gateway as they are built.
        gateway.more_routes.append(self)

    @staticmethod
    def handles(path: str) -> bool:
        """Whether ``path`` (after ``v1/``) is one of these routes."""
        return path.split("/", 1)[0] in PREFIXES

    async def answer(
        self, who, method: str, path: str, query: str, body, content_type: str
    ) -> tuple[int, str, bytes]:
        parts = path.strip("/").split("/")
        q = parse_qs(query or "")
        if parts[0] == "files":
            return await self._files(who, method, parts[1:], q, body, content_type)
        if parts[:2] == ["fine_tuning", "jobs"]:
            return await self._jobs(who, method, parts[2:], q, body)
        raise self._no_route(path)

    @staticmethod
    def _no_route(path: str) -> OpenAIError:
        return OpenAIError(
            404,
            f"no route /v1/{path}: the fine-tuning API answers /v1/files and /v1/fine_tuning/jobs",
        )

    @staticmethod
    def _method(method: str, allowed: str, path: str) -> None:
        if method != allowed and not (method == "HEAD" and allowed == "GET"):
            raise OpenAIError(405, f"/v1/{path} answers {allowed}, not {method}")

    @staticmethod
    def _ok(doc, status: int = 200) -> tuple[int, str, bytes]:
        return status, "application/json", json.dumps(doc).encode()

    async def _files(self, who, method, rest, q, body, content_type):
        files = self.ft.files
        if not rest:
            if method == "POST":
                # A user over their quota is told so before the body is parsed; parsed
                # off the event loop (a body may be as large as max_upload_mib).
                await asyncio.to_thread(files.check_upload, who, len(body or b""))
                upload, purpose = await asyncio.to_thread(parse_upload, body, content_type)
                row = await asyncio.to_thread(files.create, who, upload, purpose)
                return self._ok(file_object(row))
            self._method(method, "GET", "files")
            rows = await asyncio.to_thread(files.list, who, _user(q))
            return self._ok(_page([file_object(r) for r in rows], q, 10000, 10000))
        fid = rest[0]
        if len(rest) == 1:
            if method == "DELETE":
                files.delete(who, fid)
                return self._ok({"id": fid, "object": "file", "deleted": True})
            self._method(method, "GET", f"files/{fid}")
            return self._ok(file_object(files.get(who, fid)))
        if rest[1:] == ["content"]:
            self._method(method, "GET", f"files/{fid}/content")
            row = await asyncio.to_thread(files.get, who, fid)
            # Sent a chunk at a time: a file may be as large as its owner's quota.
            return 200, "application/jsonl", FileAnswer(files.path(row["id"]), f"no file {fid}")
        raise self._no_route("files/" + "/".join(rest))

    async def _jobs(self, who, method, rest, q, body):
        ft = self.ft
        if not rest:
            if method == "POST":
                return self._ok(await ft.create(who, _json_body(body)))
            self._method(method, "GET", "fine_tuning/jobs")
            rows = await asyncio.to_thread(ft.list, who, _user(q))
            return self._ok(_page([job_object(r) for r in rows], q))
        ft_id = rest[0]
        where = f"fine_tuning/jobs/{ft_id}"
        if len(rest) == 1:
            self._method(method, "GET", where)
            return self._ok(job_object(await asyncio.to_thread(ft.get, who, ft_id)))
        if rest[1:] == ["events"]:
            self._method(method, "GET", f"{where}/events")
            # Up to 8 MiB of the job's metrics are read: in a thread.
            row = await asyncio.to_thread(ft.get, who, ft_id)
            events = await asyncio.to_thread(ft.events, row)
            return self._ok(_page(events[::-1], q))
        if rest[1:] == ["cancel"]:
            self._method(method, "POST", f"{where}/cancel")
            if (q.get("remove") or [""])[0] in ("1", "true"):
                await ft.remove(who, ft_id)
                return self._ok({"id": ft_id, "object": "fine_tuning.job", "deleted": True})
            return self._ok(job_object(await ft.cancel(who, ft_id)))
        raise self._no_route("/".join(["fine_tuning", "jobs", *rest]))
