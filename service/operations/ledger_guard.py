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

The other way round (a live owner whose slice is gone) is
:mod:`gpulab.service.operations.lost_slices`.
"""

from __future__ import annotations

import asyncio
import logging

from tornado import web

from gpulab.service.auth import Identity

log = logging.getLogger("gpulab.service")

#: How long a forced release waits for the hub to stop a server, in seconds.
STOP_WAIT_S = 120.0
#: The spawn form on Kubernetes names a size as a profile slug, ``gpu-250``.


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
