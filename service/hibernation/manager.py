"""Hibernating servers: save each kernel's variables, stop the server, give its slice
back; record what each kernel says when it wakes.

Three things hibernate a server (:meth:`Hibernations.request`): its user (``%gpulab
hibernate``, the lab panel, ``POST /hibernations``), the idle rule
(``c.Hibernation.hibernate_idle_seconds``: no kernel busy and, on a real GPU, no
GPU activity for that long; :meth:`Hibernations.loop`) and the scheduler, which
hibernates an idle server before it stops any running batch job
(:meth:`Hibernations.idle_servers`, used by :mod:`gpulab.service.jobs.preemption`).

The flow, one task per request:

1. a row in ``saving`` (``gpulab_hibernations``);
2. the server's gpulab extension asks each kernel to save its namespace to the
   user's own files, as the user (:mod:`.servers`; the service never reads it);
3. only when every kernel saved: the hub stops the server, the spawner releases the
   slice; the row becomes ``hibernated`` and the audit trail says
   ``server.hibernate``. A failure at 2 (a full disk, the size cap, a kernel busy)
   leaves the server running and the row ``failed`` with the reason.

Waking needs nothing from the service: the user's kernels restore themselves when
the server starts again, and report (``POST /hibernations/{id}/wakes``, audited as
``server.wake``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.db import clock as gpulab_clock
from gpulab.db.hibernations import HibernationStore
from gpulab.service.tasks import KeptTask, TaskSet, every
from gpulab.training.sizes import size_words

from .servers import ServerCalls, ServerRefused, label

log = logging.getLogger("gpulab.service.hibernation")

#: Below 1 %, a GPU counts as idle (the SliceIdle alert's threshold).
GPU_IDLE_UTILIZATION = 0.01
#: A server whose hibernation failed is not tried again by gpulab for this long.
RETRY_AFTER_FAILURE_S = 600.0
#: The most kernels, and names of what was not saved per kernel, a row keeps.
MAX_KERNELS = 100
MAX_SKIPPED = 200
#: Characters of a failure's message kept (the server's answer may be megabytes).
MAX_ERROR_CHARS = 500
#: How long the hub gets to stop a saved server and its spawner to free the slice.
STOP_TIMEOUT_S = 120.0


class HibernationError(Exception):
    """A request that cannot start: ``status`` (404, 409) and one line for people."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class IdleServer:
    owner: str  # the ledger's owner: "alice/" or "alice/gpu"
    user: str
    server: str
    idle_seconds: float
    milli: int


def minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


