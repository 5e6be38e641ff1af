"""Self-healing: a GPU that faults is cordoned, and the jobs on it move elsewhere.

After every telemetry sample the service stores (the local sampler's, or one an
agent POSTs), each GPU of it is judged with
:func:`gpulab.telemetry.gpu_health.gpu_faults` against the same GPU in the node's
sample before: an XID of :data:`~gpulab.telemetry.gpu_health.CORDON_XIDS`, new
uncorrectable ECC errors, or a lost GPU. A faulty GPU is cordoned in the ledger
(by ``gpulab``, the faults as the reason), so no placement chooses it again until
an admin uncordons it (``POST /api/v1/gpus/{uuid}/uncordon``), and every job
holding a slice on it is preempted the usual way (:meth:`JobManager.move`): it
saves a checkpoint at its next step, goes back to the queue and is placed again,
on another GPU, resuming from that checkpoint. Its event log and message say why
("GPU-… was cordoned: XID 79 (GPU has fallen off the bus)").

Servers and endpoint replicas on a cordoned GPU are left where they are (their
owner or an admin restarts them; a restart is placed on a healthy GPU); the
service logs each one.

``healer.restart_stalled(job_id)`` restarts a job that makes no progress
(the JobStalled alert): its processes are stopped and it is requeued the same
way, resuming from its latest checkpoint.

Cordons and uncordons go to the audit trail (``gpu.cordon``, ``gpu.uncordon``);
``gpulab_gpu_cordoned`` (0/1 per GPU) is exported with the service's metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from gpulab.scheduler.ledger import UnknownGpu
from gpulab.service.tasks import KeptTask
from gpulab.telemetry.gpu_health import gpu_faults

log = logging.getLogger("gpulab.service.operations.self_healing")

#: Who cordons a GPU that faulted (an admin's cordon carries the admin's name).
SYSTEM = "gpulab"
#: Samples waiting to be judged, at most (a burst of agents must not grow it forever).
MAX_PENDING = 1000


class CordonCollector:
    """``gpulab_gpu_cordoned``: 1 for a GPU out of placement, 0 otherwise, read from
    the ledger at scrape time, with DCGM's labels (a MIG parent: ``gpu`` empty)."""

    def __init__(self, ledger, gpus: list):
        self.ledger = ledger
        self.gpus = gpus

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gpulab_gpu_cordoned",
            "1 when the GPU is cordoned (takes no new slices: faults or an admin), else 0.",
            labels=["hostname", "gpu", "UUID", "modelName"],
        )
        cordons = self.ledger.cordons()
        parents: dict[str, tuple[str, str]] = {}
        for g in self.gpus:
            if g.mig_parent:
                parents.setdefault(g.mig_parent, (g.node, g.model.removesuffix(" MIG")))
                continue
            family.add_metric(
                [g.node, str(g.index), g.uuid, g.model], 1 if g.uuid in cordons else 0
            )
        for uuid, (node, model) in parents.items():
            family.add_metric([node, "", uuid, model], 1 if uuid in cordons else 0)
        yield family


