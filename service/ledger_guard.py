"""The ledger holds: a live owner's slice is not released behind its back, and a live
owner that lost its slice is found and named.

Releasing through ``/allocations`` is how the hub's spawner gives a stopped
server's slice back, and how an admin repairs the ledger. A user doing it to
their own running server (or running job, or deployment) would leave the GPU
in use while the ledger places someone else on it: a double booking. So for
users, :func:`refuse_live_release` answers 409 with what to do instead; the
slice goes when its owner stops.

:class:`LostSlices` runs with the reconcile loop and looks the other way: a
running server, running job or deployment whose slice rows are gone (released
by an admin, or lost to a bug) is logged and listed at ``GET /api/v1/ledger``
(users: their own; admins: all) and counted in ``gpulab_ledger_lost_owners``.
An owner counts as lost only when two passes in a row find it so: the moment
between placing a new owner and recording it is not a loss.
"""

from __future__ import annotations

import datetime as dt
import logging

from prometheus_client.core import GaugeMetricFamily
from tornado import web

from gpulab.scheduler.ledger import OWNER_KINDS
from gpulab.scheduler.slices import SliceError, parse_gpu_milli

from .auth import APIHandler, Identity

log = logging.getLogger("gpulab.service")

#: The spawn form on Kubernetes names a size as a profile slug, ``gpu-250``.
_PROFILE_PREFIX = "gpu-"


async def refuse_live_release(service, who: Identity, owner_kind: str, owner: str) -> None:
    """409 when a user asks to release a slice its live owner still holds."""
    if who.internal or who.admin:
        return  # the spawner releases a stopped server's slice; admins repair
    reason = await _live(service, owner_kind, owner)
    if reason:
        raise web.HTTPError(409, f"{reason}; its slice stays allocated while it runs")


async def _live(service, owner_kind: str, owner: str) -> str | None:
    """What to do instead of releasing, if ``owner`` is alive; None if it is gone."""
    if owner_kind == "server":
        user, _, name = owner.partition("/")
        if name in await service.hub.user_servers(user):
            label = f"{user}'s server" + (f" {name!r}" if name else "")
            return f"{label} is running: stop the server to release its slice"
        return None
    head = owner.split("/", 1)[0]
    if owner_kind == "job":
        job = service.jobs.queue.get(head) if service.jobs is not None else None
        if job and job["state"] in ("queued", "running"):
            return (
                f"job {head} is {job['state']}: cancel the job "
                f"(DELETE /api/v1/jobs/{head}) to release its slices"
            )
        return None
    deployments = service.deployments
    dep = deployments.store.get(head) if deployments is not None else None
    if dep and dep["state"] != "failed":
        return (
            f"deployment {dep['name']!r} is {dep['state']}: stop it "
            f"(DELETE /api/v1/deployments/{dep['name']}) to release its slices"
        )
    return None


def _server_milli(model: dict) -> int:
    options = model.get("user_options") or {}
    value = options.get("gpu_milli")
    profile = options.get("profile")
    if value is None and isinstance(profile, str) and profile.startswith(_PROFILE_PREFIX):
        value = profile[len(_PROFILE_PREFIX) :]
    try:
        return parse_gpu_milli(value if value is not None else 0)
    except SliceError:
        return 0


class LostSlices:
    """Live owners that hold no slice, as of the last reconcile pass."""

    def __init__(self, service):
        self.service = service
        self.checked: str | None = None
        self.lost: list[dict] = []
        self._suspects: dict[tuple[str, str], dict] = {}

    async def check(self) -> list[dict]:
        svc = self.service
        servers = await svc.hub.active_server_models()
        # After the hub's answer: a server that stopped meanwhile has no row, but
        # it is no longer in the next pass's answer either.
        held = {(a["owner_kind"], a["owner"]) for a in await svc.ledger.aio.list()}
        found = {}
        for owner, model in servers.items():
            milli = _server_milli(model)
            if (
                milli
                and model.get("ready")
                and not model.get("pending")
                and ("server", owner) not in held
            ):
                found[("server", owner)] = {
                    "owner_kind": "server",
                    "owner": owner,
                    "user": owner.split("/")[0],
                    "milli": milli,
                    "message": f"server {owner} is running with {milli} "
                    f"milli-GPU but holds no slice",
                }
        for job in svc.jobs.queue.list(states=("running",)) if svc.jobs is not None else []:
            missing = [
                r
                for r in range(job["nodes"] * job["nproc_per_node"])
                if job["gpu_milli"] and ("job", f"{job['id']}/{r}") not in held
            ]
            if missing:
                found[("job", job["id"])] = {
                    "owner_kind": "job",
                    "owner": job["id"],
                    "user": job["user"],
                    "milli": job["gpu_milli"] * len(missing),
                    "message": f"job {job['id']} is running but rank(s) "
                    f"{', '.join(map(str, missing))} hold no slice",
                }
        deployments = svc.deployments
        for dep in deployments.store.list() if deployments is not None else []:
            missing = [
                r
                for r in range(dep["replicas"])
                if dep["gpu_milli"]
                and dep["state"] != "failed"
                and ("deployment", f"{dep['id']}/{r}") not in held
            ]
            if missing:
                found[("deployment", dep["id"])] = {
                    "owner_kind": "deployment",
                    "owner": dep["id"],
                    "user": dep["user"],
                    "milli": dep["gpu_milli"] * len(missing),
                    "message": f"deployment {dep['user']}/{dep['name']} is {dep['state']} but "
                    f"replica(s) {', '.join(map(str, missing))} hold no slice",
                }
        confirmed = [v for k, v in found.items() if k in self._suspects]
        known = {(x["owner_kind"], x["owner"]) for x in self.lost}
        for item in confirmed:
            if (item["owner_kind"], item["owner"]) not in known:
                log.warning(
                    "Ledger: %s; its GPU may be given to someone else. Stop and "
                    "start it again to place it anew.",
                    item["message"],
                )
        self._suspects = found
        self.lost = confirmed
        self.checked = dt.datetime.now(dt.UTC).isoformat()
        return confirmed

    def collect(self):
        gauge = GaugeMetricFamily(
            "gpulab_ledger_lost_owners",
            "Live servers, jobs and deployments that hold no slice.",
            labels=["owner_kind"],
        )
        for kind in OWNER_KINDS:
            gauge.add_metric([kind], sum(x["owner_kind"] == kind for x in self.lost))
        yield gauge


class LedgerHandler(APIHandler):
    def get(self):
        user = self.listed_user("ledger findings")
        check: LostSlices = self.gpulab.lost_slices
        self.write_json(
            {
                "checked": check.checked,
                "lost": [x for x in check.lost if user is None or x["user"] == user],
            }
        )


routes = [(r"api/v1/ledger", LedgerHandler)]
