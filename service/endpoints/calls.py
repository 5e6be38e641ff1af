"""One call to an endpoint, from an authorised caller to a replica: the hot path.

Part of :class:`~gpulab.service.endpoints.manager.DeploymentManager`; both front doors use it (the
endpoint router of :mod:`gpulab.service.endpoints.router` and the service's own route). It

1. picks the version: the one the URL names (``/v2/models/M/versions/N/...``,
   which reaches version N whatever its weight), else by weight;
2. picks the version's least busy ready replica; where none runs (scaled to
   zero) the call waits for a cold start, up to ``endpoint_cold_start_seconds``;
3. forwards the call with the replicas' own secret and counts it
   (:class:`~gpulab.service.endpoints.traffic.UnitTraffic`) for the autoscaler and the listing.

Everything here runs per call, on the service's event loop: no database, no
lock, no await but the wait for a replica and the forward itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

from gpulab.service.endpoints.table import DEPLOYMENT_FIELDS, VERSION_FIELDS

#: ``v2/models/<name>/versions/<n>/<rest>``: the version the caller asks for.
VERSIONED = re.compile(r"^(v2/models/[^/]+)/versions/([^/]+)(/.*)?$")


class CallRefused(Exception):
    """A call that reaches no replica: the HTTP status, a message, maybe Retry-After."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class CallsMixin:
    def endpoint(self, user: str, name: str) -> dict | None:
        """The deployment an endpoint call names (as of the last second), or None."""
        dep_id = self._by_name.get((user, name))
        if dep_id is not None:
            return self._deps[dep_id].row
        dep = self.store.find(user, name)
        if dep is not None:
            self._record(dep)
        return dep

    @staticmethod
    def can_use(who, dep: dict) -> bool:
        """Owner, admins, and those it is shared with (by name or group)."""
        return (
            who.can_act_for(dep["user"])
            or who.name in dep["share_users"]
            or bool(who.groups & set(dep["share_groups"]))
        )

    def callable_endpoint(self, who, user: str, name: str) -> dict:
        """The deployment ``who`` may call as ``user/name``; CallRefused 404 for the
        caller's own that does not exist, else 403 (a stranger is not told which)."""
        dep = self.endpoint(user, name)
        if dep is not None and self.can_use(who, dep):
            return dep
        if dep is None and who.can_act_for(user):
            raise CallRefused(404, f"no deployment {name!r} of {user}")
        raise CallRefused(
            403,
            f"{who.kind} {who.name} may not call endpoint {user}/{name}: "
            f"it does not exist or is not shared with you",
        )

    def _choose(self, dep: dict, path: str):
        """``(unit, path to send)``: the version the path names, or one by weight."""
        rec = self._deps[dep["id"]]
        m = VERSIONED.match(path)
        if m:
            for unit in rec.units.values():
                if str(unit.row["version"]) == m.group(2):
                    # The replicas each serve one model: the version is ours to route.
                    return unit, m.group(1) + (m.group(3) or "")
            raise CallRefused(
                404,
                f"{dep['user']}/{dep['name']} has no version {m.group(2)}; it has "
                f"{', '.join(str(u.row['version']) for u in rec.by_version())}",
            )
        weights = {vid: u.row["weight"] for vid, u in rec.units.items()}
        chosen = rec.choice.pick(weights)
        if chosen is None:
            raise CallRefused(
                503,
                f"{dep['user']}/{dep['name']} has no working version "
                f"({dep['message']}); deploy it again",
            )
        return rec.units[chosen], path

    def _ready(self, dep: dict, unit) -> list[tuple[int, str]]:
        ready = self.serving.ready_replicas(self.unit(dep, unit.row))
        if unit.draining_from is not None:
            ready = [r for r in ready if r[0] < unit.draining_from]
        return ready

    def _token(self, unit) -> str:
        if unit.token is None:
            unit.token = self.serving.token(unit.row["id"])
        return unit.token

    def endpoint_table(self) -> list[dict]:
        """Every endpoint as a call sees it now: the rows' fields a call reads, and
        per version its ready replicas ``[index, address]`` and their token (for the
        standby router, :mod:`gpulab.service.endpoints.table`)."""
        out = []
        for rec in list(self._deps.values()):
            dep = rec.row
            versions = []
            for unit in rec.by_version():
                ready = self._ready(dep, unit) if unit.row["state"] != "failed" else []
                token = None
                if ready:
                    try:
                        token = self._token(unit)
                    except OSError:  # its files are being removed: no call goes there
                        ready = []
                versions.append(
                    {
                        **{k: unit.row[k] for k in VERSION_FIELDS},
                        "ready": [list(r) for r in ready],
                        "token": token,
                    }
                )
            out.append({**{k: dep[k] for k in DEPLOYMENT_FIELDS}, "versions": versions})
        return out

    async def call(self, dep: dict, method: str, path: str, headers: dict, body: bytes | None):
        """Forward one call: ``(status, reason, headers, body)``; CallRefused if no
        replica answers."""
        unit, path = self._choose(dep, path)
        start = time.monotonic()
        ready = self._ready(dep, unit)
        if not ready:
            ready = await self._cold_start(dep, unit)
        tried: set[int] = set()
        while ready:
            replica, url = unit.traffic.least_busy(ready)
            tried.add(replica)
            unit.traffic.begin(replica)
            answer = None
            try:
                answer = await self.proxy.forward(
                    url, self._token(unit), method, path, headers, body
                )
            finally:
                error = answer is None or answer[0] >= 500
                unit.traffic.end(replica, time.monotonic() - start, error)
            if answer is not None:
                return answer
            # That replica just went away (scaled down, crashed): try another.
            ready = [r for r in self._ready(dep, unit) if r[0] not in tried]
        raise CallRefused(
            503,
            f"no replica of {dep['user']}/{dep['name']} version {unit.row['version']} "
            f"is ready ({unit.row['state']}: {unit.row['message']}); try again shortly",
            retry_after=2,
        )

    async def _cold_start(self, dep: dict, unit) -> list[tuple[int, str]]:
        """Wait for a replica of a version that has none ready (the autoscaler starts
        one when it runs none); its ready replicas, or CallRefused after the wait."""
        limit = self.limits.cold_start_seconds
        if unit.row["state"] == "failed":
            raise CallRefused(503, f"version {unit.row['version']} failed: {unit.row['message']}")
        if unit.traffic.waiting >= unit.row["max_queue"]:
            raise CallRefused(
                429,
                f"{unit.traffic.waiting} calls already wait for "
                f"{dep['user']}/{dep['name']} to start; try again shortly",
                retry_after=5,
            )
        cold = unit.row["replicas"] == 0
        start = time.monotonic()
        unit.traffic.start_wait()
        self._wake.set()
        try:
            deadline = start + limit
            while (ready := self._ready(dep, unit)) == [] and time.monotonic() < deadline:
                unit.became_ready.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        unit.became_ready.wait(), min(1.0, deadline - time.monotonic())
                    )
        finally:
            unit.traffic.end_wait()
        if not ready:
            raise CallRefused(
                503,
                f"{dep['user']}/{dep['name']} did not start within {limit:g} s "
                f"({unit.row['state']}: {unit.row['message']}); try again shortly",
                retry_after=5,
            )
        if cold:
            unit.cold_starts += 1
            unit.last_cold_start_s = round(time.monotonic() - start, 3)
        return ready
