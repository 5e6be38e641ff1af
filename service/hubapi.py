"""The few calls the service makes to the JupyterHub REST API, with its own token.

That token goes to the hub and nowhere else: calls into users' servers carry a token
the hub mints for each call (:meth:`HubAPI.server_token`)."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.enforcement.peer_account import foreign_listener
from gpulab.service.tls import platform_client_context


class HubAPI:
    #: The hub's route that mints per-call server tokens (hub_ext/server_tokens.py).
    SERVER_TOKENS = "/gpulab/server-tokens"

    def __init__(self, api_url: str, token: str, cache_seconds: float = 10.0):
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, object]] = {}
        # internal_ssl: the hub's API is https and asks for the service's certificate.
        self._ssl = platform_client_context() if self.api_url.startswith("https:") else None

    async def _fetch(
        self, path: str, method: str = "GET", timeout: float = 30, body: dict | None = None
    ):
        foreign = foreign_listener(self.api_url)
        if foreign:  # as an unreachable hub: the callers' answer to that holds
            raise ConnectionRefusedError(f"the hub's API: {foreign}")
        req = HTTPRequest(
            f"{self.api_url}{path}",
            method=method,
            headers={"Authorization": f"token {self._token}"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=timeout,
            ssl_options=self._ssl,
        )
        return await AsyncHTTPClient().fetch(req)

    async def _get(self, path: str):
        return json.loads((await self._fetch(path)).body)

    async def _get_all(self, path: str, page: int = 200) -> list:
        # The hub pages long lists (api_page_default_limit); walk every page.
        items: list = []
        sep = "&" if "?" in path else "?"
        while True:
            batch = await self._get(f"{path}{sep}offset={len(items)}&limit={page}")
            items += batch
            if len(batch) < page:
                return items

    async def _cached(self, key: str, path: str):
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < self.cache_seconds:
            return hit[1]
        value = await (self._get_all(path) if path == "/groups" else self._get(path))
        self._cache[key] = (time.monotonic(), value)
        return value

    async def user(self, name: str) -> dict | None:
        try:
            return await self._cached(f"user:{name}", f"/users/{quote(name, safe='')}")
        except HTTPClientError as e:
            if e.code == 404:
                return None
            raise

    def forget_memberships(self) -> None:
        """Drop the kept answers about groups and users (their groups, admin flag):
        the hub said one changed, so the next question asks it again."""
        self._cache = {
            k: v for k, v in self._cache.items() if not k.startswith(("user:", "groups"))
        }

    async def admins(self) -> list[str]:
        """The names of the hub's admin users (who can raise a budget)."""
        hit = self._cache.get("admins")
        if hit and time.monotonic() - hit[0] < self.cache_seconds:
            return hit[1]
        names = sorted(u["name"] for u in await self._get_all("/users") if u.get("admin"))
        self._cache["admins"] = (time.monotonic(), names)
        return names

    async def groups(self) -> list[dict]:
        """Every group with its members and properties."""
        return await self._cached("groups", "/groups")

    async def active_servers(self) -> set[str]:
        """``user/server`` for every server that is running or starting."""
        return set(await self.active_server_models())

    async def active_server_models(self) -> dict[str, dict]:
        """``user/server`` -> the hub's server model (ready, pending, user_options)."""
        users = await self._get_all("/users?state=active")
        return {
            f"{u['name']}/{name}": model or {}
            for u in users
            for name, model in (u.get("servers") or {}).items()
        }

    async def user_servers(self, name: str) -> dict[str, dict]:
        """One user's servers now (not cached: it decides whether a slice may go)."""
        try:
            user = await self._get(f"/users/{quote(name, safe='')}")
        except HTTPClientError as e:
            if e.code == 404:
                return {}
            raise
        return user.get("servers") or {}

    async def server_token(self, user: str, server: str, expires_in: int) -> tuple[str, str]:
        """A token for one call into ``user``'s running ``server``: owned by the user,
        scoped to that server alone, living ``expires_in`` seconds
        (:mod:`gpulab.hub_ext.server_tokens`). ``(token, id)``; the id revokes it."""
        body = {"user": user, "server": server, "expires_in": int(expires_in)}
        resp = await self._fetch(self.SERVER_TOKENS, "POST", timeout=30, body=body)
        minted = json.loads(resp.body)
        return minted["token"], minted["id"]

    async def revoke_server_token(self, token_id: str) -> None:
        """Revoke a token :meth:`server_token` made; one already gone is not an error."""
        try:
            await self._fetch(f"{self.SERVER_TOKENS}/{quote(token_id, safe='')}", "DELETE")
        except HTTPClientError as e:
            if e.code != 404:
                raise

    async def stop_server(self, user: str, server: str = "") -> None:
        """Ask the hub to stop a server (needs the delete:servers scope); a server that
        is already gone is not an error."""
        path = f"/users/{quote(user, safe='')}/server"
        if server:
            path += f"s/{quote(server, safe='')}"
        try:
            await self._fetch(path, "DELETE", timeout=60)
        except HTTPClientError as e:
            if e.code != 404:
                raise
