"""A hub user is deleted only after their gpulab work has stopped.

JupyterHub stops a user's default server before it deletes them
(``DELETE /hub/api/users/<name>``, which the admin page sends), then calls the
authenticator's ``delete_user``; a server still starting, or a named one, it
leaves running (:func:`refuse_while_servers_run` refuses those). The gpulab
service does not hear of it either: the user's training jobs and endpoints
would run on, under an account nobody owns, holding GPUs nobody can free from
the hub. So the authenticator's ``delete_user`` calls :func:`stop_work`
first: the user's schedules are deleted (else they would fire on, and a later
user given the name would inherit them, the notebooks in their jobs and the
runs' output), so are their fine-tuning jobs and training files (rows are kept by
name: a later user of it would read the training data), every job of the user that has
not ended is cancelled and every deployment stopped (the service stops the
processes, then releases their slices), their vector collections are dropped and
their name taken off every endpoint and collection shared with it (for the same
reason: sharing is by name), and the deletion goes on only when the
service lists none of them any more. If something is left (or the service does
not answer) the deletion stops with a 409 (503) that says what is left.

Then their Unix account is retired (:func:`retire`): a new user approved under
the same name later must not get the old user's home, files and processes.
"""

from __future__ import annotations

import asyncio
import copy
from urllib.parse import quote

from tornado import web

from gpulab.enforcement.accounts import AccountError, UserAccounts
from gpulab.enforcement.retired_accounts import retire_account
from gpulab.spawner.service_client import ServiceClient
from gpulab.spawner.service_traits import GpuLabServiceMixin

#: Job states that still run or wait to (``gpulab.client.states.JOB_ACTIVE``).
ACTIVE_JOB_STATES = ("queued", "running")


def service_client_for(user) -> ServiceClient | None:
    """The service as the user's spawner reaches it, or None when the hub's
    spawner is not a gpulab one (then gpulab holds no work of theirs)."""
    spawner = user.spawner
    if not isinstance(spawner, GpuLabServiceMixin) or not spawner.gpulab_api_url:
        return None
    return ServiceClient(
        spawner.gpulab_api_url, spawner.gpulab_api_token, retry_seconds=10, log=spawner.log
    )


def refuse_while_servers_run(user) -> None:
    """409 if a server of the user is still starting or running.

    JupyterHub stops only a *ready* default server before deleting a user: one
    still starting (or a named one) would run on after its user is gone."""
    busy = sorted(s.name or "default" for s in user.spawners.values() if s.active)
    if busy:
        raise web.HTTPError(
            409,
            f"{user.name}'s server ({', '.join(busy)}) is starting or running: "
            f"stop it, then delete {user.name}",
        )


async def _left(client: ServiceClient, name: str) -> tuple[list[dict], list[dict]]:
    jobs = await client.request("GET", "/jobs", query={"user": name}) or []
    deployments = await client.request("GET", "/deployments", query={"user": name}) or []
    active = [j for j in jobs if j.get("state") in ACTIVE_JOB_STATES]
    return active, deployments


async def _schedules(client: ServiceClient, name: str) -> list[dict]:
    return await client.request("GET", "/schedules", query={"user": name}) or []


def gateway_client(client: ServiceClient) -> ServiceClient:
    """The same service, token and retries at its OpenAI-compatible gateway
    (``<prefix>v1``, beside ``<prefix>api/v1``), where the fine-tuning API is."""
    gateway = copy.copy(client)
    base = client.api_url.rstrip("/")
    gateway.api_url = base.removesuffix("/api/v1") + "/v1" if base.endswith("/api/v1") else base
    return gateway


async def _fine_tuning(gateway: ServiceClient, name: str) -> tuple[list[dict], list[dict]]:
    """``name``'s fine-tuning jobs and training files, as the gateway lists them."""
    jobs = await gateway.request("GET", "/fine_tuning/jobs", query={"user": name, "limit": 1000})
    files = await gateway.request("GET", "/files", query={"user": name, "limit": 10000})
    return (jobs or {}).get("data") or [], (files or {}).get("data") or []


async def _ignore_gone(call) -> None:
    try:
        await call
    except web.HTTPError as e:
        if e.status_code != 404:  # 404: the user deleted it meanwhile
            raise


