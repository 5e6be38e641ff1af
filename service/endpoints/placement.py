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
import contextlib
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


def _dir_bytes(path: str) -> int | None:
    """The bytes of the files under ``path``; None when it is gone."""
    if not os.path.isdir(path):
        return None
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}".removesuffix(".0") + " MiB"


def model_message(cap: int) -> Callable[[int], str]:
    return lambda declared: (
        f"the model archive expands to more than {cap / 2**20:g} MiB (at least "
        f"{_mib(declared)}); export a smaller model or quantize it (%quantize); an admin "
        f"can raise c.Endpoints.max_model_mib"
    )


def quota_message(used: int, quota: int) -> Callable[[int], str]:
    left = max(0, quota - used)
    return lambda declared: (
        f"the model unpacks to more than the {_mib(left)} left of your model storage (at "
        f"least {_mib(declared)}; you use {_mib(used)} of your {_mib(quota)}, "
        f"c.Endpoints.model_storage_quota_mib): stop a deployment you no longer need "
        f"(%deploy --stop NAME), or export a smaller model or quantize it (%quantize)"
    )


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
    #: Per user, the lock one upload at a time is counted and unpacked under.
    _unpacking: dict[str, asyncio.Lock] = field(default_factory=dict)
    #: Per user, versions unpacked whose rows may not be stored yet (counted too).
    _unstored: dict[str, set[str]] = field(default_factory=dict)

    def rows(self, vrow: dict) -> list[dict]:
        """The ledger rows of the slices a version's replicas hold."""
        return [
            r
            for o in replica_owners(vrow)
            for r in self.ledger.list(owner_kind="deployment", owner=o)
        ]

    async def unpack(self, user: str, version_id: str, model_tar: str, unit: dict) -> None:
        """The uploaded model into the version's directory, within the model's cap and
        what is left of ``user``'s model storage quota; the batch size checked."""
        # One upload of a user's at a time is counted and unpacked: two at once would
        # each see the room the other is about to take.
        async with self._unpacking.setdefault(user, asyncio.Lock()):
            await self._unpack(user, version_id, model_tar, unit)

    async def _unpack(self, user: str, version_id: str, model_tar: str, unit: dict) -> None:
        model_cap = self.limits.max_model_mib * 2**20
        quota = self.limits.model_storage_quota_mib * 2**20
        used = await asyncio.to_thread(self.model_bytes, user)
        if quota - used < model_cap:
            cap, too_large = max(0, quota - used), quota_message(used, quota)
        else:
            cap, too_large = model_cap, model_message(model_cap)
        model_dir = self.serving.prepare(version_id)
        try:
            try:
                # Decompressing can take seconds: off the event loop, so others are answered.
                card = await asyncio.get_running_loop().run_in_executor(
                    None, unpack_model, model_tar, model_dir, cap, too_large
                )
            except ArchiveRefused as e:
                raise DeployRefused(e.status, str(e)) from None
            check_batch(unit, card)
            card["name"] = unit["name"]  # the endpoint's model is called by the deployment's name
            await asyncio.to_thread(_write_json, os.path.join(model_dir, "model.json"), card)
        except BaseException:
            self.serving.remove(version_id)
            raise
        # Counted from now on, even before its row is stored (the caller stores it).
        self._unstored.setdefault(user, set()).add(version_id)

    def model_bytes(self, user: str) -> int:
        """What ``user``'s models hold on disk: every version of every deployment of
        theirs, and any just unpacked whose row is not stored yet."""
        stored = {v["id"] for d in self.store.list(user=user) for v in self.store.versions(d["id"])}
        unstored = self._unstored.get(user, set())
        total = 0
        for version_id in stored | unstored:
            size = _dir_bytes(self.serving.model_dir(version_id))
            if size is None:
                unstored.discard(version_id)  # removed (refused, or stopped)
            else:
                total += size
        unstored -= stored  # counted with the stored ones from now on
        return total

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