class SelfHealing:
    """Judges each stored sample's GPUs; cordons faulty ones and moves their jobs.
    The telemetry store hands it each sample (:meth:`observe` is its listener)."""

    def __init__(self, *, ledger, gpus: list, jobs, audit=None):
        self.ledger = ledger
        self.gpus = gpus
        self.jobs = jobs
        self.audit_log = audit  # the service's audit trail, when it keeps one
        self._pending: deque[dict] = deque(maxlen=MAX_PENDING)
        self._previous: dict[str, dict[str, dict]] = {}  # node -> uuid -> GPU before
        #: Samples judged so far (a test knows from it that the healer has caught up).
        self.judged = 0
        self._unknown: set[str] = set()  # GPUs not in the inventory, logged once
        self._left: set[tuple[str, str, str]] = set()  # servers/replicas left, logged once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task = KeptTask("gpulab-self-healing", self.run)

    # -- running -----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._pending:  # stored before the service listened
            self._wake.set()
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        self._loop = None

    def observe(self, sample: dict) -> None:
        """The telemetry store's listener: queue the sample (any thread; never blocks)."""
        self._pending.append(sample)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                sample = self._pending.popleft()
                try:
                    await self.judge(sample)
                except Exception:  # one bad sample must not stop the healing
                    log.exception("Judging the sample of %s", sample.get("node"))
                self.judged += 1

    # -- judging -----------------------------------------------------------------------
    async def judge(self, sample: dict) -> list[str]:
        """Cordon the sample's faulty GPUs and move what runs on them; their UUIDs."""
        node = sample.get("node")
        before = self._previous.get(node, {})
        now: dict[str, dict] = {}
        faulty = []
        for gpu in sample.get("gpus") or []:
            uuid = gpu.get("uuid") if isinstance(gpu, dict) else None
            if not isinstance(uuid, str) or not uuid:
                continue
            now[uuid] = gpu
            faults = gpu_faults(gpu, before.get(uuid))
            if faults:
                faulty.append(uuid)
                await self.heal(uuid, faults)
        self._previous[node] = now
        return faulty

    async def heal(self, uuid: str, faults: list[str]) -> None:
        """Cordon ``uuid`` (unless it is already) and move every job off it."""
        ledger = self.ledger
        reason = "; ".join(faults)
        # A lost GPU faults in every sample: one read, and a write only the first time.
        cordon = (await ledger.aio.run(ledger.cordons)).get(uuid)
        if cordon is None:
            try:
                cordon, made = await ledger.aio.run(ledger.cordon, uuid, reason, SYSTEM)
            except UnknownGpu:
                if uuid not in self._unknown:
                    self._unknown.add(uuid)
                    log.warning("GPU %s faulted (%s) but is not in the inventory", uuid, reason)
                return
            if made:
                log.warning("Cordoned GPU %s: %s", uuid, reason)
                await self.audit("gpu.cordon", uuid, SYSTEM, "system", reason=reason)
        await self.move_off(uuid, f"{uuid} was cordoned: {reason}")

    async def move_off(self, uuid: str, why: str) -> list[str]:
        """Preempt every job holding a slice on ``uuid`` (or its MIG devices); log the
        servers and endpoint replicas left there. The ids of the jobs asked to move."""
        on_it = {g.uuid for g in self.gpus if uuid in (g.uuid, g.mig_parent)}
        rows = [a for a in await self.ledger.aio.list() if a["gpu_uuid"] in on_it]
        moved = []
        for job_id in sorted(
            {a["owner"].split("/", 1)[0] for a in rows if a["owner_kind"] == "job"}
        ):
            if await self.jobs.move(job_id, f"a move: {why}", why):
                log.warning("Job %s moves off GPU %s", job_id, uuid)
                moved.append(job_id)
        for a in rows:
            left = (uuid, a["owner_kind"], a["owner"])
            if a["owner_kind"] != "job" and left not in self._left:
                self._left.add(left)  # a lost GPU faults every sample: say it once
                log.warning(
                    "The %s %s of %s stays on cordoned GPU %s (restart it to move it)",
                    a["owner_kind"],
                    a["owner"],
                    a["user"],
                    uuid,
                )
        return moved

    # -- restarting a stalled job --------------------------------------------------------
    async def restart_stalled(self, job_id: str, detail: str = "") -> bool:
        """Stop a job that makes no progress and requeue it; it resumes from its latest
        checkpoint. For the JobStalled alert; False if the job is not running."""
        why = "the job made no progress (JobStalled)" + (f": {detail}" if detail else "")
        restarted = await self.jobs.restart(job_id, f"a restart: {why}", why)
        if restarted:
            log.warning("Restarted stalled job %s", job_id)
        return bool(restarted)

    # -- the audit trail -----------------------------------------------------------------
    async def audit(self, action: str, uuid: str, actor: str, actor_kind: str, **detail) -> None:
        """Record a cordon change in the service's audit trail (when it keeps one)."""
        if self.audit_log is not None:
            await self.audit_log.record(action, uuid, actor=actor, actor_kind=actor_kind, **detail)
