"""The service's calls into a user's running server, through the hub's proxy.

Three calls:

- ``GET <server>/api/kernels``: jupyter_server's own list of kernels, with each
  one's ``execution_state`` and ``last_activity`` (is the notebook idle?), and
  ``GET <server>/gpulab/activity``: work besides the cells (threads, subprocesses,
  terminals: :mod:`gpulab.lab.activity`);
- ``POST <server>/gpulab/hibernate``: gpulab's server extension asks each kernel to
  save its namespace to the user's files (:mod:`gpulab.lab.hibernate`) and answers
  what was saved, in numbers and names. The service never sees the state itself.

The user owns the server process and may log every header it receives, so no call
carries the service's own token: each question (what is running; save) carries a
token the hub mints for it (:meth:`gpulab.service.hubapi.HubAPI.server_token`), owned
by the user, scoped to that one server, living :data:`TOKEN_GRACE_S` seconds, revoked
once the answer is in. Captured, it reaches only the server the user already owns.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from dataclasses import dataclass
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.client.tls import client_context
from gpulab.enforcement.peer_account import refuse_foreign_listener

log = logging.getLogger("gpulab.service.hibernation")

#: How long a call's token lives: the server checks it with the hub as the call
#: arrives (a save takes minutes, but needs the token only at its start).
TOKEN_GRACE_S = 60
#: The most a server's answer may be (a list of kernels; what each saved, in names).
MAX_ANSWER_BYTES = 4 << 20


class ServerRefused(Exception):
    """The server could not be reached, or answered with an error: one line for people."""


@dataclass
class KernelActivity:
    """What a server's kernels say about it: any busy, and the latest activity."""

    kernels: int
    busy: int
    last_activity: float | None  # epoch seconds; None: no kernel
    #: Work besides the kernels' cells, one line each (a thread, a subprocess, a
    #: command in a terminal: ``GET <server>/gpulab/activity``): not idle while any.
    work: tuple[str, ...] = ()

    def idle_for(self, now: float, server_started: float) -> float:
        """Seconds since a kernel or terminal last did anything (or since the server
        started, when it runs none); 0 while a kernel is busy or other work runs."""
        if self.busy or self.work:
            return 0.0
        return max(0.0, now - (self.last_activity or server_started))


def _epoch(iso) -> float | None:
    """An ISO time a user's server gave, as epoch seconds; None for anything else."""
    if not iso or not isinstance(iso, str):
        return None
    try:
        return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class ServerCalls:
    """Calls into users' servers: ``servers_url`` is where the service reaches the
    hub's proxy (``http://127.0.0.1:8000``; on Kubernetes ``http://proxy-public``)."""

    def __init__(self, hub, servers_url: str, save_timeout: float = 300.0):
        self.hub = hub
        self.servers_url = servers_url.rstrip("/")
        self.save_timeout = save_timeout

    async def server_url(self, user: str, server: str) -> tuple[str, dict]:
        """The server's address through the proxy, and the hub's model of it."""
        if not self.servers_url:
            raise ServerRefused(
                "the service does not know where users' servers are: set "
                "c.Hibernation.servers_url (the hub's proxy, as the service reaches it)"
            )
        model = (await self.hub.user_servers(user)).get(server)
        if not model or not model.get("ready"):
            raise ServerRefused(f"{label(user, server)} is not running")
        url = model.get("url") or f"/user/{quote(user, safe='')}/"
        return f"{self.servers_url}{url}", model

    @contextlib.asynccontextmanager
    async def _token(self, user: str, server: str):
        """A token for calls into ``user``'s ``server`` alone, revoked when done."""
        try:
            token, token_id = await self.hub.server_token(user, server, TOKEN_GRACE_S)
        except HTTPClientError as e:
            raise ServerRefused(f"the hub gave no token for {label(user, server)} ({e})") from None
        try:
            yield token
        finally:
            # Revoked at once: what the server saw is dead for anyone who kept it.
            try:
                await self.hub.revoke_server_token(token_id)
            except (HTTPClientError, OSError) as e:
                log.warning("Could not revoke the token %s (it expires anyway): %s", token_id, e)

    async def _call(self, url: str, token: str, method: str, body: dict | None, timeout: float):
        # A token for the user's server: never to a port of this machine that another
        # account took (the hub's public port, while the proxy was down).
        try:
            await refuse_foreign_listener(url, "the server")
        except ConnectionRefusedError as e:
            raise ServerRefused(f"not calling {e}") from None
        req = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=timeout,
            connect_timeout=10,
            follow_redirects=False,
            # gpulab up --tls: the public URL's CA is in GPULAB_CA_FILE.
            ssl_options=client_context() if url.startswith("https:") else None,
        )
        try:
            # A user's server answers: never more than a small JSON body is read.
            client = AsyncHTTPClient(force_instance=True, max_body_size=MAX_ANSWER_BYTES)
            try:
                resp = await client.fetch(req)
            finally:
                client.close()
        except HTTPClientError as e:
            raise ServerRefused(_error_of(e)) from None
        except OSError as e:
            raise ServerRefused(f"the server did not answer ({e})") from None
        try:
            return json.loads(resp.body or b"null")
        except (ValueError, RecursionError):
            raise ServerRefused("the server's answer is not JSON") from None

    async def activity(self, user: str, server: str) -> tuple[KernelActivity, float]:
        """The server's kernels now, and when the server started (epoch seconds)."""
        url, model = await self.server_url(user, server)
        # no_track_activity: asking is not the user at work (JupyterHub's idle culler
        # reads the server's activity too).
        async with self._token(user, server) as token:
            kernels = await self._call(
                f"{url}api/kernels?no_track_activity=1", token, "GET", None, 10
            )
            # Threads, subprocesses and terminals at work (gpulab's server extension).
            other = await self._call(f"{url}gpulab/activity", token, "GET", None, 10)
        # The user's server says all this: any shape may come back.
        if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
            raise ServerRefused("its kernel list is not a list of kernels")
        busy = sum(1 for k in kernels if k.get("execution_state") in ("busy", "starting"))
        times = [t for t in (_epoch(k.get("last_activity")) for k in kernels) if t]
        other = other if isinstance(other, dict) else {}
        work = other.get("work")
        work = tuple(str(w)[:300] for w in work[:50]) if isinstance(work, list) else ()
        if terminal := _epoch(other.get("terminals_last_activity")):
            times.append(terminal)
        started = _epoch(model.get("started")) or 0.0
        last = max(times) if times else None
        return KernelActivity(len(kernels), busy, last, work), started

    async def save(self, user: str, server: str, hibernation_id: str, max_bytes: int) -> dict:
        """Ask the server to save every kernel: ``{"kernels": [...], "bytes": N}``."""
        url, _ = await self.server_url(user, server)
        body = {"id": hibernation_id, "max_bytes": int(max_bytes)}
        async with self._token(user, server) as token:
            return await self._call(
                f"{url}gpulab/hibernate", token, "POST", body, self.save_timeout
            )


def label(user: str, server: str) -> str:
    """``alice's server`` or ``alice's server 'gpu'``."""
    return f"{user}'s server" + (f" {server!r}" if server else "")


def _error_of(e: HTTPClientError) -> str:
    body = getattr(e.response, "body", b"") or b""
    try:
        message = json.loads(body).get("error") or json.loads(body).get("message")
    except (ValueError, AttributeError, RecursionError):
        message = None
    if e.code == 404 and not message:
        return "the server has no gpulab extension (gpulab is not installed in its image)"
    if e.code == 599:
        return f"the server did not answer in time ({e})"
    return message or f"the server answered HTTP {e.code}"
