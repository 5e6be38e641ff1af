"""Growing and shrinking a version's replicas: the autoscaler's decisions carried out.

Every pass of the deployment loop hands each version's traffic to
:class:`~gpulab.service.endpoints.autoscale.Autoscaler` (:meth:`Scaling.autoscale`); a
change runs in a task of its own, so calls and other versions are not held up:

* **up**: one slice per new replica from the ledger, under the owner's quota,
  as the ``serving`` class. When none is free, batch jobs may be preempted for
  it (a claim, as for a new endpoint); otherwise the version runs what it has
  and says why (``%deploy --list``), and the next pass tries again.
* **down**: the highest replicas first get no new calls, then the calls they
  hold finish (up to ``DRAIN_S``), then they stop and their slices go back.

Where the cluster autoscales (a Kubernetes HPA), the ledger follows what it
decided (:meth:`Scaling.follow_cluster`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpulab.backend.serving_base import ServingBackend
from gpulab.db import clock as gpulab_clock
from gpulab.scheduler.ledger import NoCapacity, OwnerConflict
from gpulab.scheduler.quota import QuotaExceeded
from gpulab.scheduler.slices import plural
from gpulab.service.endpoints.live import LiveEndpoints, Unit, replica_owners, serving_unit

log = logging.getLogger("gpulab.service.endpoints.manager")

#: The longest a replica being scaled away may take to finish the calls it holds.
DRAIN_S = 30.0
#: How often a version that found no free slice asks the ledger again.
RETRY_S = 5.0


def log_scaled(dep: dict, vrow: dict, before: int, after: int) -> None:
    log.info(
        "Deployment %s/%s version %d: %d -> %d replica(s)",
        dep["user"],
        dep["name"],
        vrow["version"],
        before,
        after,
    )


@dataclass(eq=False)
class Scaling:
    """Carries out the autoscaler's decisions for the endpoints in ``live``: slices from
    ``ledger`` (``preemption`` makes room), replicas on ``serving``; each step runs
    through ``spawn`` (a task of the manager's)."""

    live: LiveEndpoints
    ledger: Any
    serving: ServingBackend
    preemption: Any
    groups_of: Callable[[str], Awaitable[dict[str, set[str]]]]
    spawn: Callable[[Awaitable[None]], None]

    @property
    def store(self):
        return self.live.store

    def _stopping(self, vrow: dict) -> bool:
        """The version, or its deployment, is being stopped (outside the lock)."""
        return (
            vrow["id"] in self.live.stopping
            or vrow["deployment_id"] in self.live.stopping_deployments
        )

    def autoscale(self, dep: dict, unit: Unit, now: float) -> None:
        """One second of the autoscaler for one version: observe, decide, act."""
        vrow = unit.row
        unit.scaler.observe(now, unit.traffic.sample())
        if unit.scaling or self.serving.cluster_autoscales(serving_unit(dep, vrow)):
            return
        if self.preemption.pending("deployment", f"{vrow['id']}/{vrow['replicas']}"):
            return  # a slice is being freed for the next replica
        want = unit.scaler.decide(now, vrow["replicas"], unit.traffic.waiting)
        if want == vrow["replicas"]:
            unit.blocked = ""
            return
        cold = vrow["replicas"] == 0 and unit.traffic.waiting
        if want > vrow["replicas"] and unit.blocked and not cold and now - unit.tried_at < RETRY_S:
            return  # found no slice a moment ago: ask the ledger again in a while
        unit.tried_at = now
        unit.scaling = True
        self.spawn(self._scale(dep, unit, want))

    async def _scale(self, dep: dict, unit, want: int) -> None:
        try:
            if want > unit.row["replicas"]:
                await self._grow(dep, unit, want)
            else:
                await self._shrink(dep, unit, want)
        except Exception:
            log.exception(
                "Scaling version %s of %s/%s", unit.row["version"], dep["user"], dep["name"]
            )
        finally:
            unit.scaling = False
            unit.draining_from = None

    async def _grow(self, dep: dict, unit, want: int) -> None:
        vrow = unit.row
        have = vrow["replicas"]
        rows: list[dict] = []
        reason = ""
        if vrow["gpu_milli"]:
            groups = await self.groups_of(dep["user"])
            for owner in replica_owners(vrow, range(have, want)):
                try:
                    rows += await self.ledger.aio.allocate(
                        dep["user"], "deployment", owner, vrow["gpu_milli"], groups
                    )
                except NoCapacity as e:
                    reason = f"no free slice for more ({e})"
                    if not rows:
                        claim = await self.preemption.make_room_for(
                            dep["user"], "deployment", [(owner, vrow["gpu_milli"])]
                        )
                        if claim is not None:
                            reason = claim.message()
                    break
                except (QuotaExceeded, OwnerConflict) as e:
                    reason = str(e)
                    break
        placed = have + (len(rows) if vrow["gpu_milli"] else want - have)
        unit.blocked = f"wants {plural(want, 'replica')}, runs {placed}: {reason}" if reason else ""
        if placed > have:
            await self._launch_more(dep, unit, placed, rows)

    async def _launch_more(self, dep: dict, unit, placed: int, rows: list[dict]) -> None:
        async with self.live.lock:
            vrow = self.store.version(unit.row["id"])
            if vrow is None or vrow["state"] == "failed" or self._stopping(vrow):  # meanwhile
                for row in rows:
                    await self.ledger.aio.release("deployment", row["owner"])
                return
            have = vrow["replicas"]
            self.store.update_version(vrow["id"], replicas=placed)
            if have == 0:
                self.store.update_version(vrow["id"], state="starting", message="cold start")
            await self.serving.scale(serving_unit(dep, vrow), placed, rows)
            unit.row = self.store.version(vrow["id"])
            unit.scaler.changed(gpulab_clock.monotonic())
        log_scaled(dep, vrow, have, placed)

    async def grow_with(self, dep: dict, vrow: dict, members, rows: list[dict]) -> bool:
        """A claim placed the slice the autoscaler waited for: launch that replica.
        False when the version no longer wants it (its slices are then released)."""
        replica = int(members[0][0].rsplit("/", 1)[1])
        unit = self.live.unit(dep["id"], vrow["id"])
        if (
            unit is None
            or vrow["state"] == "failed"
            or self._stopping(vrow)
            or replica != vrow["replicas"]
        ):
            return False
        self.store.update_version(vrow["id"], replicas=replica + 1)
        await self.serving.scale(serving_unit(dep, vrow), replica + 1, rows)
        unit.row = self.store.version(vrow["id"])
        unit.blocked = ""
        unit.scaler.changed(gpulab_clock.monotonic())
        return True

    async def _shrink(self, dep: dict, unit, want: int) -> None:
        vrow = unit.row
        have = vrow["replicas"]
        unit.draining_from = want  # no new calls to the replicas going away
        # Real time: the calls being drained are real, a fake clock must not cut them off.
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and any(
            unit.traffic.inflight.get(r) for r in range(want, have)
        ):
            await asyncio.sleep(0.05)
        async with self.live.lock:
            current = self.store.version(vrow["id"])
            if current is None or current["state"] == "failed" or self._stopping(current):
                return
            before = serving_unit(dep, current)
            # From now on the version runs ``want``: the loop looks at those alone (and
            # restarts none of the others), calls go to those alone.
            self.store.update_version(vrow["id"], replicas=want)
            unit.row = self.store.version(vrow["id"])
            unit.scaler.changed(gpulab_clock.monotonic())
            if want < unit.ready:
                unit.ready = want
        # The replicas going away are stopped outside the lock (a process may be slow to
        # die: nobody else's change waits for it), then their slices go back. The scale
        # step is not over until then (``unit.scaling``): the autoscaler waits for it.
        await self.serving.scale(before, want, [])
        for owner in replica_owners(current, range(want, have)):
            await self.ledger.aio.release("deployment", owner)
        log_scaled(dep, vrow, have, want)

    async def follow_cluster(self, dep: dict, vrow: dict, replicas: int) -> None:
        """The cluster's autoscaler runs ``replicas`` of the version: the ledger follows
        (best effort: there the cluster's scheduler, not the ledger, places the pods)."""
        have = vrow["replicas"]
        for owner in replica_owners(vrow, range(replicas, have)):
            await self.ledger.aio.release("deployment", owner)
        if not vrow["gpu_milli"]:
            return
        groups = await self.groups_of(dep["user"])
        for owner in replica_owners(vrow, range(have, replicas)):
            try:
                await self.ledger.aio.allocate(
                    dep["user"], "deployment", owner, vrow["gpu_milli"], groups
                )
            except (NoCapacity, QuotaExceeded, OwnerConflict) as e:
                log.warning("The cluster runs replica %s beyond the ledger: %s", owner, e)
