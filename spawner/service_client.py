"""The spawner's calls to the gpulab service, over HTTP with the service's token.

The service may be restarting (the hub restarts it when it dies), so
connection failures are retried for a while; a 4xx answer is final and its
message is passed on to the user as-is.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlencode

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.client.tls import client_context
from gpulab.enforcement.peer_account import foreign_listener


class ServiceClient:
    def __init__(self, api_url: str, token: str, retry_seconds: float = 90.0, log=None):
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.retry_seconds = retry_seconds
        self.log = log
        # https (gpulab up --tls): the service's certificate is from the hub's internal
        # CA, named in GPULAB_CA_FILE of the hub's process.
        self._ssl = client_context() if self.api_url.startswith("https:") else None

    async def request(
        self, method: str, path: str, body: dict | None = None, query: dict | None = None
    ):
        url = f"{self.api_url}{path}" + (f"?{urlencode(query)}" if query else "")
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.25
        while True:
            req = HTTPRequest(
                url,
                method=method,
                request_timeout=30,
                headers={
                    "Authorization": f"token {self._token}",
                    "Content-Type": "application/json",
                },
                body=json.dumps(body) if body is not None else None,
                allow_nonstandard_methods=True,
                ssl_options=self._ssl,
            )
            foreign = foreign_listener(url)
            if foreign:
                raise web.HTTPError(503, f"the gpulab service: {foreign}")
            try:
                resp = await AsyncHTTPClient().fetch(req)
                return json.loads(resp.body) if resp.body else None
            except HTTPClientError as e:
                if e.code and 400 <= e.code < 500:
                    raise web.HTTPError(e.code, _message(e)) from None
                problem = f"HTTP {e.code}"
            except OSError as e:  # refused / reset while the service restarts
                problem = str(e)
            if time.monotonic() > deadline:
                raise web.HTTPError(
                    503, f"the gpulab service did not answer ({problem}); try again shortly"
                )
            if self.log:
                self.log.warning("gpulab service unavailable (%s); retrying", problem)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def _message(e: HTTPClientError) -> str:
    try:
        return json.loads(e.response.body)["error"]
    except Exception:
        return str(e)
