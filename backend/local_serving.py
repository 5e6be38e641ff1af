"""Model endpoints as processes on this machine (the embedded default): the serving
backend that keeps its replicas running itself.

:class:`LocalServing` starts and kills replicas through :class:`~.local_replicas.LocalReplicas`
and supervises them on every :meth:`~LocalServing.check`: a replica whose process is
gone is started again (on a fresh socket); one that dies ``MAX_CRASHES`` times within
``CRASH_WINDOW_S`` fails its deployment. A replica counts as ready once its
``/v2/health/ready`` answers 200; calls then go to the ready ones in turn.

:meth:`~LocalServing.check` runs under the deployment manager's lock, which every
user's changes and cold starts wait for: it never waits on a replica (whose code is
its owner's, and may never answer). The probes of replicas not ready yet run in
tasks of their own, all at once, each bounded by ``PROBE_TIMEOUT_S``; what they find
counts from the moment they find it (calls see a ready replica at once, the
manager's count at its next check).
After a restart of the service the replicas are found again by pid
(:meth:`~LocalServing.adopt`, then the next check).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

import aiohttp

from gpulab.enforcement.account_limits import LimitsNotHeld
from gpulab.scheduler.slices import plural

from .local_replicas import LocalReplicas
from .replica_http import ReplicaSessions
from .serving_base import Health

log = logging.getLogger("gpulab.backend.local_serving")

#: A replica that dies this many times within CRASH_WINDOW_S fails its deployment.
MAX_CRASHES = 5
CRASH_WINDOW_S = 300.0
PROBE_TIMEOUT_S = 2.0
#: The most of a probe's answer read (a replica answers a few bytes of JSON).
PROBE_READ_BYTES = 4096


@dataclass
class Replica:
    gpu_uuid: str | None = None  # the card of its slice, or None for none
    address: str | None = None  # where it answers (unix:<socket>), set once it is ready
    crashes: list[float] = field(default_factory=list)  # monotonic times it died
    probing: asyncio.Task | None = None  # its readiness probe under way, if any


@dataclass
class Served:
    """What this process knows of one deployment's replicas."""

    replicas: list[Replica]
    token: str | None = None