async def remove_fine_tuning(client: ServiceClient, name: str) -> int:
    """Remove ``name``'s fine-tuning jobs (their training jobs cancelled first) and
    training files; how many of both. Rows are kept by name: a later user given it
    would otherwise list them and read the files' content."""
    gateway = gateway_client(client)
    removed = 0
    for _ in range(100):  # a page at a time, until none is left
        jobs, files = await _fine_tuning(gateway, name)
        if not jobs and not files:
            return removed
        for job in jobs:
            path = f"/fine_tuning/jobs/{quote(str(job['id']), safe='')}/cancel"
            await _ignore_gone(gateway.request("POST", path, body={}, query={"remove": "1"}))
        for f in files:
            await _ignore_gone(gateway.request("DELETE", f"/files/{quote(str(f['id']), safe='')}"))
        removed += len(jobs) + len(files)
    raise web.HTTPError(
        409, f"{name}'s fine-tuning jobs and training files are still there: remove them first"
    )


async def forget_shares(client: ServiceClient, name: str) -> None:
    """Drop ``name``'s vector collections and take the name off every endpoint and
    collection shared with it: both are kept by name, so a later user given it would
    own the collections and call, or search, what was shared with the one before."""
    for c in await client.request("GET", "/collections") or []:
        path = f"/collections/{quote(c['owner'], safe='')}/{quote(c['name'], safe='')}"
        if c["owner"] == name:
            await _ignore_gone(client.request("DELETE", path))
        elif name in (c.get("share_users") or []):
            users = [u for u in c["share_users"] if u != name]
            await _ignore_gone(client.request("PATCH", path, body={"share_users": users}))
    for dep in await client.request("GET", "/deployments") or []:
        if dep["user"] != name and name in (dep.get("share_users") or []):
            users = [u for u in dep["share_users"] if u != name]
            await _ignore_gone(
                client.request(
                    "PATCH",
                    f"/deployments/{quote(dep['name'], safe='')}",
                    query={"user": dep["user"]},
                    body={"share_users": users},
                )
            )


async def stop_work(client: ServiceClient, name: str) -> tuple[int, int]:
    """Delete ``name``'s schedules, their fine-tuning jobs and training files, cancel
    their jobs and stop their deployments; (jobs, deployments) stopped.

    Raises ``HTTPError(409)`` if any is still there afterwards."""
    # The schedules go first, so none submits a job while the jobs are cancelled.
    for sched in await _schedules(client, name):
        await _ignore_gone(
            client.request("DELETE", f"/schedules/{quote(str(sched['id']), safe='')}")
        )
    # Then the fine-tuning jobs (each cancels its training job) and files.
    await remove_fine_tuning(client, name)
    jobs, deployments = await _left(client, name)
    for job in jobs:
        await client.request("DELETE", f"/jobs/{quote(str(job['id']), safe='')}")
    for dep in deployments:
        path = f"/deployments/{quote(dep['name'], safe='')}"
        await client.request("DELETE", path, query={"user": name})
    # Last, what others shared with the name, and the user's collections.
    await forget_shares(client, name)
    jobs_left, deployments_left = await _left(client, name)
    schedules_left = await _schedules(client, name)
    if jobs_left or deployments_left or schedules_left:
        raise web.HTTPError(
            409,
            f"{name} still has {len(jobs_left)} jobs and {len(deployments_left)} endpoints "
            f"running and {len(schedules_left)} schedules: stop them first (DELETE "
            f"/jobs/<id>, /deployments/<name>?user={name}, /schedules/<id>)",
        )
    return len(jobs), len(deployments)


async def retire(config, name: str, log) -> None:
    """Retire ``name``'s Unix account (per-user accounts only); a 500 that says why
    if it cannot be, so the deletion stops rather than leave it to the next user of
    the name."""
    accounts = UserAccounts(config=config)
    if not accounts.enabled:
        return
    try:
        retired = await asyncio.get_running_loop().run_in_executor(
            None, retire_account, accounts, name
        )
    except AccountError as e:
        raise web.HTTPError(500, f"{name} is not deleted: {e}") from None
    if retired:
        log.info("Deleting %s: Unix account %s locked, its home kept", name, retired)
