"""Per-call tokens for the gpulab service's calls into a user's server.

The service calls a user's running server (its kernels' activity, ``POST
gpulab/hibernate``; :mod:`gpulab.service.hibernation.servers`). The user owns that
process and may log every header it receives (a ``jupyter_server_config.py`` in
their home), so the call must not carry the service's own token. It carries a token
the hub mints here for that one call:

- owned by the server's user (the hub's logs and the audit name them, not the
  service), with the single scope ``access:servers!server=<user>/<server>``: it can
  reach that server and nothing else, not the hub's API, not the gpulab API;
- short-lived (``expires_in`` at most :data:`MAX_EXPIRES_S`), and revoked by the
  service as soon as the call has its answer;
- only for a server that is running.

Why a route of gpulab's rather than the hub's ``POST /users/{name}/tokens``: that one
needs the ``tokens`` scope, which mints any token for any user (an admin's with all
of the admin's rights). The service's role holds only :data:`SCOPE`, which mints
this one kind of token: no more than ``access:servers``, which it replaces.

    POST   /hub/api/gpulab/server-tokens        {"user", "server", "expires_in"}
           -> 201 {"token", "id", "expires_at"}
    DELETE /hub/api/gpulab/server-tokens/<id>   -> 204 (only tokens minted here)
"""

from __future__ import annotations

import json

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import has_scope
from tornado import web

#: The custom scope that may mint and revoke these tokens (the gpulab service's role).
SCOPE = "custom:gpulab:server-tokens"
SCOPE_DEFINITION = {
    "description": "Mint a short-lived token scoped to one running server, owned by its user.",
}
#: The routes, under the hub's prefix (/hub/).
ROUTE = r"/api/gpulab/server-tokens"
ONE_ROUTE = r"/api/gpulab/server-tokens/([^/]+)"
#: What the hub's token page and logs call these tokens; also how DELETE knows its own.
NOTE = "gpulab: one call of the gpulab service into this server"
#: The longest a minted token lives (a call needs it only until the server has read it).
MAX_EXPIRES_S = 300
DEFAULT_EXPIRES_S = 60


def server_scope(user: str, server: str) -> str:
    """The one scope a minted token carries."""
    return f"access:servers!server={user}/{server}"


class _ServerTokenHandler(APIHandler):
    def _allowed(self, user: str, server: str) -> None:
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if not has_scope(f"{SCOPE}!server={user}/{server}", self.parsed_scopes, db=self.db):
            raise web.HTTPError(403, f"this token lacks the scope {SCOPE}")

    def _fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))


class ServerTokensHandler(_ServerTokenHandler):
    async def post(self):
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):  # a body nested past Python's limit too
            body = None
        if not isinstance(body, dict):
            return self._fail(400, 'the body must be JSON: {"user": ..., "server": ...}')
        user_name, server = body.get("user"), body.get("server", "")
        expires_in = body.get("expires_in", DEFAULT_EXPIRES_S)
        if not isinstance(user_name, str) or not isinstance(server, str):
            return self._fail(400, "'user' and 'server' must be strings ('' is the default server)")
        if (
            not isinstance(expires_in, int)
            or isinstance(expires_in, bool)
            or not 1 <= expires_in <= MAX_EXPIRES_S
        ):
            return self._fail(400, f"'expires_in' must be 1 to {MAX_EXPIRES_S} seconds")
        self._allowed(user_name, server)
        user = self.find_user(user_name)
        spawner = user.spawners.get(server) if user is not None else None
        if spawner is None or not spawner.ready:
            return self._fail(404, f"{user_name}/{server} is not running: no token for it")
        try:
            token = user.new_api_token(
                note=NOTE, expires_in=expires_in, scopes=[server_scope(user.name, server)]
            )
        except ValueError as e:  # the user's own scopes do not reach the server
            return self._fail(400, str(e))
        row = orm.APIToken.find(self.db, token)
        self.log.info(
            "gpulab: a %d s token for %s/%s (%s)", expires_in, user.name, server, row.api_id
        )
        self.set_status(201)
        self.set_header("Content-Type", "application/json")
        self.finish(
            json.dumps(
                {
                    "token": token,
                    "id": row.api_id,
                    "expires_at": self.token_model(row)["expires_at"],
                }
            )
        )


class ServerTokenHandler(_ServerTokenHandler):
    def delete(self, token_id: str):
        if self.current_user is None or not has_scope(SCOPE, self.parsed_scopes, post_filter=True):
            raise web.HTTPError(403, f"this token lacks the scope {SCOPE}")  # before any lookup
        row = None
        if token_id.startswith("a") and token_id[1:].isdigit():
            row = self.db.query(orm.APIToken).filter_by(id=int(token_id[1:])).first()
        # Only a token minted here (its note, its one server scope): never anyone's own.
        if row is None or row.user is None or row.note != NOTE or len(row.scopes) != 1:
            return self._fail(404, f"no gpulab server token {token_id}")
        _, _, target = row.scopes[0].partition("!server=")
        user, _, server = target.partition("/")
        self._allowed(user, server)
        self.db.delete(row)
        self.db.commit()
        self.set_status(204)
        self.finish()


def mint_server_tokens(c) -> None:
    """Add the routes and the scope to hub config ``c``, keeping a site's own."""
    scopes = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    c.JupyterHub.custom_scopes = {**scopes, SCOPE: SCOPE_DEFINITION}
    handlers = list(c.JupyterHub.extra_handlers) if "extra_handlers" in c.JupyterHub else []
    ours = [(ONE_ROUTE, ServerTokenHandler), (ROUTE, ServerTokensHandler)]
    c.JupyterHub.extra_handlers = [h for h in handlers if h[0] not in (ROUTE, ONE_ROUTE)] + ours