class Hibernations:
    """The service's part that hibernates servers (built by the app with what it needs)."""

    def __init__(
        self,
        *,
        engine,
        db_threads,
        ledger,
        hub,
        servers: ServerCalls,
        audit,
        telemetry=None,
        idle_seconds: float = 0.0,
        for_others_seconds: float = 300.0,
        max_bytes: int = 20 * 10**9,
        clock: Callable[[], float] = gpulab_clock.now,
    ):
        self.engine = engine
        self.rows = HibernationStore(engine)
        self.db_threads = db_threads
        self.ledger = ledger
        self.hub = hub
        self.servers = servers
        self.audit = audit
        self.telemetry = telemetry
        self.idle_seconds = float(idle_seconds)
        self.for_others_seconds = float(for_others_seconds)
        self.max_bytes = int(max_bytes)
        self.clock = clock
        #: owner ("alice/") -> the id of the hibernation running for it
        self.saving: dict[str, str] = {}
        self._failed_at: dict[str, float] = {}
        self._tasks = TaskSet()
        self._loop = KeptTask("gpulab-hibernate-idle", self.loop)

    # -- running -------------------------------------------------------------------
    async def start(self) -> None:
        n = await self.db_threads.run(
            self.rows.fail_unfinished, "the gpulab service restarted while saving"
        )
        if n:
            log.warning("%d hibernation(s) were cut short by a restart; their servers run on", n)
        if self.idle_seconds > 0:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self._tasks.cancel()

    # -- reading ---------------------------------------------------------------------
    async def list(self, user: str | None, server: str | None = None) -> list[dict]:
        rows = await self.db_threads.run(self.rows.list, user, server)
        return [view(r) for r in rows]

    async def get(self, id: str) -> dict | None:
        row = await self.db_threads.run(self.rows.get, id)
        return None if row is None else view(row)

    def busy(self, owner: str) -> bool:
        """Is a hibernation of this server still running (saving or stopping)?"""
        return owner in self.saving

    # -- hibernating -----------------------------------------------------------------
    async def request(
        self, user: str, server: str, *, reason: str, actor: str, actor_kind: str = "user"
    ) -> dict:
        """Start hibernating ``user``'s ``server``: the new row (state ``saving``); the
        rest runs in the background. Raises :class:`HibernationError`."""
        owner = f"{user}/{server}"
        if owner in self.saving:
            raise HibernationError(409, f"{label(user, server)} is already hibernating")
        hid = f"h-{secrets.token_hex(6)}"
        self.saving[owner] = hid  # before any wait: a second request is refused above
        try:
            model = (await self.hub.user_servers(user)).get(server)
            if not model or not model.get("ready"):
                raise HibernationError(
                    409, f"{label(user, server)} is not running: there is nothing to hibernate"
                )
            rows = await self.ledger.aio.list(owner_kind="server", owner=owner)
            milli = sum(r["milli"] for r in rows)
            row = await self.db_threads.run(self.rows.add, hid, user, server, reason, actor, milli)
        except BaseException:
            self.saving.pop(owner, None)
            raise
        log.info("Hibernating %s (%s)", label(user, server), reason)
        self._tasks.spawn(self._run(row, actor, actor_kind))
        return view(row)

    async def _run(self, row: dict, actor: str, actor_kind: str) -> None:
        user, server, hid = row["user"], row["server"], row["id"]
        owner = f"{user}/{server}"
        started = time.monotonic()
        try:
            try:
                saved = await self.servers.save(user, server, hid, self.max_bytes)
            except ServerRefused as e:
                await self._fail(row, f"nothing was stopped: {e}", actor, actor_kind)
                return
            kernels = kernel_states(saved)
            gone = gone_kernels(saved)
            total = sum(k["bytes"] for k in kernels)
            try:
                await self._stop_server(user, server, owner)
            except Exception as e:
                await self._fail(row, f"saved, but the server did not stop: {e}", actor, actor_kind)
                return
            done = await self.db_threads.run(
                self.rows.finish,
                hid,
                "hibernated",
                kernels=kernels,
                total_bytes=total,
            )
            log.info(
                "Hibernated %s: %d kernel(s), %s in %.1f s%s",
                label(user, server),
                len(kernels),
                size_words(total),
                time.monotonic() - started,
                "".join(f"; {g['name']}: {g['why']}" for g in gone),
            )
            await self.audit.record(
                "server.hibernate",
                owner,
                actor=actor,
                actor_kind=actor_kind,
                user=user,
                reason=row["reason"],
                kernels=len(kernels),
                bytes=total,
                gpu_milli=row["gpu_milli"],
                id=hid,
                **({"gone": [g["name"] for g in gone]} if gone else {}),
            )
            return done
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the database, the hub: say so on the row
            log.exception("Hibernating %s", owner)
            await self._fail(row, f"{type(e).__name__}: {e}", actor, actor_kind)
        finally:
            self.saving.pop(owner, None)

    async def _stop_server(self, user: str, server: str, owner: str) -> None:
        """Stop the server through the hub and wait until its slice is back."""
        await self.hub.stop_server(user, server)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            running = (await self.hub.user_servers(user)).get(server)
            held = await self.ledger.aio.list(owner_kind="server", owner=owner)
            if not running and not held:
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"the hub did not stop it within {STOP_TIMEOUT_S:.0f} s")

    async def _fail(self, row: dict, error: str, actor: str, actor_kind: str) -> None:
        # Often the user's server's own words (its kernel's exception): kept short, as
        # every listing, the hub's pages and the audit trail show it.
        if len(error) > MAX_ERROR_CHARS:
            error = error[: MAX_ERROR_CHARS - 1] + "…"
        owner = f"{row['user']}/{row['server']}"
        self._failed_at[owner] = self.clock()
        log.warning("Hibernating %s failed: %s", owner, error)
        try:
            await self.db_threads.run(self.rows.finish, row["id"], "failed", error=error)
        finally:
            await self.audit.record(
                "server.hibernate",
                owner,
                actor=actor,
                actor_kind=actor_kind,
                user=row["user"],
                result="failed",
                reason=row["reason"],
                error=error,
                id=row["id"],
            )

    # -- waking ----------------------------------------------------------------------
    async def woke(self, row: dict, wake: dict, actor: str) -> dict:
        """A kernel of this hibernation came back and says how it went."""
        done = await self.db_threads.run(self.rows.add_wake, row["id"], wake)
        await self.audit.record(
            "server.wake",
            f"{row['user']}/{row['server']}",
            actor=actor,
            actor_kind="user",
            user=row["user"],
            id=row["id"],
            kernel=wake.get("name"),
            restored=wake["restored_count"],
            failed=wake["failed_count"],
            seconds=wake.get("seconds"),
        )
        return view(done)

    # -- idle servers ------------------------------------------------------------------
    async def idle_servers(
        self, min_idle_seconds: float, timeout: float | None = None
    ) -> list[IdleServer]:
        """Servers holding a slice whose kernels have been idle (and, on a real GPU
        they hold alone, their GPU too: a shared GPU's utilisation is everyone's) for
        at least ``min_idle_seconds``, most idle first. A server that cannot be
        asked, or whose hibernation failed lately, is left out; so is one that does
        not answer within ``timeout`` seconds, and it is not asked again for
        ``RETRY_AFTER_FAILURE_S`` (preemption asks with the job queue's lock held)."""
        held: dict[str, list[dict]] = {}
        holders: dict[str, set[str]] = {}  # GPU -> who holds a slice of it
        for a in await self.ledger.aio.list():
            holders.setdefault(a["gpu_uuid"], set()).add(a["owner"])
            if a["owner_kind"] == "server":
                held.setdefault(a["owner"], []).append(a)
        now = self.clock()
        candidates = [
            owner
            for owner in held
            if owner not in self.saving
            and now - self._failed_at.get(owner, -RETRY_AFTER_FAILURE_S) >= RETRY_AFTER_FAILURE_S
        ]

        async def ask(owner: str) -> IdleServer | None:
            user, _, server = owner.partition("/")
            try:
                activity, started = await asyncio.wait_for(
                    self.servers.activity(user, server), timeout
                )
            except ServerRefused:
                return None
            except TimeoutError:
                log.info("%s did not say what it does within %.0f s: left awake", owner, timeout)
                self._failed_at[owner] = self.clock()
                return None
            except Exception:  # a user's server answered: it never fails everyone's pass
                log.warning("Asking %s about its activity failed", owner, exc_info=True)
                return None
            idle = activity.idle_for(now, started)
            # A GPU's utilisation speaks for a server only on a GPU it holds alone.
            uuids = {a["gpu_uuid"] for a in held[owner] if holders[a["gpu_uuid"]] == {owner}}
            if idle < min_idle_seconds or self.gpu_busy(uuids, now - min_idle_seconds):
                return None
            return IdleServer(owner, user, server, idle, sum(a["milli"] for a in held[owner]))

        found = await asyncio.gather(*(ask(o) for o in candidates))
        return sorted((s for s in found if s), key=lambda s: -s.idle_seconds)

    def gpu_busy(self, uuids: set[str], since: float) -> bool:
        """Did any of these GPUs report work since then? (Simulated GPUs report none.)"""
        if self.telemetry is None:
            return False
        for samples in self.telemetry.since(since).values():
            for sample in samples:
                for gpu in sample.get("gpus") or []:
                    u = gpu.get("utilization_ratio")
                    busy = isinstance(u, (int, float)) and u >= GPU_IDLE_UTILIZATION
                    if busy and gpu.get("uuid") in uuids:
                        return True
        return False

    async def hibernate_for_others(self, server: IdleServer, needed_by: str) -> bool:
        """Hibernate an idle server to make room for what ``needed_by`` names ("an
        interactive server of carol"): the scheduler's choice. False when it cannot
        start (stopped, or hibernating already, meanwhile)."""
        reason = f"idle for {minutes(server.idle_seconds)} while {needed_by} needed a GPU"
        try:
            await self.request(
                server.user, server.server, reason=reason, actor="gpulab", actor_kind="system"
            )
        except HibernationError as e:
            log.info("Not hibernating %s: %s", server.owner, e.message)
            return False
        return True

    async def loop(self) -> None:
        seconds = max(1.0, min(30.0, self.idle_seconds / 4))
        await every(seconds, self.hibernate_idle, "Hibernating idle servers", log)

    async def hibernate_idle(self) -> list[str]:
        """Hibernate every server idle for ``hibernate_idle_seconds``; their owners."""
        started = []
        for s in await self.idle_servers(self.idle_seconds):
            try:
                await self.request(
                    s.user,
                    s.server,
                    reason=f"idle for {minutes(s.idle_seconds)}",
                    actor="gpulab",
                    actor_kind="system",
                )
            except HibernationError as e:
                log.info("Not hibernating %s: %s", s.owner, e.message)
                continue
            started.append(s.owner)
        return started


