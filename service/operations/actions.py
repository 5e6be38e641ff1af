"""Acting on alerts: restart stalled jobs, stop servers whose GPU idles. Both opt-in.

* ``c.Alerting.job_stall_restarts`` = N (default 0: never). When JobStalled
  fires for a job (no ``report()`` for ``job_stall_seconds``), the service stops its
  processes and requeues it; it resumes from its latest checkpoint
  (:meth:`gpulab.service.operations.self_healing.SelfHealing.restart_stalled`). At most N times per
  job, so a
  job that stalls for good is left for its owner to look at (the alert stays).
* ``c.Thresholds.gpu_idle_cull_seconds`` = S (default 0: never). SliceIdle firing
  for a server is its owner's warning (dashboard, ``%gpulab``, the webhook; its
  message says when the server stops); S seconds after it fired, if the GPU is still
  idle, the service stops the server through the hub's API and its slice goes back.
  GPU-aware: a server busy in its notebook but idle on its GPU is stopped too, which
  JupyterHub's activity-based idle culler cannot see.

Each action is written to the audit trail (``job.restart``, ``server.stop``) with
``gpulab`` as the actor and the alert's message as the reason.
"""

from __future__ import annotations

import datetime as dt
import logging

from gpulab.db import clock as gpulab_clock
from gpulab.service.tasks import KeptTask, every

log = logging.getLogger("gpulab.service.operations.actions")

SYSTEM = "gpulab"


def _epoch(iso: str | None) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else 0.0


class AlertActions:
    def __init__(
        self,
        *,
        alerts,
        healer,
        hub,
        audit=None,
        stall_restarts: int,
        cull_seconds: float,
        alert_interval: float,
        clock=gpulab_clock.now,
    ):
        self.alerts = alerts
        self.healer = healer
        self.hub = hub
        self.audit_log = audit  # the service's audit trail, when it keeps one
        self.clock = clock
        self.stall_restarts = int(stall_restarts)
        self.cull_seconds = float(cull_seconds)
        self.alert_interval = alert_interval
        self._restarted: dict[str, int] = {}  # job id -> restarts for stalling
        self._stopping: set[str] = set()  # servers asked to stop ("user/name")
        self._task = KeptTask("gpulab-gpu-idle-culling", self.loop)
        alerts.subscribe(self.on_alert)

    async def start(self) -> None:
        if self.cull_seconds > 0:
            self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    # -- stalled jobs ----------------------------------------------------------------
    async def on_alert(self, event: str, alert: dict) -> None:
        if event == "resolved" and alert["name"] == "SliceIdle":
            self._stopping.discard(alert["subject"])
        if event != "fired" or alert["name"] != "JobStalled" or self.stall_restarts <= 0:
            return
        job_id = alert["subject"]
        done = self._restarted.get(job_id, 0)
        if done >= self.stall_restarts:
            log.info("Job %s stalled again; it had its %d restart(s)", job_id, done)
            return
        if await self.healer.restart_stalled(job_id, alert["message"]):
            self._restarted[job_id] = done + 1
            await self._audit(
                "job.restart", job_id, alert["owner"], reason=alert["message"], restart=done + 1
            )

    # -- GPU-idle servers --------------------------------------------------------------
    async def loop(self) -> None:
        await every(min(30.0, max(0.5, self.alert_interval)), self.cull, "GPU-idle culling", log)

    async def cull(self) -> list[str]:
        """Stop every server whose SliceIdle warning is older than the setting."""
        stopped = []
        # An alert's "since" is when its finding was first seen; it fired once the
        # finding had held for the rule's duration, and the warning counts from then.
        held_for = self.alerts.by_name["SliceIdle"].for_s
        for alert in self.alerts.firing():
            server = alert["subject"]
            if (
                alert["name"] != "SliceIdle"
                or alert["subject_kind"] != "server"
                or server in self._stopping
                or self.clock() - (_epoch(alert["since"]) + held_for) < self.cull_seconds
            ):
                continue
            user, _, name = server.partition("/")
            self._stopping.add(server)
            await self.hub.stop_server(user, name)
            log.warning("Stopped %s's server %r: %s", user, name, alert["message"])
            await self._audit("server.stop", server, user, reason=alert["message"])
            stopped.append(server)
        return stopped

    async def _audit(self, action: str, subject: str, user: str | None, **detail) -> None:
        if self.audit_log is not None:
            await self.audit_log.record(
                action, subject, actor=SYSTEM, actor_kind="system", user=user, **detail
            )
