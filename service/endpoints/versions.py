"""Versions of an endpoint: a canary beside the stable version, promotion, rollback.

``%deploy NEW --name X
--canary P`` uploads a new model as version n+1 of ``X`` with weight P; the
stable version keeps 100-P. One canary at a time. Promoting gives the canary
every call and stops the old version once the calls it holds are answered;
rolling back does the reverse. With ``rollback_margin`` set, the loop rolls a
canary back by itself when, over the last minute and at least
``ROLLBACK_MIN_CALLS`` of its calls, its error rate passes the stable
version's by more than the margin.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpulab.service.endpoints.live import Deployment, LiveEndpoints
from gpulab.service.endpoints.placement import VersionPlacement
from gpulab.service.endpoints.settings import DeployRefused, EndpointLimits, check_canary

log = logging.getLogger("gpulab.service.endpoints.manager")

ROLLBACK_MIN_CALLS = 20
#: The longest an old version waits for the calls it holds before it is stopped.
RETIRE_DRAIN_S = 30.0


def rollback_reason(stable: dict, canary: dict, margin: float, stable_version: int) -> str | None:
    """Why a canary should be rolled back (its window's error rate passes the stable
    version's by more than ``margin``, over enough calls), or None."""
    if canary["calls"] < ROLLBACK_MIN_CALLS:
        return None
    if canary["error_rate"] <= stable["error_rate"] + margin:
        return None
    return (
        f"rolled back automatically: {canary['error_rate']:.0%} of its calls "
        f"failed against {stable['error_rate']:.0%} for version "
        f"{stable_version} (margin {margin:.0%})"
    )


@dataclass(eq=False)
class Versions:
    """A deployment's canary, its promotion and rollback, over the endpoints in ``live``;
    a version's replicas placed and stopped by ``placement``. Each change returns the
    deployment's row as it is now (the manager makes its view); an automatic
    rollback runs through ``spawn``."""

    live: LiveEndpoints
    placement: VersionPlacement
    limits: EndpointLimits
    spawn: Callable[[Awaitable[None]], None]

    @property
    def store(self):
        return self.live.store

    async def add_canary(
        self, who, settings: dict, model_tar: str, lineage: dict | None = None
    ) -> dict:
        """Version n+1 of the deployment ``settings["name"]``, beside the stable one with
        ``settings["canary"]`` percent of the calls (``lineage``: where its model came
        from, :mod:`gpulab.service.endpoints.lineage`)."""
        name = settings.get("name")
        dep = self.store.find(who.name, name) if isinstance(name, str) else None
        if dep is None:
            raise DeployRefused(
                404,
                f"you have no deployment {name!r} to add a canary to; deploy it "
                f"first without --canary",
            )
        weight, unit = check_canary(self.limits, dep, settings)
        self._refuse_if_stopping(dep, self.store.versions(dep["id"]))
        if len(self.store.versions(dep["id"])) > 1:
            raise DeployRefused(
                409,
                f"{dep['name']} already has a canary; promote it "
                f"(%deploy --promote {dep['name']}) or roll it back "
                f"(%deploy --rollback {dep['name']}) first",
            )
        version_id = uuid.uuid4().hex[:12]
        unit["name"] = dep["name"]
        await self.placement.unpack(who.name, version_id, model_tar, unit)
        del unit["name"]
        try:
            async with self.live.lock:
                self._refuse_if_stopping(dep, self.store.versions(dep["id"]))
                if len(self.store.versions(dep["id"])) > 1:
                    raise DeployRefused(409, f"{dep['name']} already has a canary")
                stable = self.store.versions(dep["id"])[0]
                vrow = self.store.add_version(
                    dep["id"],
                    version_id,
                    weight,
                    {**unit, "replicas": max(dep["replicas"], 1)},
                    lineage=lineage,
                )
                try:
                    await self.placement.place_new(dep, vrow)
                except DeployRefused:
                    self.store.remove_version(version_id)
                    raise
                self.store.set_weights({stable["id"]: 100 - weight})
                self.live.record(self.store.get(dep["id"]))
        except BaseException:
            if self.store.version(version_id) is None:
                self.placement.remove(version_id)
            raise
        log.info(
            "Deployment %s/%s: version %d beside version %d, %d%% of calls",
            dep["user"],
            dep["name"],
            vrow["version"],
            stable["version"],
            weight,
        )
        return self.store.get(dep["id"])

    def _refuse_if_stopping(self, dep: dict, versions: list[dict]) -> None:
        """409 while the deployment, or one of its versions, is being stopped (a
        promotion or rollback under way retires a version until its replicas are gone:
        a second one at once would retire the other, and leave none)."""
        if dep["id"] in self.live.stopping_deployments:
            raise DeployRefused(409, f"{dep['name']} is being stopped")
        for v in versions:
            if v["id"] in self.live.stopping:
                raise DeployRefused(
                    409,
                    f"version {v['version']} of {dep['name']} is being retired (a promotion "
                    f"or rollback is under way); try again once it has stopped",
                )

    def _pair(self, dep: dict) -> tuple[dict, dict]:
        """The stable version and the canary (under the lock), neither being retired."""
        versions = self.store.versions(dep["id"])
        self._refuse_if_stopping(dep, versions)
        if len(versions) < 2:
            raise DeployRefused(
                409,
                f"{dep['name']} has no canary; add one with "
                f"%deploy MODEL --name {dep['name']} --canary PERCENT",
            )
        return versions[0], versions[1]

    async def promote(self, dep: dict) -> dict:
        """The canary takes every call; the old version stops."""
        async with self.live.lock:
            old, new = self._pair(dep)
            if new["state"] == "failed":
                raise DeployRefused(
                    409,
                    f"version {new['version']} of {dep['name']} failed "
                    f"({new['message']}); roll it back instead",
                )
            self.live.stopping.add(old["id"])  # retired: released by _retire
            self.store.set_weights({new["id"]: 100, old["id"]: 0})
            # New versions of this deployment start from the promoted one's settings.
            self.store.update(
                dep["id"],
                **{
                    k: new[k]
                    for k in ("gpu_milli", "max_batch_size", "max_latency_ms", "max_queue")
                },
            )
        await self._retire(dep, old, f"version {new['version']} promoted")
        return self.store.get(dep["id"])

    async def rollback(self, dep: dict, reason: str = "rolled back") -> dict:
        """The stable version takes every call again; the canary stops."""
        async with self.live.lock:
            old, new = self._pair(dep)
            if old["state"] == "failed":
                raise DeployRefused(
                    409,
                    f"version {old['version']} of {dep['name']} failed ({old['message']}); "
                    f"rolling back would leave no working version: promote version "
                    f"{new['version']} instead, or stop the deployment",
                )
            self._begin_rollback(old, new, reason)
        await self._retire(dep, new, reason)
        return self.store.get(dep["id"])

    def _begin_rollback(self, old: dict, new: dict, reason: str) -> None:
        """Under the lock: the stable version takes every call, the canary is retired."""
        self.live.stopping.add(new["id"])  # released by _retire
        self.store.set_weights({old["id"]: 100, new["id"]: 0})
        self.store.update_version(
            old["id"], message=f"takes every call: version {new['version']} {reason}"
        )

    async def _retire(self, dep: dict, vrow: dict, reason: str) -> None:
        """Stop a version that gets no more calls (marked in ``live.stopping`` under the
        lock by the caller), once the calls it holds are answered. Its replicas are
        stopped outside the lock (they may take their grace period to exit); its row
        goes under it once they are gone."""
        try:
            unit = self.live.unit(dep["id"], vrow["id"])
            if unit is not None:
                unit.draining_from = 0
                deadline = time.monotonic() + RETIRE_DRAIN_S
                while unit.traffic.busy() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            current = self.store.version(vrow["id"])
            if current is None:
                return
            released = await self.placement.stop(dep, current)
            async with self.live.lock:
                self.store.remove_version(vrow["id"])
                now = self.store.get(dep["id"])
                if now is not None:
                    self.live.record(now)
        finally:
            self.live.stopping.discard(vrow["id"])
        log.info(
            "Deployment %s/%s: version %d stopped (%s); released %d slice(s)",
            dep["user"],
            dep["name"],
            vrow["version"],
            reason,
            released,
        )

    async def check_rollback(self, dep: dict, rec: Deployment) -> None:
        """Roll the canary back when its errors pass the stable version's by the margin."""
        margin = dep["rollback_margin"]
        units = rec.by_version()
        if margin is None or len(units) < 2 or units[1].row["weight"] == 0:
            return
        if any(u.row["id"] in self.live.stopping for u in units):
            return  # a promotion or rollback is under way
        if units[0].row["state"] == "failed":
            return  # rolling back would leave no working version
        reason = rollback_reason(
            units[0].traffic.window(), units[1].traffic.window(), margin, units[0].row["version"]
        )
        if reason is not None:
            log.warning("Deployment %s/%s: canary %s", dep["user"], dep["name"], reason)
            # The loop holds the lock: the weights change now (a promotion asked
            # meanwhile is refused); the canary is stopped in a task of its own.
            old, new = units[0].row, units[1].row
            self._begin_rollback(old, new, reason)
            new["weight"], old["weight"] = 0, 100
            self.spawn(self._retire(dep, dict(new), reason))