def kernel_states(saved: dict) -> list[dict]:
    """What the server says each kernel saved, checked and cut to size: it comes from
    the user's own server, so it is kept as data, never trusted for its shape."""
    out = []
    kernels = saved.get("kernels") if isinstance(saved, dict) else None
    for k in (kernels if isinstance(kernels, list) else [])[:MAX_KERNELS]:
        if not isinstance(k, dict):
            continue
        skipped = k.get("skipped") if isinstance(k.get("skipped"), list) else []
        out.append(
            {
                "name": str(k.get("name", ""))[:255],
                "notebook": str(k.get("notebook", ""))[:1024],
                "variables": _count(k.get("variables")),
                "saved": _count(k.get("saved")),
                "bytes": _count(k.get("bytes")),
                "skipped": [
                    {"name": str(s.get("name", ""))[:255], "why": str(s.get("why", ""))[:300]}
                    for s in skipped[:MAX_SKIPPED]
                    if isinstance(s, dict)
                ],
            }
        )
    return out


def gone_kernels(saved: dict) -> list[dict]:
    """The kernels that were shut down or died while saving (nothing of them was
    kept), as the server names them: ``[{"name", "why"}]``, checked and cut to size."""
    gone = saved.get("gone") if isinstance(saved, dict) else None
    return [
        {"name": str(g.get("name", ""))[:255], "why": str(g.get("why", ""))[:300]}
        for g in (gone if isinstance(gone, list) else [])[:MAX_KERNELS]
        if isinstance(g, dict)
    ]


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def view(row: dict) -> dict:
    """A row as the API shows it, with its one line for people (``summary``)."""
    out = dict(row)
    out["size"] = size_words(row["bytes"])
    n = row["kernels"]
    kernels = f"{n} kernel{'s' if n != 1 else ''}"
    if row["state"] == "saving":
        out["summary"] = "hibernating: saving its kernels"
    elif row["state"] == "failed":
        out["summary"] = f"hibernation failed: {row['error']}"
    elif row["state"] == "hibernated":
        out["summary"] = f"hibernated at {_hhmm(row['finished'])} UTC: {kernels}, {out['size']}"
    else:
        out["summary"] = f"woken at {_hhmm(row['woken_at'])} UTC: {kernels} back"
    return out


def _hhmm(iso: str | None) -> str:
    return iso[11:16] if iso else "?"
