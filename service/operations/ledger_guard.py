"""The ledger holds: a live owner's slice is not released behind its back, and a live
owner that lost its slice is found and named.

Releasing through ``/allocations`` is how the hub's spawner gives a stopped
server's slice back, and how an admin repairs the ledger. A user doing it to
their own running server (or running job, or deployment) would leave the GPU
in use while the ledger places someone else on it: a double booking. So
:func:`refuse_live_release` answers 409 with what to do instead: users stop the
owner (the slice goes with it); admins are told what holds it and may add
``?force=1``, which stops the owner first (server through the hub, job
cancelled, deployment stopped) and then releases.

:class:`LostSlices` runs with the reconcile loop and looks the other way: a
running server, running job or deployment whose slice rows are gone (released
by an admin, or lost to a bug) is logged and listed at ``GET /api/v1/ledger``
(users: their own; admins: all) and counted in ``gpulab_ledger_lost_owners``.
An owner counts as lost only when two passes in a row find it so: the moment
between placing a new owner and recording it is not a loss.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

from prometheus_client.core import GaugeMetricFamily
from tornado import web

from gpulab.scheduler.ledger import OWNER_KINDS
from gpulab.scheduler.slices import SliceError, parse_gpu_milli
from gpulab.service.auth import APIHandler, Identity

log = logging.getLogger("gpulab.service")

#: How long a forced release waits for the hub to stop a server, in seconds.
STOP_WAIT_S = 120.0
#: The spawn form on Kubernetes names a size as a profile slug, ``gpu-250``.
_PROFILE_PREFIX = "gpu-"


async def refuse_live_release(
    service, who: Identity, owner_kind: str, owner: str, force: bool = False
) -> str | None:
    """409 when a slice is to be released while its live owner still holds it.

    The hub's spawner releases a stopped server's slice: never refused. A user is
    told to stop the owner. An admin is told what holds it and that ``force``
    stops it; with ``force`` the owner is stopped first (the server through the
    hub, the job cancelled, the deployment stopped) and what was stopped is
    returned, for the audit trail."""
    if who.internal:
        return None
    holder = await _holder(service, owner_kind, owner)
    if holder is None:
        return None
    what, how, stop = holder
    if not who.admin:
        raise web.HTTPError(409, f"{what}: {how}; its slice stays allocated while it runs")
    if not force:
        raise web.HTTPError(
            409, f"{what} and holds this slice: add ?force=1 to stop it and release the slice"
        )
    log.warning("Admin %s releases the slice of %s: stopping it first", who.name, what)
    await stop(f"stopped by admin {who.name} to release its slice")
    return what


async def _holder(service, owner_kind: str, owner: str):
    """``(what runs, what its user does instead, a coroutine function that stops it)``
    when ``owner`` is alive; None when it is gone."""
    if owner_kind == "server":
        user, _, name = owner.partition("/")
        if name in await service.hub.user_servers(user):
            label = f"{user}'s server" + (f" {name!r}" if name else "")

            async def stop_server(_reason: str) -> None:
                await service.hub.stop_server(user, name)
                await _gone(lambda: _server_gone(service, user, name), f"{label} to stop")

            return f"{label} is running", "stop the server to release its slice", stop_server
        return None
    head = owner.split("/", 1)[0]
    if owner_kind == "job":
        job = service.jobs.queue.get(head) if service.jobs is not None else None
        if job and job["state"] in ("queued", "running"):

            async def cancel(reason: str) -> None:
                await service.jobs.cancel(job, reason)

            return (
                f"job {head} is {job['state']}",
                f"cancel the job (DELETE /api/v1/jobs/{head}) to release its slices",
                cancel,
            )
        return None
    deployments = service.deployments
    if deployments is None:
        return None
    # A replica's owner is ``<version id>/<replica>``; version 1's id is the deployment's.
    version = deployments.store.version(head)
    dep = deployments.store.get(version["deployment_id"] if version else head)
    if dep and dep["state"] != "failed":

        async def stop_deployment(reason: str) -> None:
            await deployments.stop_deployment(dep, reason)

        return (
            f"deployment {dep['user']}/{dep['name']} is {dep['state']}",
            f"stop it (DELETE /api/v1/deployments/{dep['name']}) to release its slices",
            stop_deployment,
        )
    return None


async def _server_gone(service, user: str, name: str) -> bool:
    return name not in await service.hub.user_servers(user)


async def _gone(check, what: str, timeout: float = STOP_WAIT_S) -> None:
    """Wait until ``check()`` is true: the hub answers a stop before it is done."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise web.HTTPError(
                409, f"waited {timeout:.0f} s for {what}; it is still stopping: try again"
            )
        await asyncio.sleep(0.5)


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
