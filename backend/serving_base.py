"""The base class of serving backends: where a deployment's replicas run.

A serving backend gets a deployment row (``id``, ``user``, ``replicas``,
``gpu_milli`` and the batching settings) whose slices the ledger has already
placed (one ledger owner ``<id>/<replica>`` each), and runs its replicas. It
knows nothing of JupyterHub; the service's deployment manager calls these hooks:

``async launch(dep, rows)``
    Start the replicas. ``rows`` are the ledger rows of its slices. Returns quickly.
``async adopt(dep, rows)``
    After a restart of the service: pick up a deployment an earlier process
    launched (replicas outlive the service), sending again whatever a crash
    between placing and launching left out.
``async check(dep) -> Health``
    Called every second or so: how many replicas answer, and the state the
    deployment is in. A backend that does not restart its replicas itself
    (:attr:`restarts_replicas` False) restarts the ones that died here, and
    answers ``failed`` for one that keeps dying.
``ready_urls(dep)``
    Base URLs where ready replicas answer, in the order to try them.
``async logs(dep, replica, max_bytes)``
    The end of one replica's log, as text ("" when there is none yet).
``async stats(dep)``
    The replicas' own metrics (Prometheus text, one per ready replica), or None
    where the service cannot ask each replica (behind a Kubernetes Service,
    Prometheus scrapes them).
``async stop(dep)``
    Stop every replica and wait until they are gone; what is already gone is fine.
``forget(dep_id)`` / ``async close()``
    Drop what is kept in memory for one deployment / for all of them.

Every backend keeps a deployment's files the same way (:mod:`.deployment_dir`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .deployment_dir import DeploymentDirs

#: Deployment states, as the REST API shows them.
STATES = ("starting", "running", "degraded", "failed")


@dataclass
class Health:
    """What one :meth:`ServingBackend.check` found."""

    ready: int  # replicas answering ready
    state: str  # one of STATES
    message: str
    restarts: int = 0  # replica restarts so far (the row's count, plus this pass's)


def follow_ready(dep: dict, ready: int) -> Health:
    """Health of a deployment whose replicas something else restarts: count the ready."""
    state = (
        "running"
        if ready >= dep["replicas"]
        else "starting"
        if dep["state"] == "starting"
        else "degraded"
    )
    message = (
        f"{ready} replica(s) ready"
        if state == "running"
        else f"{ready} of {dep['replicas']} replica(s) ready"
    )
    return Health(ready, state, message, dep["restarts"])


class ServingBackend(DeploymentDirs):
    name = "base"
    #: True where the platform restarts replicas that die (Kubernetes' Deployment
    #: controller); False where :meth:`check` does it.
    restarts_replicas = False

    async def launch(self, dep: dict, rows: list[dict]) -> None:
        raise NotImplementedError

    async def adopt(self, dep: dict, rows: list[dict]) -> None:
        raise NotImplementedError

    async def check(self, dep: dict) -> Health:
        raise NotImplementedError

    def ready_urls(self, dep: dict) -> list[str]:
        raise NotImplementedError

    async def logs(self, dep: dict, replica: int, max_bytes: int = 256 * 1024) -> str:
        raise NotImplementedError

    async def stats(self, dep: dict) -> list[str] | None:
        return None

    async def stop(self, dep: dict) -> None:
        raise NotImplementedError

    def forget(self, dep_id: str) -> None:
        pass

    async def close(self) -> None:
        pass
