"""What the alert rules judge: one :class:`~gpulab.service.operations.rules.Facts` snapshot per
round.

:class:`FactsBuilder` reads the service's state (telemetry, the jobs table and
each running job's ``report()`` records, the deployments, the ledger, the disks)
and keeps the little memory a snapshot needs: the samples it already looked at
(so an XID seen in any sample between two rounds counts, not only in the latest),
recent XID/ECC events, nodes seen, restart counts over time, and a read cursor
into each job's metrics file. Files and the database are read off the event loop;
the deployment manager's in-memory state is read on it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections import deque

from sqlalchemy import and_, func, select

from gpulab.db import clock as gpulab_clock
from gpulab.db.jobs import jobs as jobs_table
from gpulab.service.operations.rules import (
    GPU_FAULT_HOLD_S,
    JOB_FAILED_WINDOW_S,
    RESTART_WINDOW_S,
    Facts,
    sample_faults,
)

log = logging.getLogger("gpulab.service.operations.alerts")

#: A node that sent nothing for this long is forgotten (and its alert resolves).
FORGET_NODE_S = 86400
#: Failed jobs of one user an alert round looks at (the newest), and how much of each
#: one's message: a user's thousands of failures are not thousands of alerts.
FAILED_JOBS_PER_USER = 10
FAILED_MESSAGE_CHARS = 400
#: Where the dataset cache is, as the spawners and the agents read it.
CACHE_DIR_ENV = "GPULAB_CACHE_DIR"


def _ts(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:  # SQLite drops the zone; gpulab stores UTC
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


class _Restarts:
    """Restart counts over time, to count those within :data:`RESTART_WINDOW_S`."""

    def __init__(self):
        self._seen: dict[object, deque] = {}

    def recent(self, key, now: float, count: int, since: float | None = None) -> int:
        history = self._seen.get(key)
        if history is None:
            history = self._seen[key] = deque()
            # First seen: restarts since a start within the window all count.
            if since is not None and now - since <= RESTART_WINDOW_S:
                history.append((since, 0))
        history.append((now, count))
        while len(history) > 1 and history[1][0] <= now - RESTART_WINDOW_S:
            history.popleft()
        return max(0, count - history[0][1])

    def keep(self, keys: set) -> None:
        for key in set(self._seen) - keys:
            del self._seen[key]


class FactsBuilder:
    """What the rules judge, read once a round from the service's parts: the
    ledger and its database (on ``db_threads``), the telemetry store, the job and
    deployment managers, and the disk of ``data_dir``."""

    def __init__(
        self,
        *,
        ledger,
        engine,
        db_threads,
        telemetry,
        jobs,
        deployments,
        data_dir: str,
        clock=gpulab_clock.now,
    ):
        self.ledger = ledger
        self.engine = engine
        self.db_threads = db_threads
        self.telemetry = telemetry
        self.jobs = jobs
        self.deployments = deployments
        self.data_dir = data_dir
        self.clock = clock
        self._nodes: dict[str, float] = {}  # node -> ts of its newest sample
        self._prev: dict[str, dict] = {}  # node -> the newest sample looked at
        self._events: dict[tuple[str, str], dict] = {}  # (uuid, kind) -> latest event
        self._cursors: dict[tuple[str, str], tuple[int, float | None]] = {}
        self._job_restarts = _Restarts()
        self._replica_restarts = _Restarts()

    async def build(self) -> Facts:
        now = self.clock()
        versions = self._versions(now)  # the manager's memory: on the event loop
        facts = await self.db_threads.run(self._build, now)
        facts.versions = versions
        return facts

    def _build(self, now: float) -> Facts:
        facts = Facts(now=now)
        self._telemetry(facts)
        self._jobs(facts)
        ledger = self.ledger
        facts.allocations = ledger.list()
        for user, used in sorted(ledger.usage().items()):
            limit = ledger.quotas.user_limit(user)
            if limit is not None:
                facts.quotas.append({"user": user, "used_milli": used, "limit_milli": limit})
        facts.disks = self._disks()
        return facts

    # -- telemetry -----------------------------------------------------------------
    def _telemetry(self, facts: Facts) -> None:
        by_node = self.telemetry.since(None)
        for node, samples in by_node.items():
            samples = sorted(samples, key=lambda s: s["ts"])
            if not samples:
                continue
            prev = self._prev.get(node)
            new = [s for s in samples if prev is None or s["ts"] > prev["ts"]]
            util: dict[str, float] = {}
            for s in new:
                before = {g.get("uuid"): g for g in (prev or {}).get("gpus") or []}
                for gpu in s.get("gpus") or []:
                    uuid = gpu.get("uuid")
                    if not uuid:
                        continue
                    u = gpu.get("utilization_ratio")
                    if isinstance(u, (int, float)) and not isinstance(u, bool):
                        util[uuid] = max(util.get(uuid, 0.0), float(u))
                    for kind, fault in sample_faults(gpu, before.get(uuid)):
                        if kind != "lost":
                            self._events[(uuid, kind)] = self._event(node, gpu, kind, fault, s)
                prev = s
            latest = samples[-1]
            self._prev[node] = latest
            self._nodes[node] = max(self._nodes.get(node, 0.0), latest["ts"])
            before_latest = samples[-2] if len(samples) > 1 else None
            older = {g.get("uuid"): g for g in (before_latest or {}).get("gpus") or []}
            for gpu in latest.get("gpus") or []:
                uuid = gpu.get("uuid")
                if not uuid:
                    continue
                facts.gpus.append(
                    {
                        "node": node,
                        "index": gpu.get("index"),
                        "uuid": uuid,
                        "name": gpu.get("name"),
                        "temperature_celsius": gpu.get("temperature_celsius"),
                        "utilization_max": util.get(uuid, gpu.get("utilization_ratio")),
                    }
                )
                for kind, fault in sample_faults(gpu, older.get(uuid)):
                    if kind == "lost":
                        facts.gpu_faults.append(self._event(node, gpu, kind, fault, latest))
        for key, event in list(self._events.items()):
            if facts.now - event["at"] > GPU_FAULT_HOLD_S:
                del self._events[key]
        facts.gpu_faults.extend(self._events.values())
        for node, ts in list(self._nodes.items()):
            if facts.now - ts > FORGET_NODE_S:
                del self._nodes[node]
                self._prev.pop(node, None)
        facts.nodes = dict(self._nodes)

    @staticmethod
    def _event(node: str, gpu: dict, kind: str, fault: str, sample: dict) -> dict:
        return {
            "node": node,
            "index": gpu.get("index"),
            "uuid": gpu["uuid"],
            "kind": kind,
            "fault": fault,
            "at": sample["ts"],
        }

    # -- jobs ----------------------------------------------------------------------
    def _jobs(self, facts: Facts) -> None:
        manager = self.jobs
        running = manager.queue.list(states=("running",))
        cursors = {}
        for job in running:
            started = _ts(job["started"]) or _ts(job["submitted"])
            key = (job["id"], job["started"] or "")
            cursor, last = self._cursors.get(key, (0, None))
            if manager.backend_of(job) is not None:
                try:
                    records, cursor = manager.jobdir(job).metrics(0, cursor)
                except OSError:
                    records = []
                for r in records:
                    t = r.get("time") if isinstance(r, dict) else None
                    if isinstance(t, (int, float)) and not isinstance(t, bool):
                        last = max(last or 0.0, float(t))
            cursors[key] = (cursor, last)
            facts.running_jobs.append(
                {
                    "id": job["id"],
                    "user": job["user"],
                    "name": job["name"],
                    "started": started,
                    "last_report": max(started, last or 0.0),
                    "restarts": job["restarts"],
                    "recent_restarts": self._job_restarts.recent(
                        job["id"], facts.now, job["restarts"], started
                    ),
                }
            )
        self._cursors = cursors
        self._job_restarts.keep({j["id"] for j in running})
        facts.failed_jobs = self._failed_jobs(facts.now)

    def _failed_jobs(self, now: float) -> list[dict]:
        """Jobs failed within the window whose name their user has not submitted again
        since (a new run of it, whatever becomes of it, supersedes the failure: if it
        fails too, its own alert fires)."""
        t = jobs_table
        cutoff = dt.datetime.fromtimestamp(now - JOB_FAILED_WINDOW_S, dt.UTC)
        out = []
        # A job's message may be long (a rank's error): its start is enough for the
        # alert. And one user's thousands of failed jobs make at most a few alerts.
        message = func.substr(t.c.message, 1, FAILED_MESSAGE_CHARS).label("message")
        shown: dict[str, int] = {}
        with self.engine.connect() as conn:
            failed = conn.execute(
                select(t.c.id, t.c.user, t.c.name, t.c.submitted, t.c.finished, message)
                .where(and_(t.c.state == "failed", t.c.finished >= cutoff))
                .order_by(t.c.finished.desc())
            ).all()
            for row in failed:
                if shown.get(row.user, 0) >= FAILED_JOBS_PER_USER:
                    continue
                later = conn.execute(
                    select(t.c.id)
                    .where(
                        and_(
                            t.c.user == row.user,
                            t.c.name == row.name,
                            t.c.submitted > row.submitted,
                        )
                    )
                    .limit(1)
                ).first()
                if later is None:
                    shown[row.user] = shown.get(row.user, 0) + 1
                    out.append(
                        {
                            "id": row.id,
                            "user": row.user,
                            "name": row.name,
                            "finished": _ts(row.finished),
                            "message": row.message or "failed",
                        }
                    )
        return out

    # -- deployments -----------------------------------------------------------------
    def _versions(self, now: float) -> list[dict]:
        manager = self.deployments
        out = []
        for dep in manager.store.list():
            try:
                view = manager.view(dep)
            except Exception:  # one broken deployment must not hide the others
                log.exception("Reading deployment %s for alerts", dep.get("id"))
                continue
            for v in view["versions"]:
                key = (dep["id"], v["version"])
                out.append(
                    {
                        "deployment_id": dep["id"],
                        "user": dep["user"],
                        "name": dep["name"],
                        "version": v["version"],
                        "state": v["state"],
                        "message": v["message"],
                        "restarts": v["restarts"],
                        "recent_restarts": self._replica_restarts.recent(
                            key, now, v["restarts"], _ts(v["created"])
                        ),
                        "error_rate": v["error_rate"],
                        "requests_per_second": v["requests_per_second"],
                        "p99_latency_ms": v["p99_latency_ms"],
                    }
                )
        self._replica_restarts.keep({(v["deployment_id"], v["version"]) for v in out})
        return out

    # -- disks ---------------------------------------------------------------------
    def _disks(self) -> list[dict]:
        out, seen = [], set()
        for role, path in (
            ("data", self.data_dir),
            ("dataset_cache", os.environ.get(CACHE_DIR_ENV, "")),
        ):
            if not path or path in seen:
                continue
            seen.add(path)
            try:
                st = os.statvfs(path)
            except OSError:
                continue  # not there (yet): nothing to fill
            out.append(
                {
                    "role": role,
                    "path": path,
                    "total_bytes": st.f_blocks * st.f_frsize,
                    "free_bytes": st.f_bavail * st.f_frsize,
                }
            )
        return out
