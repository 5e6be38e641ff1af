"""The hub admin page with every running server's GPU slice above the user list.

One wiring for both ways gpulab runs a hub: ``gpulab up`` (:mod:`hub_config`) and
the Helm chart's ``files/hub/gpulab_hub_config.py`` (z2jh). The table's rows come
from the spawners in the hub's memory (:mod:`gpulab.spawner.admin_slices`).
"""

from __future__ import annotations

from pathlib import Path

from gpulab.spawner.admin_slices import slices_template_var

#: gpulab's versions of hub pages (admin.html).
HUB_PAGES = str(Path(__file__).with_name("templates") / "hub_pages")


def show_slices_on_admin_page(c) -> None:
    """Add gpulab's admin.html and its ``gpulab_slices`` variable to hub config ``c``,
    keeping the template paths and variables a site set before. A site's own
    admin.html, earlier in ``template_paths``, still wins."""
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    c.JupyterHub.template_paths = [p for p in paths if p != HUB_PAGES] + [HUB_PAGES]
    variables = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**variables, "gpulab_slices": slices_template_var}
