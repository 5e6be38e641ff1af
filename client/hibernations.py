"""Hibernation through the service (``/hibernations``): a server's kernels saved to
the user's files and its slice given back, until the server starts again.

A mixin of :class:`~.base.AsyncClient`; the sync :class:`~.base.Client` has the
same methods, blocking::

    gl.hibernate()                 # this user's default server; answers at once
    gl.hibernations()              # newest first, each with its "summary" line
"""

from __future__ import annotations

import os
from urllib.parse import quote


def state_folder() -> str:
    """``~/.gpulab/hibernate`` of the account this runs as: where a server's kernels
    save their variables (one folder per hibernation) and read them back."""
    return os.path.join(os.path.expanduser("~"), ".gpulab", "hibernate")


def work_file(connection_file: str) -> str:
    """Where a kernel (its ``connection_file``) says which of its user's threads are
    alive, for the server's idle check (:mod:`gpulab.magics.kernel_work` writes it,
    :mod:`gpulab.lab.activity` reads it): beside the connection file, as the user."""
    folder, name = os.path.split(connection_file)
    return os.path.join(folder, f"gpulab-work-{name}")


class HibernationsAPI:
    async def hibernate(self, server: str = "", user: str | None = None) -> dict:
        """Start hibernating a running server (``user``: admins only): the new
        hibernation, ``state`` "saving"; :meth:`hibernations` says how it ended."""
        body = {"server": server}
        if user is not None:
            body["user"] = user
        return await self.request("POST", "/hibernations", body)

    async def hibernations(self, user: str | None = None, server: str | None = None) -> list:
        query = {k: v for k, v in (("user", user), ("server", server)) if v is not None}
        return await self.request("GET", "/hibernations", query=query or None)

    async def report_wake(self, hibernation_id: str, report: dict) -> dict:
        """Say what came back in one kernel (the kernel does this itself on waking)."""
        path = f"/hibernations/{quote(hibernation_id, safe='')}/wakes"
        return await self.request("POST", path, report)
