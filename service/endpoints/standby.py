"""The standby endpoint router: endpoints keep answering while the service restarts.

The endpoint router runs in the service's process (:mod:`gpulab.service.endpoints.router`), so a
crash of the service (``kill -9``, the OOM killer) left the proxy's endpoint route
pointing at a closed port until the hub had started a new service: every call a
503 for those seconds. A standby process stands by beside the service and outlives
it:

- it holds the router's listening socket (inherited when the service starts it),
  but accepts nothing while the service lives, so every call is the service's;
- the service writes its endpoint table (:mod:`gpulab.service.endpoints.table`) whenever it
  changes, and the standby reads it again whenever the file changes;
- it holds a pidfd of the service. The moment that process ends, the standby
  starts accepting on the socket: calls that arrived meanwhile wait in the
  socket's queue (no refused connection, no route to change) and are answered
  from the last table with the router's own code: the caller's hub token checked
  with the hub (answers kept 5 s, as the router keeps them), the endpoint's
  shares, the version weights, the least busy ready replica with the replicas'
  own token;
- the next service's router listens on a socket of its own and takes the proxy's
  route; that service then starts a standby for it and stops this one (which
  finishes the calls it holds).

Only the calls the dead service was answering at that moment are lost. What the
standby does not do while it answers: start replicas (a call to an endpoint with
none ready, one scaled to zero say, gets 503 with Retry-After), count calls for
the autoscaler (the next service starts from none), hear of revoked tokens from
the hub's events (a revoked token works here for 5 s at most). A clean stop of
the service stops it first (:class:`StandbyProcess`); ``gpulab up`` ends one that
a killed hub left (its command line is ``python -m gpulab.service ...``). With a
fixed ``c.Endpoints.endpoint_router_port`` there is no standby: the next
service could not bind the port it holds.

The service starts it as ``python -m gpulab.service endpoint-standby <table>
<service pid> <socket fd>``; it forks and its first process exits, so it belongs
to no process tree of the hub's: the service's end is not its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from gpulab.service import tls
from gpulab.service.auth import TOKEN_CACHE_S, GuardedHubAuth, identity_of
from gpulab.service.endpoints.calls import CallRefused, EndpointCalls
from gpulab.service.endpoints.proxy import EndpointProxy
from gpulab.service.endpoints.router import EndpointRouter, error
from gpulab.service.endpoints.table import read_table, table_path, write_private
from gpulab.service.endpoints.traffic import UnitTraffic, WeightedChoice
from gpulab.service.hubapi import HubAPI

log = logging.getLogger("gpulab.service.endpoints.standby")

#: ``python -m gpulab.service endpoint-standby <table> <pid> <fd>`` runs it.
COMMAND = "endpoint-standby"
PIDFILE = "endpoint-standby.pid"
LOGFILE = "endpoint-standby.log"
#: How often the table's file is looked at for a newer one.
READ_EVERY_S = 0.25
#: How long a standby has to stop after SIGTERM (then SIGKILL).
STOP_GRACE_S = 5.0
RESTARTING = "the gpulab service is restarting; try again shortly"


# -- the calls, from the table ------------------------------------------------------------
@dataclass
class TableUnit:
    row: dict  # the version's fields of the table
    ready: list[tuple[int, str]]
    token: str | None
    traffic: UnitTraffic = field(default_factory=UnitTraffic)
    draining_from: int | None = None  # the table lists only replicas that take calls


@dataclass
class TableEndpoint:
    row: dict
    units: dict[str, TableUnit]
    choice: WeightedChoice = field(default_factory=WeightedChoice)

    def by_version(self) -> list[TableUnit]:
        return sorted(self.units.values(), key=lambda u: u.row["version"])


class TableCalls(EndpointCalls):
    """The service's call path (:class:`~gpulab.service.endpoints.calls.EndpointCalls`)
    over the last table: the same choice of version and replica, the same refusals."""

    def __init__(self):
        super().__init__(EndpointProxy())
        self._deps: dict[str, TableEndpoint] = {}
        self._by_name: dict[tuple[str, str], str] = {}

    def load(self, endpoints: list[dict]) -> None:
        deps = {}
        for e in endpoints:
            units = {
                v["id"]: TableUnit(v, [(i, a) for i, a in v["ready"]], v["token"])
                for v in e["versions"]
            }
            old = self._deps.get(e["id"])
            deps[e["id"]] = TableEndpoint(e, units, old.choice if old else WeightedChoice())
        self._deps = deps
        self._by_name = {(d.row["user"], d.row["name"]): i for i, d in deps.items()}

    def endpoint(self, user: str, name: str) -> dict | None:
        dep_id = self._by_name.get((user, name))
        return self._deps[dep_id].row if dep_id is not None else None

    def record(self, dep_id: str) -> TableEndpoint:
        return self._deps[dep_id]

    def ready(self, dep: dict, unit) -> list[tuple[int, str]]:
        return list(unit.ready)

    def token(self, unit) -> str:
        return unit.token

    async def cold_start(self, dep: dict, unit):
        # Replicas are started by the service, which is down.
        raise CallRefused(
            503,
            f"no replica of {dep['user']}/{dep['name']} version {unit.row['version']} is "
            f"ready and {RESTARTING}",
            retry_after=2,
        )


class StandbyRouter(EndpointRouter):
    """The endpoint router on the dead service's socket (the proxy's route is as the
    service left it)."""

    async def take_over(self, sock: socket.socket) -> None:
        limit = self.max_upload_mib * 2**20
        server = web.Server(self.handle, client_max_size=limit)
        self._runner = web.ServerRunner(
            server, access_log=None, handle_signals=False, shutdown_timeout=STOP_GRACE_S
        )
        await self._runner.setup()
        self._session = self.new_session()
        # The same certificate as the service's router (its environment is the service's).
        await web.SockSite(self._runner, sock, ssl_context=tls.server_context()).start()

    async def stop(self) -> None:
        # The proxy's route is the next service's business: left as it is.
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        await self.calls.proxy.close()

    async def _via_service(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await super()._via_service(request)
        except (aiohttp.ClientError, OSError):
            return error(503, RESTARTING, retry_after=2)


# -- the process ----------------------------------------------------------------------------
class Standby:
    """Reads the table, watches the service, answers on its socket once it ended."""

    def __init__(self, path: str, pid: int, sock: socket.socket):
        self.path = path
        self.pid = pid  # the service whose socket this is
        self.sock = sock
        self.calls = TableCalls()
        self.table: dict = {}
        self.ended = asyncio.Event()
        self._stamp = None

    def read(self) -> bool:
        """Take in the table if its file changed; False when the file is gone."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                table = read_table(self.path)
            except (OSError, ValueError):
                return True  # replaced as we read: the next look finds the new one
            self._stamp, self.table = stamp, table
            self.calls.load(table["endpoints"])
        return True

    def _watch(self) -> int | None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.ended.set()
            return None
        asyncio.get_running_loop().add_reader(pidfd, self.ended.set)
        return pidfd

    async def run(self, stopping: asyncio.Event) -> None:
        token = os.environ["JUPYTERHUB_API_TOKEN"]
        hub = HubAPI(os.environ["JUPYTERHUB_API_URL"], token)
        hub_auth = GuardedHubAuth(api_token=token, cache_max_age=TOKEN_CACHE_S)
        if tls.serves_tls():
            tls.reuse_hub_auth_contexts()
        name = os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpulab")
        pidfd = self._watch()
        try:
            while not self.ended.is_set() and not stopping.is_set():
                if not self.read():
                    log.warning("The endpoint table %s is gone: the standby stops", self.path)
                    return
                await _until(stopping, self.ended, seconds=READ_EVERY_S)
        finally:
            if pidfd is not None:
                asyncio.get_running_loop().remove_reader(pidfd)
                os.close(pidfd)
        if stopping.is_set() or not self.read() or not self.table:
            return
        # What the router reads of the service comes from the table's head; who a
        # caller is, as the service says (GpuLabService.identify).
        router = StandbyRouter(
            self.calls,
            prefix=self.table["prefix"],
            max_upload_mib=self.table["max_upload_mib"],
            identify=lambda model: identity_of(model, hub, name),
            hub_auth=hub_auth,
        )
        await router.take_over(self.sock)
        log.warning(
            "The gpulab service (pid %s) ended: endpoint calls are answered here from its "
            "last table until the next service stops this standby",
            self.pid,
        )
        try:
            # The table is no longer read: the next service's first one, written before
            # it has probed the replicas, lists none ready.
            while not stopping.is_set() and os.path.exists(self.path):
                await _until(stopping, seconds=READ_EVERY_S)
        finally:
            await router.stop()


