"""gpulab's hub pages: every page in gpulab's look with the GPU the user's servers
hold (``page.html``), the admin page with every running server's GPU slice above the
user list (``admin.html``), and the home page's "what else you hold".

One wiring for both ways gpulab runs a hub: ``gpulab up`` (:mod:`hub_config`) and
the Helm chart's ``files/hub/gpulab_hub_config.py`` (z2jh). The table's rows come
from the spawners in the hub's memory (:mod:`gpulab.spawner.admin_slices`).
"""

from __future__ import annotations

from pathlib import Path

from gpulab.spawner.admin_slices import held_by_servers, slices_template_var

#: gpulab's versions of hub pages (page.html, admin.html, home.html).
HUB_PAGES = str(Path(__file__).with_name("templates") / "hub_pages")


def show_slices_on_admin_page(c) -> None:
    """Add gpulab's hub pages and their variables (``gpulab_slices``, ``gpulab_holds``)
    to hub config ``c``, keeping the template paths and variables a site set before.
    A site's own pages, earlier in ``template_paths``, still win."""
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    c.JupyterHub.template_paths = [p for p in paths if p != HUB_PAGES] + [HUB_PAGES]
    variables = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {
        **variables,
        "gpulab_slices": slices_template_var,
        "gpulab_holds": held_by_servers,
    }
