"""The hub not answering, told apart from a fault of the service.

Every request is identified by asking the hub who its token is
(:mod:`gpulab.service.auth`, the endpoint router). While the hub is down or
restarting that question fails; the caller is then told so, with a 503 and
:data:`HUB_DOWN`, never an internal error (a 500).
"""

from __future__ import annotations

import asyncio

from tornado import web
from tornado.httpclient import HTTPClientError

#: What a caller is told while the hub cannot say who they are.
HUB_DOWN = "the hub is not answering; try again in a moment"
#: JupyterHub's HubAuth words for "I could not reach the hub" (its 500) and "the hub
#: answered 5xx" (its 502).
_HUBAUTH_UNREACHABLE = ("Failed to connect to Hub API", "Failed to check authorization (upstream")


def hub_unreachable(exc: BaseException) -> bool:
    """Whether ``exc``, raised while asking the hub, means the hub is not answering
    (down, restarting, or failing itself) rather than a fault of the service."""
    if isinstance(exc, web.HTTPError):
        return exc.status_code in (500, 502) and (exc.log_message or "").startswith(
            _HUBAUTH_UNREACHABLE
        )
    if isinstance(exc, HTTPClientError):  # the service's own HubAPI calls
        return exc.code == 599 or exc.code >= 500  # 599: no answer (refused, timed out)
    return isinstance(exc, (OSError, asyncio.TimeoutError))
