"""The gpulab page of the hub (``/services/gpulab/``), in the hub's own look.

It extends JupyterHub's ``page.html`` (navigation bar, styles, dark mode) from
the installed jupyterhub package; the styles and scripts come from the hub's
``/hub/static/``. Users see their own allocations, jobs and endpoints, and the
endpoints others share with them; admins see everyone's. The owner of an endpoint
(or an admin) shares it from here: the form sends the API's ``PATCH`` with the
hub's XSRF token.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PrefixLoader, select_autoescape
from jupyterhub._data import DATA_FILES_PATH

from gpulab.service.api.page_views import (
    allocation_rows,
    endpoint_rows,
    gpu_rows,
    job_rows,
)
from gpulab.service.auth import BaseHandler

#: gpulab's page templates, then JupyterHub's (``page.html``; also as ``templates/...``).
HUB_TEMPLATES = os.path.join(DATA_FILES_PATH, "templates")
PAGE_TEMPLATES = str(Path(__file__).with_name("page_templates"))

#: Bootstrap colours of job and endpoint states.
STATE_COLORS = {
    "queued": "secondary",
    "running": "primary",
    "ready": "success",
    "succeeded": "success",
    "starting": "info",
    "failed": "danger",
    "cancelled": "dark",
    "preempted": "warning",
    "stopped": "dark",
}


def page_environment() -> Environment:
    loader = ChoiceLoader(
        [
            FileSystemLoader(PAGE_TEMPLATES),
            PrefixLoader({"templates": FileSystemLoader(HUB_TEMPLATES)}, "/"),
            FileSystemLoader(HUB_TEMPLATES),
        ]
    )
    return Environment(loader=loader, autoescape=select_autoescape(default=True))


ENV = page_environment()


class HomeHandler(BaseHandler):
    async def get(self):
        if self.identity is None:
            if self._forbidden_model is None:
                return self.redirect(self.get_login_url())
            self.require_identity()
        who = self.identity
        only = None if who.admin else who.name
        gpulab = self.gpulab
        inventory = gpulab.inventory()
        hub_prefix = self.hub_auth.hub_prefix  # "/hub/"
        base = hub_prefix[: -len("hub/")] if hub_prefix.endswith("hub/") else "/"
        public = f"{self.request.protocol}://{self.request.host}"
        # The share forms send it back (the hub's check of cookie-authenticated changes).
        xsrf_token = self.xsrf_token.decode()
        endpoints, shared = await endpoint_rows(gpulab, who, only, public)
        # The page reads the ledger and jobs: those rows are gathered and the page
        # written in a thread, not on the event loop.
        html = await asyncio.to_thread(
            lambda: ENV.get_template("gpulab.html").render(
                # What JupyterHub's page.html reads (its handlers' template_namespace).
                base_url=hub_prefix,
                prefix=base,
                user=SimpleNamespace(
                    name=who.name, json_escaped_name=json.dumps(who.name)[1:-1], admin=who.admin
                ),
                static_url=lambda path, include_version=True: f"{hub_prefix}static/{path}",
                logout_url=f"{hub_prefix}logout",
                login_url=f"{hub_prefix}login",
                parsed_scopes={"admin-ui"} if who.admin else set(),
                services=[SimpleNamespace(name="gpulab", href=gpulab.prefix)],
                admin_access=who.admin,
                no_spawner_check=True,
                xsrf_token=xsrf_token,
                version_hash="",
                # The page itself.
                scope="You are an admin: everyone's allocations, jobs and endpoints."
                if who.admin
                else "Your allocations, jobs and endpoints.",
                api_url=f"{gpulab.prefix}api/v1/",
                inventory_reason=inventory.get("reason"),
                simulated=any(g["simulated"] for n in inventory["nodes"] for g in n["gpus"]),
                gpus=gpu_rows(inventory),
                allocations=allocation_rows(gpulab, gpulab.ledger.list(user=only), only),
                jobs=job_rows(gpulab, only),
                endpoints=endpoints,
                shared=shared,
                state_colors=STATE_COLORS,
            )
        )
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(html)


routes = [(r"", HomeHandler)]
