"""The base class of serving backends: where a deployment's replicas run.

A serving backend runs the replicas of one *unit*: one version of a deployment.
The unit is a dict (``id``, ``user``, ``name``, ``version``, ``replicas`` (how many
run now), ``gpu_milli``, the batching settings, and the deployment's autoscaling
settings ``min_replicas``, ``max_replicas``, ``target_inflight``,
``scale_down_delay_s``) whose slices the ledger has already placed (one ledger
owner ``<id>/<replica>`` each). Backends call it ``dep``. It knows nothing of
JupyterHub; the service's deployment manager calls these hooks:

``async launch(dep, rows)``
    Start replicas ``0..replicas-1``. ``rows`` are the ledger rows of its slices.
    Returns quickly.
``async scale(dep, replicas, rows)``
    Run ``replicas`` replicas from now on (``dep["replicas"]`` is the count before):
    start the new ones (``rows``: their slices' ledger rows), or stop the highest
    ones, letting the requests they hold finish. The manager stops sending calls
    to a replica before it scales it away.
``cluster_autoscales(dep) -> bool``
    True where the platform (a HorizontalPodAutoscaler, KEDA) decides the count;
    :meth:`check` then reports it in :attr:`Health.replicas` and the manager follows.
``async adopt(dep, rows)``
    After a restart of the service: pick up a deployment an earlier process
    launched (replicas outlive the service), sending again whatever a crash
    between placing and launching left out.
``async check(dep) -> Health``
    Called every second or so: how many replicas answer, and the state the
    deployment is in. A backend that does not restart its replicas itself
    (:attr:`restarts_replicas` False) restarts the ones that died here, and
    answers ``failed`` for one that keeps dying.
``ready_replicas(dep)``
    ``[(replica, address)]`` of the replicas that answer ready: a base URL (behind a
    Kubernetes Service: one entry, the Service, numbered 0) or ``unix:<socket path>``
    (local replicas, :mod:`.replica_http`).
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

import os
from dataclasses import dataclass

from gpulab.scheduler.slices import plural

from .deployment_dir import DeploymentDirs
from .plugin import Plugin

#: Deployment states, as the REST API shows them.
STATES = ("starting", "running", "degraded", "idle", "failed")


@dataclass
class Health:
    """What one :meth:`ServingBackend.check` found."""

    ready: int  # replicas answering ready
    state: str  # one of STATES
    message: str
    restarts: int = 0  # replica restarts so far (the row's count, plus this pass's)
    #: Where the cluster decides the count (:meth:`ServingBackend.cluster_autoscales`):
    #: how many replicas it runs now; None elsewhere.
    replicas: int | None = None


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
        f"{plural(ready, 'replica')} ready"
        if state == "running"
        else f"{ready} of {plural(dep['replicas'], 'replica')} ready"
    )
    return Health(ready, state, message, dep["restarts"])


class ServingBackend(Plugin, DeploymentDirs):
    """A serving backend: ``root`` is the service's deployments directory. Its
    settings are its own traits (:mod:`.plugin`)."""

    name = "base"
    #: True where the platform restarts replicas that die (Kubernetes' Deployment
    #: controller); False where :meth:`check` does it.
    restarts_replicas = False

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        os.makedirs(self.root, exist_ok=True)

    async def launch(self, dep: dict, rows: list[dict]) -> None:
        raise NotImplementedError

    async def adopt(self, dep: dict, rows: list[dict]) -> None:
        raise NotImplementedError

    async def scale(self, dep: dict, replicas: int, rows: list[dict]) -> None:
        raise NotImplementedError

    def cluster_autoscales(self, dep: dict) -> bool:
        return False

    async def check(self, dep: dict) -> Health:
        raise NotImplementedError

    def ready_replicas(self, dep: dict) -> list[tuple[int, str]]:
        raise NotImplementedError

    async def logs(self, dep: dict, replica: int, max_bytes: int = 256 * 1024) -> str:
        raise NotImplementedError

    async def stats(self, dep: dict) -> list[str] | None:
        return None

    async def stop(self, dep: dict) -> None:
        raise NotImplementedError

    async def suspend(self, dep: dict, grace_s: float) -> None:
        """Stop the replicas while the platform is stopped (``gpulab up``'s Ctrl-C);
        their slices stay held and the next start launches them again."""
        await self.stop(dep)

    def forget(self, dep_id: str) -> None:
        pass

    async def close(self) -> None:
        pass
