"""The base class of backends: where a job's ranks run.

A backend gets a validated :class:`~.spec.JobSpec` whose slices the scheduler
has already placed (one ledger owner per rank), and runs it. It knows nothing
of JupyterHub; the service's job manager calls these hooks:

``check(spec)``
    Raise :class:`~.spec.SpecError` if this backend cannot run the spec (e.g. a
    comm hook its collective library lacks). Called at submit, before queueing.
``async start(spec, allocations)``
    Launch the job. ``allocations`` are the ledger rows of its ranks
    (``owner == f"{spec.id}/{rank}"``). Must return quickly; the job runs on.
``async poll(spec) -> JobStatus``
    Where the job is: ``running``, ``succeeded`` or ``failed`` (with the rank
    and root cause). Called every second or so; cheap.
``async reattach(spec) -> bool``
    After a restart of the service: pick up a job started by an earlier
    process. ``False`` if nothing of it is running (``poll`` then says how it ended).
``async cancel(spec)``
    Stop every process of the job and wait until they are gone.
``async preempt(spec)``
    Ask the ranks to checkpoint at their next step boundary and exit
    (:mod:`gpulab.training.preemption`); returns at once. Only backends with
    ``can_preempt`` are asked; the service kills what is left after the grace
    period with ``cancel``. (On Kubernetes, Kueue preempts instead.)

All backends share the job directory layout (:mod:`.jobdir`) for logs,
metrics, errors, checkpoints and the ``--out`` value: ranks write files, the
service reads them (a shared volume on Kubernetes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobdir import JobDir
from .plugin import Plugin
from .spec import JobSpec


@dataclass
class JobStatus:
    state: str  # "running", "succeeded" or "failed"
    exit_code: int | None = None
    message: str = ""
    error: dict | None = None  # {"rank", "type", "message", "traceback"}
    restarts: int = 0
    details: dict = field(default_factory=dict)


class Backend(Plugin):
    """A job backend: ``root`` is the service's jobs directory. Its settings are its
    own traits (:mod:`.plugin`)."""

    name = "base"
    #: Whether the service's scheduler may preempt this backend's jobs.
    can_preempt = False
    #: Whether each node rank of a job runs on a machine of its own (then the
    #: ledger places node ranks on distinct inventory nodes).
    nodes_apart = False
    #: Whether ranks are processes of the service's own host, held to its accounts'
    #: CPU and memory quota there (other places' nodes have quotas of their own).
    runs_on_this_host = False
    #: Whether :meth:`resize` can change a running job's node count in place.
    can_resize_in_place = False

    @property
    def jobs_root(self) -> str:
        return self.root

    def jobdir(self, job_id: str) -> JobDir:
        return JobDir(self.jobs_root, job_id)

    def check(self, spec: JobSpec) -> None:
        pass

    async def start(self, spec: JobSpec, allocations: list[dict]) -> None:
        raise NotImplementedError

    async def poll(self, spec: JobSpec) -> JobStatus:
        raise NotImplementedError

    async def reattach(self, spec: JobSpec) -> bool:
        raise NotImplementedError

    async def cancel(self, spec: JobSpec, grace_s: float | None = None) -> None:
        """Stop the job and wait until it is gone: at most ``grace_s`` seconds (None:
        the backend's own default), after which a local backend kills what is left
        and a cluster's is left to finish deleting it."""
        raise NotImplementedError

    async def resize(self, spec: JobSpec, nodes: int, allocations: list[dict]) -> bool:
        """Change a running job to ``nodes`` nodes in place (``allocations``: the slices
        it keeps); False when it cannot, and the service relaunches it instead."""
        return False

    async def close(self) -> None:
        """Let go of what the backend holds (a cluster's client) when the service stops."""

    async def preempt(self, spec: JobSpec) -> None:
        raise NotImplementedError
