"""What a user holds besides their server, on the hub's home page, with a button to
stop it; and everyone's, under the servers' slices on the admin page.

"Stop My Server" stops JupyterLab only: the user's endpoints keep serving and their
jobs keep running, each holding its GPU slice. The home page (gpulab's
``home.html``) therefore asks ``/hub/gpulab/held`` what else the user holds and offers
"Stop them too"; a POST there stops them (each endpoint and job, as the owner would
with ``%deploy --stop`` and ``gpulab.client.Client().cancel_job``).

The handler runs in the hub and asks the gpulab service with the hub's own token,
always for the user who is logged in (never a name from the request): a user sees
and stops only their own. A POST carries the hub's XSRF token, as the hub's own
forms do.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab.scheduler.slices import label as gpu_label
from gpulab.spawner.form import hibernation_words, ran_since
from gpulab.spawner.service_client import ServiceClient

#: The route, under the hub's prefix (/hub/).
ROUTE = r"/gpulab/held"
#: Everyone's, for the admin page's table of slices.
ALL_ROUTE = r"/gpulab/held/all"
#: Job states that hold (running) or will hold (queued) a slice.
ACTIVE_JOBS = ("queued", "running")
#: Endpoint states that no longer hold anything.
ENDED_ENDPOINTS = ("stopped", "failed")


def endpoint_milli(dep: dict) -> int:
    return sum(v["gpu_milli"] * v["replicas"] for v in dep.get("versions") or [])


def held_items(deployments: list[dict], jobs: list[dict]) -> list[dict]:
    """The user's live endpoints and jobs that outlive their server, each as the page
    names it: kind, name, the slice in words, its state."""
    items = []
    for dep in deployments:
        # One that follows the server (--stop-with-server) stops with it: not "else".
        if dep["state"] in ENDED_ENDPOINTS or dep.get("stop_with_server"):
            continue
        milli = endpoint_milli(dep)
        items.append(
            {
                "kind": "endpoint",
                "user": dep["user"],
                "id": dep["name"],
                "name": dep["name"],
                "milli": milli,
                "size": gpu_label(milli),
                "state": dep["state"],
            }
        )
    for job in jobs:
        if job["state"] not in ACTIVE_JOBS:
            continue
        milli = job["gpu_milli"] * job["world_size"]
        items.append(
            {
                "kind": "job",
                "user": job["user"],
                "id": job["id"],
                "name": job.get("name") or job["id"],
                "milli": milli if job["state"] == "running" else 0,  # queued: holds none yet
                "size": gpu_label(milli),
                "state": job["state"],
            }
        )
    return items


def waiting_servers(rows: list[dict], orm_spawners) -> list[dict]:
    """Of the service's hibernations (newest first), each server's latest whose
    notebooks have not all woken, as the home page says it: nothing for a server
    that runs (or starts) now, "stopped" for one that ran again and was stopped
    since (a plain stop), "hibernated" otherwise. ``orm_spawners``: the hub's rows
    of the user's servers, by name (when each last started or stopped)."""
    latest: dict[str, dict] = {}
    for row in rows:  # newest first
        latest.setdefault(row["server"], row)
    out = []
    for r in latest.values():
        spawner = orm_spawners.get(r["server"])
        if r["state"] != "hibernated":
            continue
        if spawner is not None and (spawner.server is not None or spawner.started):
            continue  # running: the lab says what is waiting
        stopped = ran_since(r, spawner.last_activity if spawner is not None else None)
        head, rest = hibernation_words(r, stopped, r["server"])
        state = "stopped" if stopped else "hibernated"
        out.append(
            {"server": r["server"], "id": r["id"], "state": state, "head": head, "rest": rest}
        )
    return out


class HeldHandler(BaseHandler):
    """``GET``: what the logged-in user holds besides their servers; ``POST``: stop it."""

    def service(self) -> ServiceClient:
        # The hub's token and the service's address, as the user's spawner has them.
        spawner = self.current_user.spawner
        return ServiceClient(spawner.gpulab_api_url, spawner.gpulab_api_token, retry_seconds=5)

    async def held(self) -> list[dict]:
        user = self.current_user.name
        client = self.service()
        deployments = await client.request("GET", "/deployments", query={"user": user})
        jobs = []
        for state in ACTIVE_JOBS:
            jobs += await client.request("GET", "/jobs", query={"user": user, "state": state})
        return held_items(deployments, jobs)

    async def hibernated(self) -> list[dict]:
        """The user's stopped servers whose notebooks wait to wake (each's latest
        hibernation), in words true now (:func:`waiting_servers`)."""
        rows = await self.service().request(
            "GET", "/hibernations", query={"user": self.current_user.name}
        )
        return waiting_servers(rows, self.current_user.orm_user.orm_spawners)

    @web.authenticated
    async def get(self):
        items = await self.held()
        total = sum(i["milli"] for i in items)
        self.set_header("Cache-Control", "no-store")
        self.write(
            {
                "items": items,
                "total_milli": total,
                "total": gpu_label(total),
                "hibernated": await self.hibernated(),
            }
        )

    @web.authenticated
    async def post(self):
        client = self.service()
        stopped = await self.held()

        def stop(item):
            what = "deployments" if item["kind"] == "endpoint" else "jobs"
            path = f"/{what}/{quote(item['id'], safe='')}"
            return client.request("DELETE", path, query={"user": item["user"]})

        # Together: a job's stop waits out its ranks' grace; the others need not wait.
        await asyncio.gather(*(stop(i) for i in stopped))
        self.log.info(
            "%s stopped from the home page: %s",
            self.current_user.name,
            ", ".join(f"{i['kind']} {i['name']}" for i in stopped) or "nothing",
        )
        self.write({"stopped": stopped})


class AllHeldHandler(HeldHandler):
    """``GET``: every user's endpoints and jobs that hold GPU, for admins (the admin
    page lists them under the servers' slices)."""

    @web.authenticated
    async def get(self):
        if not self.current_user.admin:
            raise web.HTTPError(403, "only admins see everyone's jobs and endpoints")
        client = self.service()
        deployments = await client.request("GET", "/deployments")
        jobs = await client.request("GET", "/jobs", query={"state": "running"})
        items = [i for i in held_items(deployments, jobs) if i["milli"]]
        items.sort(key=lambda i: (i["user"], i["kind"], i["name"]))
        self.set_header("Cache-Control", "no-store")
        self.write({"items": items})

    async def post(self):
        raise web.HTTPError(405)


def offer_to_stop_what_else_is_held(c) -> None:
    """Add the route to hub config ``c`` (the home page's template comes with gpulab's
    hub pages, :mod:`.admin_page`), keeping a site's own extra handlers."""
    handlers = list(c.JupyterHub.extra_handlers) if "extra_handlers" in c.JupyterHub else []
    ours = [(ALL_ROUTE, AllHeldHandler), (ROUTE, HeldHandler)]
    c.JupyterHub.extra_handlers = [h for h in handlers if h[0] not in (ROUTE, ALL_ROUTE)] + ours
