"""The hub admin page's "GPU slices" table: every running server's slice, read from
the spawners in the hub's memory (no request to the gpulab service while the page
renders).

Wired by :func:`gpulab.hub_ext.hub_config.configure` as a JupyterHub template
variable (``c.JupyterHub.template_vars``: a callable gets the current user), used
by ``hub_ext/templates/hub_pages/admin.html``; and what a user's own servers hold,
in the navigation bar of every hub page (:func:`held_by_servers`).
"""

from __future__ import annotations

import datetime as dt

from gpulab.scheduler.slices import label as gpu_label


def since(started: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """``3 min ago`` (the hub keeps ``started`` in UTC, without a zone)."""
    if started is None:
        return ""
    if started.tzinfo is None:
        started = started.replace(tzinfo=dt.UTC)
    s = max(0, int(((now or dt.datetime.now(dt.UTC)) - started).total_seconds()))
    if s < 45:
        return "just now"
    if s < 3600:
        return f"{max(1, round(s / 60))} min ago"
    if s < 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


class SliceTable:
    """What the template calls: ``gpulab_slices.rows()``, only when it shows them."""

    def __init__(self, user):
        self.user = user

    def rows(self) -> list[dict]:
        if self.user is None or not getattr(self.user, "admin", False):
            return []
        users = self.user.settings.get("users") or {}
        return running_slices(users.values())


def running_slices(users) -> list[dict]:
    """One row per active server that gpulab placed: user, server, slice, GPU, node."""
    rows = []
    for user in users:
        for name, spawner in sorted(getattr(user, "spawners", {}).items()):
            placement = getattr(spawner, "gpulab_placement", None)
            if placement is None or not spawner.active:
                continue
            started = getattr(spawner.orm_spawner, "started", None)
            rows.append(
                {
                    "user": user.name,
                    "server": name or "default",
                    "url": user.server_url(name) if hasattr(user, "server_url") else "",
                    "size": placement.size,
                    "milli": placement.milli,
                    "gpu": placement.gpus or "no GPU",
                    "node": placement.node,
                    "memory": f"{placement.memory_mib / 1024:.3g} GiB" if placement.milli else "",
                    "simulated": placement.simulated,
                    "ready": bool(spawner.ready),
                    "started": started.isoformat() if started else "",
                    "since": since(started),
                }
            )
    return sorted(rows, key=lambda r: (r["node"], r["gpu"], r["user"]))


def held_by_servers(user) -> str:
    """What the user's running servers hold, in words ("1/4 GPU"; "" for none or no
    user): the navigation bar's ``gpulab_holds`` on every hub page."""
    if user is None:
        return ""
    milli = sum(r["milli"] for r in running_slices([user]))
    return gpu_label(milli) if milli else ""


def slices_template_var(user) -> SliceTable:
    """``c.JupyterHub.template_vars = {"gpulab_slices": slices_template_var}``."""
    return SliceTable(user)
