"""What the service keeps in memory of its endpoints, between the tables and the calls.

A call looks its endpoint up here, not in the database (:mod:`.calls`); each
version keeps its traffic, its autoscaler and how many replicas are ready
(:class:`Unit`). The deployment loop refreshes it every pass and every change
writes through it (:meth:`LiveEndpoints.record`). Every change to deployments,
from a route, the loop or a scale step, holds :attr:`LiveEndpoints.lock`, and
never waits on a replica under it (their code is their owners'): a version or
deployment being stopped is marked in :attr:`LiveEndpoints.stopping` (or
:attr:`LiveEndpoints.stopping_deployments`) under the
lock, its replicas stopped after it is released, and nothing else touches it
meanwhile.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gpulab.backend.serving_base import ServingBackend
from gpulab.db import clock as gpulab_clock
from gpulab.db.deployments import DeploymentStore
from gpulab.service.endpoints.autoscale import Autoscaler
from gpulab.service.endpoints.traffic import UnitTraffic, WeightedChoice


@dataclass
class Unit:
    """What is kept in memory of one version."""

    row: dict  # the version's row, as of the last loop pass
    scaler: Autoscaler
    traffic: UnitTraffic = field(default_factory=UnitTraffic)
    ready: int = 0
    token: str | None = None
    #: Replicas from this index on get no new calls (being scaled away); None: all do.
    draining_from: int | None = None
    scaling: bool = False  # a scale step is under way (in a task of its own)
    blocked: str = ""  # why it runs fewer replicas than the autoscaler wants
    tried_at: float = 0.0  # when it last asked the ledger for more
    cold_starts: int = 0
    last_cold_start_s: float | None = None
    became_ready: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Deployment:
    """What is kept in memory of one deployment."""

    row: dict  # as of the last loop pass (the endpoint's per-call lookup, off the database)
    units: dict[str, Unit] = field(default_factory=dict)  # version id -> Unit
    choice: WeightedChoice = field(default_factory=WeightedChoice)

    def by_version(self) -> list[Unit]:
        return sorted(self.units.values(), key=lambda u: u.row["version"])


def serving_unit(dep: dict, vrow: dict) -> dict:
    """The dict a serving backend runs: the version, with its deployment's owner,
    name and autoscaling settings."""
    return {
        **vrow,
        "user": dep["user"],
        "name": dep["name"],
        "min_replicas": dep["replicas"],
        "max_replicas": dep["max_replicas"],
        "target_inflight": dep["target_inflight"],
        "scale_down_delay_s": dep["scale_down_delay_s"],
    }


def replica_owners(vrow: dict, replicas: range | None = None) -> list[str]:
    """The ledger owners of a version's replicas (all it runs, or ``replicas``)."""
    if replicas is None:
        replicas = range(vrow["replicas"])
    return [f"{vrow['id']}/{r}" for r in replicas]


def _scaler(row: dict) -> Autoscaler:
    return Autoscaler(
        row["replicas"], row["max_replicas"], row["target_inflight"], row["scale_down_delay_s"]
    )


def scale_down_delay(row: dict, vrow: dict, gpu_floor_s: float) -> float:
    """The scale-down delay a version runs with: its deployment's, but at least
    ``gpu_floor_s`` where it holds GPU slices (c.Endpoints.min_gpu_scale_down_delay_s:
    a GPU endpoint scaled to zero after each call preempted others' jobs again at the
    next)."""
    delay = row["scale_down_delay_s"]
    return max(delay, gpu_floor_s) if vrow.get("gpu_milli") else delay


def _configure(scaler: Autoscaler, row: dict, delay: float) -> None:
    scaler.min_replicas, scaler.max_replicas = row["replicas"], row["max_replicas"]
    scaler.target_inflight = row["target_inflight"]
    scaler.scale_down_delay_s = delay


class LiveEndpoints:
    """Every deployment in memory (:class:`Deployment`), by id and by ``(user, name)``,
    over the deployments' ``store``; ``serving`` forgets a version dropped here."""

    def __init__(
        self, store: DeploymentStore, serving: ServingBackend, gpu_delay_floor_s: float = 0.0
    ):
        self.store = store
        self.serving = serving
        #: The shortest scale-down delay of a version holding GPU slices.
        self.gpu_delay_floor_s = gpu_delay_floor_s
        self.deps: dict[str, Deployment] = {}
        self._by_name: dict[tuple[str, str], str] = {}  # (user, name) -> id
        #: Held by every change to deployments (routes, the loop, scale steps).
        self.lock = asyncio.Lock()
        #: Set to run the deployment loop's next pass now (a cold start waits, a
        #: share changed who may call).
        self.wake = asyncio.Event()
        #: Ids of the versions whose replicas are being stopped outside the lock
        #: (retired, or their deployment deleted), and of the deployments being deleted
        #: (version 1's id is its deployment's: two sets): the loop, the autoscaler and
        #: calls leave them be.
        self.stopping: set[str] = set()
        self.stopping_deployments: set[str] = set()

    def record(self, row: dict, versions: list[dict] | None = None) -> Deployment:
        """Take in a deployment's row and its versions (read from the store when not
        given); new versions get an autoscaler whose delay counts from now."""
        rec = self.deps.get(row["id"])
        if rec is None:
            rec = self.deps[row["id"]] = Deployment(row)
        rec.row = row
        self._by_name[(row["user"], row["name"])] = row["id"]
        if versions is None:
            versions = self.store.versions(row["id"])
        for vrow in versions:
            unit = rec.units.get(vrow["id"])
            if unit is None:
                unit = rec.units[vrow["id"]] = Unit(vrow, _scaler(row))
                unit.scaler.changed(gpulab_clock.monotonic())
            unit.row = vrow
            _configure(unit.scaler, row, scale_down_delay(row, vrow, self.gpu_delay_floor_s))
        for gone in set(rec.units) - {v["id"] for v in versions}:
            del rec.units[gone]
        return rec

    def drop(self, dep_id: str) -> None:
        rec = self.deps.pop(dep_id, None)
        if rec is None:
            return
        if self._by_name.get((rec.row["user"], rec.row["name"])) == dep_id:
            del self._by_name[(rec.row["user"], rec.row["name"])]
        for version_id in rec.units:
            self.serving.forget(version_id)

    def find(self, user: str, name: str) -> dict | None:
        """The deployment ``user/name`` (as of the last pass; else from the store)."""
        dep_id = self._by_name.get((user, name))
        if dep_id is not None:
            return self.deps[dep_id].row
        dep = self.store.find(user, name)
        if dep is not None:
            self.record(dep)
        return dep

    def unit(self, dep_id: str, version_id: str) -> Unit | None:
        rec = self.deps.get(dep_id)
        return rec.units.get(version_id) if rec else None

    def units(self) -> list[tuple[Deployment, Unit]]:
        """Every version in memory, with its deployment (a copy: safe across awaits)."""
        return [
            (rec, unit) for rec in list(self.deps.values()) for unit in list(rec.units.values())
        ]

    def cold_waiting(self) -> bool:
        """Some call waits for a replica of a version that runs none ready."""
        return any(u.traffic.waiting and not u.ready for _, u in self.units())