async def _until(*events: asyncio.Event, seconds: float) -> None:
    """Until one of ``events`` is set, or ``seconds`` have passed."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()


async def _serve(path: str, pid: int, sock: socket.socket) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await Standby(path, pid, sock).run(stopping)
    log.info("Standby endpoint router stopped")


def main(argv: list[str]) -> None:
    """``python -m gpulab.service endpoint-standby <table> <service pid> <socket fd>``:
    fork, write the pidfile beside the table, run in the child (the first process
    exits, so the standby belongs to no process tree of the hub's)."""
    path, pid, fd = os.path.abspath(argv[0]), int(argv[1]), int(argv[2])
    child = os.fork()
    if child:
        write_private(os.path.join(os.path.dirname(path), PIDFILE), str(child))
        os._exit(0)
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # a line per call
    asyncio.run(_serve(path, pid, socket.socket(fileno=fd)))


# -- the service's side ---------------------------------------------------------------------
def _is_standby(pid: int, table: str) -> bool:
    try:
        # The account first: another account's command line is never read (a read of
        # it can be made to block).
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
        return COMMAND in argv and table in argv
    except OSError:
        return False


class StandbyProcess:
    """The service's handle on its standby: start one for this service's socket (and
    stop the one before, which may be answering for a service that died), stop it
    at a clean stop."""

    def __init__(self, data_dir: str):
        self.table = table_path(data_dir)
        self.pidfile = os.path.join(data_dir, PIDFILE)
        self.logfile = os.path.join(data_dir, LOGFILE)
        # A stop while a start is under way (the service stopped as it started) waits
        # for it, so the standby just started is stopped, not left running.
        self._lock = threading.Lock()

    def _running(self) -> int | None:
        """A pidfd of the standby the pidfile names, if it still runs."""
        try:
            with open(self.pidfile) as f:
                pid = int(f.read().strip())
            pidfd = os.pidfd_open(pid)
        except (OSError, ValueError):
            return None
        if _is_standby(pid, self.table):  # checked after the pidfd holds the pid
            return pidfd
        os.close(pidfd)
        return None

    def replace(self, service_pid: int, socket_fd: int) -> None:
        """Start a standby for ``socket_fd`` (blocks until it forked), then end the one
        before. Called once this service's router holds the proxy's route, so the old
        one gets no new calls."""
        with self._lock:
            self._replace(service_pid, socket_fd)

    def _replace(self, service_pid: int, socket_fd: int) -> None:
        old = self._running()
        try:
            log_fd = os.open(self.logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                first = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gpulab.service",
                        COMMAND,
                        self.table,
                        str(service_pid),
                        str(socket_fd),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=log_fd,
                    pass_fds=(socket_fd,),
                    start_new_session=True,
                )
            finally:
                os.close(log_fd)
            if first.wait() != 0:
                log.warning("The standby endpoint router did not start; see %s", self.logfile)
        finally:
            if old is not None:
                _end(old)

    def stop(self) -> None:
        with self._lock:
            pidfd = self._running()
            if pidfd is not None:
                _end(pidfd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.pidfile)


def _end(pidfd: int) -> None:
    """SIGTERM (it finishes the calls it holds), SIGKILL if it still runs after."""
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        if not select.select([pidfd], [], [], STOP_GRACE_S + 1)[0]:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)
