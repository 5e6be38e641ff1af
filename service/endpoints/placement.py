"""A version's replicas placed and stopped: the ledger's slices and the serving backend's processes.

A new version (a new deployment, or a canary beside one) gets the slices of its
first replicas from the ledger as one gang, under its owner's quota. When none
are free, batch jobs may be preempted for them: the version then waits (its id in
:attr:`VersionPlacement.waiting`) until the claim is placed
(:meth:`~gpulab.service.endpoints.manager.DeploymentManager.claim_placed`).
Stopping a version stops its replicas, releases every slice it may hold and
removes its files.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gpulab.backend.serving_base import ServingBackend
from gpulab.db.deployments import DeploymentStore
from gpulab.scheduler.ledger import NoCapacity, OwnerConflict
from gpulab.scheduler.quota import QuotaExceeded
from gpulab.service.endpoints.live import replica_owners, serving_unit
from gpulab.service.endpoints.model_archive import ArchiveRefused, unpack_model
from gpulab.service.endpoints.settings import DeployRefused, EndpointLimits, check_batch


def _write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


@dataclass(eq=False)
class VersionPlacement:
    """Places a version's replicas on ``ledger`` (the deployments' view of it) and runs
    them on ``serving``; ``preemption`` makes room where none is free, and a waiting
    version says so in its row (``store``)."""

    store: DeploymentStore
    ledger: Any
    serving: ServingBackend
    preemption: Any
    groups_of: Callable[[str], Awaitable[dict[str, set[str]]]]
    limits: EndpointLimits
    #: Versions whose slices are being freed by preemption (not launched yet).
    waiting: set[str] = field(default_factory=set)

    def rows(self, vrow: dict) -> list[dict]:
        """The ledger rows of the slices a version's replicas hold."""
        return [
            r
            for o in replica_owners(vrow)
            for r in self.ledger.list(owner_kind="deployment", owner=o)
        ]

    async def unpack(self, version_id: str, model_tar: str, unit: dict) -> None:
        """The uploaded model into the version's directory; the batch size checked."""
        model_dir = self.serving.prepare(version_id)
        try:
            try:
                # Decompressing can take seconds: off the event loop, so others are answered.
                card = await asyncio.get_running_loop().run_in_executor(
                    None,
                    unpack_model,
                    model_tar,
                    model_dir,
                    self.limits.max_model_mib * 2**20,
                    "max_model_mib",
                )
            except ArchiveRefused as e:
                raise DeployRefused(e.status, str(e)) from None
            check_batch(unit, card)
            card["name"] = unit["name"]  # the endpoint's model is called by the deployment's name
            await asyncio.to_thread(_write_json, os.path.join(model_dir, "model.json"), card)
        except BaseException:
            self.serving.remove(version_id)
            raise

    def remove(self, version_id: str) -> None:
        """The files of a version that was never placed (its upload was refused)."""
        self.serving.remove(version_id)

    async def place_new(self, dep: dict, vrow: dict) -> None:
        """Place the slices of a new version's first replicas and launch them, or
        wait for preemption to free them. DeployRefused when neither."""
        members = (
            [(o, vrow["gpu_milli"]) for o in replica_owners(vrow)] if vrow["gpu_milli"] else []
        )
        rows: list[dict] = []
        if members:
            try:
                rows = await self.ledger.aio.allocate_gang(
                    dep["user"], "deployment", members, await self.groups_of(dep["user"])
                )
            except NoCapacity as e:
                claim = await self.preemption.make_room_for(dep["user"], "deployment", members)
                if claim is None:
                    raise DeployRefused(409, str(e)) from None
                self.waiting.add(vrow["id"])
                self.store.update_version(vrow["id"], message=claim.message())
                return
            except (QuotaExceeded, OwnerConflict) as e:
                raise DeployRefused(403 if isinstance(e, QuotaExceeded) else 409, str(e)) from None
        await self.serving.launch(serving_unit(dep, vrow), rows)

    async def stop(self, dep: dict, vrow: dict) -> int:
        """Stop a version's replicas, release its slices, remove its files; slices freed."""
        self.waiting.discard(vrow["id"])
        await self.serving.stop(serving_unit(dep, vrow))
        released = 0
        for owner in replica_owners(vrow, range(max(vrow["replicas"], dep["max_replicas"]))):
            released += len(await self.ledger.aio.release("deployment", owner))
        self.serving.remove(vrow["id"])
        return released