class LocalServing(LocalReplicas):
    name = "local"
    restarts_replicas = False  # check() does

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        self._served: dict[str, Served] = {}
        self._probes: set[asyncio.Task] = set()
        # Answers left packed: a replica runs its owner's code, and a gzip of zeros
        # unpacked would be GiBs in the service (only the status is read).
        self._sessions = ReplicaSessions(
            lambda connector: aiohttp.ClientSession(connector=connector, auto_decompress=False)
        )

    def _state(self, dep: dict, rows: list[dict] | None = None) -> Served:
        served = self._served.get(dep["id"])
        if served is None:
            served = self._served[dep["id"]] = Served([])
        while len(served.replicas) < dep["replicas"]:  # grown by the autoscaler
            served.replicas.append(Replica())
        for row in rows or ():
            replica = int(row["owner"].rsplit("/", 1)[1])
            if replica < len(served.replicas):
                served.replicas[replica].gpu_uuid = row["gpu_uuid"]
        return served

    # -- launching -----------------------------------------------------------------
    async def launch(self, dep: dict, rows: list[dict]) -> None:
        self._state(dep, rows)
        for r in range(dep["replicas"]):
            try:
                self._start(dep, r)
            except OSError:  # the next check launches it again
                log.exception("Launching replica %d of %s", r, dep["id"])

    async def scale(self, dep: dict, replicas: int, rows: list[dict]) -> None:
        """Start replicas ``dep["replicas"]..replicas-1``, or stop those from ``replicas`` on."""
        before = dep["replicas"]
        if replicas > before:
            self._state({**dep, "replicas": replicas}, rows)
            for r in range(before, replicas):
                try:
                    self._start(dep, r)
                except OSError:  # the next check launches it again
                    log.exception("Launching replica %d of %s", r, dep["id"])
            return
        await self.kill(dep, range(replicas, before), drained=True)
        served = self._served.get(dep["id"])
        if served is not None:
            for rep in served.replicas[replicas:]:
                if rep.probing is not None:
                    rep.probing.cancel()
            del served.replicas[replicas:]

    async def adopt(self, dep: dict, rows: list[dict]) -> None:
        # Live replicas are found by pid on the next check; dead ones started again.
        self._state(dep, rows)

    def _start(self, dep: dict, replica: int) -> None:
        rep = self._state(dep).replicas[replica]
        rep.address = None
        if rep.probing is not None:  # of the process before: its answer counts for nothing
            rep.probing.cancel()
            rep.probing = None
        self.start_replica(dep, replica, rep.gpu_uuid)

    # -- supervising -----------------------------------------------------------------
    async def check(self, dep: dict) -> Health:
        served = self._state(dep)
        restarts, message = dep["restarts"], dep["message"]
        down = []
        for r, rep in enumerate(served.replicas[: dep["replicas"]]):
            if self.alive(dep["id"], r):
                if rep.address is None and rep.probing is None:
                    self._probe_soon(dep, r, rep)
            else:
                down.append(r)
        for r in down:
            rep = served.replicas[r]
            if self.record(dep["id"], r) is None:
                # Admitted but never launched (a crash in between, or a launch refused).
                try:
                    self._start(dep, r)
                except LimitsNotHeld as e:
                    return Health(0, "failed", f"replica {r}: {e}; slices released", restarts)
                continue
            tail = self.log_tail(dep["id"], r)
            code = self.exit_code(dep["id"], r)
            now = time.monotonic()
            rep.crashes = [t for t in rep.crashes if now - t < CRASH_WINDOW_S] + [now]
            rep.address = None
            what = f"replica {r} exited" + (f" with code {code}" if code is not None else "")
            if len(rep.crashes) >= MAX_CRASHES:
                log.warning("Deployment %s/%s failed: %s", dep["user"], dep["name"], tail)
                return Health(
                    0,
                    "failed",
                    f"{what} ({len(rep.crashes)} times in "
                    f"{CRASH_WINDOW_S:g} s); slices released. "
                    f"Last log: {tail}",
                    restarts,
                )
            log.warning(
                "Deployment %s/%s: %s; restarting it. Log: %s", dep["user"], dep["name"], what, tail
            )
            restarts += 1
            message = f"{what}; restarted it"
            try:
                self._start(dep, r)
            except LimitsNotHeld as e:
                return Health(0, "failed", f"replica {r}: {e}; slices released", restarts)
        ready = sum(rep.address is not None for rep in served.replicas[: dep["replicas"]])
        state = (
            "running"
            if ready >= dep["replicas"]
            else "degraded"
            if dep["state"] != "starting" or down
            else "starting"
        )
        if state == "running" and dep["state"] != "running":
            message = f"{plural(ready, 'replica')} ready" + (
                f"; {plural(restarts, 'restart')} so far" if restarts else ""
            )
        return Health(ready, state, message, restarts)

    def _probe_soon(self, dep: dict, replica: int, rep: Replica) -> None:
        """Ask the replica whether it is ready, in a task of its own (check() does not
        wait for it)."""
        task = asyncio.ensure_future(self._probe(dict(dep), replica, rep))
        rep.probing = task
        self._probes.add(task)
        task.add_done_callback(self._probe_done)

    def _probe_done(self, task: asyncio.Task) -> None:
        self._probes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("Probing a replica", exc_info=task.exception())

    async def _probe(self, dep: dict, replica: int, rep: Replica) -> None:
        try:
            rec = self.record(dep["id"], replica)
            if rec is None:
                return
            address = self.address(rec)
            resp = await self._get(dep, address, "/v2/health/ready")
            if resp is None or resp[0] != 200:
                return
            now = self.record(dep["id"], replica)
            served = self._served.get(dep["id"])
            if (
                now is None
                or (now["pid"], now.get("started")) != (rec["pid"], rec.get("started"))
                or served is None
                or replica >= len(served.replicas)
                or served.replicas[replica] is not rep
            ):
                return  # restarted, scaled away or stopped meanwhile: it says nothing now
            rep.address = address
            self.serving_priority(rec["pid"])
        finally:
            if rep.probing is asyncio.current_task():
                rep.probing = None

    def _token(self, dep: dict) -> str:
        served = self._state(dep)
        if served.token is None:
            served.token = self.token(dep["id"])
        return served.token

    async def _get(self, dep: dict, address: str, path: str):
        """``(status, the body's first PROBE_READ_BYTES)`` of a GET to one replica, or
        None if it does not answer."""
        session, base = await self._sessions.get(address)
        try:
            async with session.get(
                f"{base}{path}",
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                headers={"Authorization": f"Bearer {self._token(dep)}"},
            ) as resp:
                return resp.status, await resp.content.read(PROBE_READ_BYTES)
        except (TimeoutError, aiohttp.ClientError):
            return None

    # -- reading -------------------------------------------------------------------------
    def ready_replicas(self, dep: dict) -> list[tuple[int, str]]:
        served = self._served.get(dep["id"])
        if served is None:
            return []
        return [
            (r, rep.address)
            for r, rep in enumerate(served.replicas[: dep["replicas"]])
            if rep.address
        ]

    async def logs(self, dep: dict, replica: int, max_bytes: int = 256 * 1024) -> str:
        return await asyncio.to_thread(self._log_end, dep["id"], replica, max_bytes)

    def _log_end(self, dep_id: str, replica: int, max_bytes: int) -> str:
        try:
            with open(self.log_path(dep_id, replica), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - max_bytes))
                return f.read(max_bytes).decode(errors="replace")
        except FileNotFoundError:
            return ""

    # -- stopping ----------------------------------------------------------------------
    async def stop(self, dep: dict) -> None:
        """SIGTERM every replica (queued requests are answered), then SIGKILL."""
        await self.kill(dep, range(dep["replicas"]))
        self.forget(dep["id"])

    def forget(self, dep_id: str) -> None:
        served = self._served.pop(dep_id, None)
        for rep in served.replicas if served is not None else ():
            if rep.probing is not None:
                rep.probing.cancel()

    async def close(self) -> None:
        probes = list(self._probes)
        for task in probes:
            task.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        await self._sessions.close()
