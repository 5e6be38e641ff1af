"""Calls from this single-user server to the gpulab service, on the browser's behalf.

The request carries this server's hub token (``JUPYTERHUB_API_TOKEN``) as
``Authorization: token ...``, exactly as ``gpulab.client`` does in a kernel, so the
service decides what the user may see; nothing of the browser's request (cookies,
its own ``Authorization``) is passed on.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.client.tls import client_context

#: One path segment the proxy passes on: no empty, ``.`` or ``..`` segments, so a
#: request cannot climb out of the service's ``/api/v1/``.
_SEGMENT = re.compile(r"[A-Za-z0-9_~:@!$'()*+,;=-][A-Za-z0-9._~:@!$'()*+,;=-]*")

HUB_DOWN_HINT = "is the hub running?"


class ServiceError(Exception):
    """The call got no answer from the service: ``status`` (502/504) and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes

    def json(self):
        return json.loads(self.body)


def service_address(env: dict[str, str] | None = None) -> tuple[str, str]:
    """(API URL, token) from this server's environment, or ('', '') when not set."""
    env = os.environ if env is None else env
    return (env.get("GPULAB_API_URL") or "").rstrip("/"), env.get("JUPYTERHUB_API_TOKEN") or ""


def endpoints_path(api: str) -> str:
    """The service's endpoint front (``<service>/endpoints``), beside its ``/api/v1``."""
    return api[: -len("/api/v1")] + "/endpoints" if api.endswith("/api/v1") else ""


def gateway_path(api: str) -> str:
    """The service's OpenAI-compatible gateway (``<service>/v1``), beside its ``/api/v1``."""
    return api[: -len("/api/v1")] + "/v1" if api.endswith("/api/v1") else ""


def safe_path(path: str) -> str | None:
    """``path`` re-quoted segment by segment, or None if a segment is not plain."""
    parts = path.split("/")
    if not path or not all(_SEGMENT.fullmatch(p) for p in parts):
        return None
    return "/".join(quote(p, safe="~:@!$'()*+,;=-") for p in parts)


def error_text(body: bytes, reason: str) -> str:
    """The service's ``{"error": ...}``, else the start of what it answered."""
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:300].decode(errors="replace").strip() or reason


async def call_service(
    method: str,
    path: str,
    query: str = "",
    body: bytes | None = None,
    *,
    connect_timeout: float = 5.0,
    request_timeout: float = 30.0,
    env: dict[str, str] | None = None,
    endpoint: bool = False,
    gateway: bool = False,
) -> Answer:
    """``method`` ``<GPULAB_API_URL>/<path>?<query>`` (with ``endpoint``: a call to an
    endpoint, ``<service>/endpoints/<path>``; with ``gateway``: to the OpenAI-compatible
    gateway, ``<service>/v1/<path>``); raises :class:`ServiceError` when the
    service gives no answer (down, unreachable, too slow)."""
    api, token = service_address(env)
    if not api or not token:
        raise ServiceError(
            502,
            "this server was not started by gpulab: GPULAB_API_URL and "
            "JUPYTERHUB_API_TOKEN are not set",
        )
    base = gateway_path(api) if gateway else endpoints_path(api) if endpoint else api
    if not base:
        raise ServiceError(502, f"GPULAB_API_URL {api} does not end in /api/v1")
    url = f"{base}/{path}" + (f"?{query}" if query else "")
    headers = {"Authorization": f"token {token}", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = HTTPRequest(
        url,
        method=method,
        headers=headers,
        body=body if method in ("POST", "PUT", "PATCH") else None,
        allow_nonstandard_methods=True,
        connect_timeout=connect_timeout,
        request_timeout=request_timeout,
        follow_redirects=False,
        # gpulab up --tls self-signed: the hub's CA is in GPULAB_CA_FILE.
        ssl_options=client_context() if url.startswith("https:") else None,
    )
    try:
        r = await AsyncHTTPClient().fetch(request, raise_error=False)
    except HTTPClientError as e:  # 599: tornado's timeouts
        if "Timeout" in str(e):
            raise ServiceError(
                504,
                f"gpulab service at {api} did not answer within {request_timeout:g} s — "
                f"it may be overloaded; try again",
            ) from e
        raise ServiceError(
            502, f"gpulab service unreachable at {api}: {e} — {HUB_DOWN_HINT}"
        ) from e
    except OSError as e:  # refused, reset, no route, no such host
        detail = e.strerror or type(e).__name__
        raise ServiceError(
            502, f"gpulab service unreachable at {api} ({detail}) — {HUB_DOWN_HINT}"
        ) from e
    if r.code == 599:
        raise ServiceError(502, f"gpulab service unreachable at {api} — {HUB_DOWN_HINT}")
    return Answer(r.code, r.headers.get("Content-Type", ""), r.body or b"")
