"""When idle servers hibernate, and how much of it is kept: ``c.Hibernation.*`` in
the service's config, read by :class:`~gpulab.service.hibernation.manager.Hibernations`."""

from __future__ import annotations

import os

from traitlets import Float, Int, Unicode, default, validate
from traitlets.config import Configurable

from ..setting_checks import positive, zero_or_more


class Hibernation(Configurable):
    """Hibernation of idle servers: each kernel's variables saved to the user's own
    files, the server stopped and its slice given back."""

    hibernate_idle_seconds = Float(
        0.0,
        help="""Hibernate a server holding a GPU slice once no kernel of it has been busy
        (and, on a real GPU, its GPU has done no work) for this long: each kernel's
        variables are saved to the user's own files, the server stops and its slice
        goes back; starting it again brings the variables back. 0: never (users and
        the scheduler still may).

        c.Hibernation.hibernate_idle_seconds = 3600
        """,
    ).tag(config=True)

    hibernate_for_others_seconds = Float(
        300.0,
        help="""A server idle this long may be hibernated to make room for another user's
        server or endpoint of its class or higher, before any running batch job is
        stopped. 0: never.

        c.Hibernation.hibernate_for_others_seconds = 900
        """,
    ).tag(config=True)

    hibernate_max_bytes = Int(
        20 * 10**9,
        help="""Most bytes of hibernated state kept per user (their files, under
        ~/.gpulab/hibernate): a hibernation larger than this fails and the server
        runs on; older hibernations are removed to stay under it.

        c.Hibernation.hibernate_max_bytes = 50 * 10**9
        """,
    ).tag(config=True)

    servers_url = Unicode(
        help="""Where the service reaches users' servers: the hub's proxy, as seen from
        the service (hibernation asks a server's kernels to save themselves there).
        Default: $GPULAB_SERVERS_URL. The chart sets http://proxy-public.

        c.Hibernation.servers_url = "http://127.0.0.1:8000"
        """,
    ).tag(config=True)

    @default("servers_url")
    def _default_servers_url(self):
        return os.environ.get("GPULAB_SERVERS_URL", "")

    @validate("hibernate_max_bytes")
    def _positive(self, proposal):
        return positive(proposal)

    @validate("hibernate_idle_seconds", "hibernate_for_others_seconds")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "off")
