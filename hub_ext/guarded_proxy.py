"""The hub's client of its proxy's API, sending the proxy's token to no port of this
machine that another account listens on.

The proxy's token routes every path, ``/hub/`` too. If the proxy dies, a user's
process may take its API port before the hub starts it again; the hub asks that port
about its routes (every ``c.JupyterHub.last_activity_interval``) and would hand the
token over with the first call.
"""

from __future__ import annotations

from jupyterhub.proxy import ConfigurableHTTPProxy

from gpulab.enforcement.peer_account import refuse_foreign_listener


class GuardedProxy(ConfigurableHTTPProxy):
    """:class:`ConfigurableHTTPProxy` whose API calls ask whose socket listens first."""

    async def api_request(self, path, method="GET", body=None):
        await refuse_foreign_listener(self.api_url, "the proxy's API")
        return await super().api_request(path, method=method, body=body)
