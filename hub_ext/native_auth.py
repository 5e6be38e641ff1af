"""Per-user passwords with admin approval: NativeAuthenticator, hardened for gpulab.

People sign up at ``/hub/signup`` (bcrypt-hashed password in the hub's
database) and cannot log in until an admin authorizes them at
``/hub/authorize``. On top of ``jupyterhub-nativeauthenticator`` this class

- gives the admin a working login on first start: at hub start the record of
  ``admin_name`` is created or updated, authorized, with the password in
  ``admin_password_file`` (so the file stays the admin's password);
- accepts only plain ASCII names (``username_pattern``) after folding Unicode
  compatibility forms and case, so ``Alice`` and ``ａｌｉｃｅ`` are alice
  and a Cyrillic look-alike of ``alice`` is refused at sign-up;
- pre-authorizes nobody at sign-up: NativeAuthenticator would authorize a
  sign-up under any name in ``admin_users`` that has no record yet;
- refuses a sign-up under a name a hub user already has (in any case or
  Unicode form that normalises to it), so nobody can sign up as an existing
  user and wait for an admin to approve it; the Authorize page marks any
  record whose name is a hub user's;
- makes Discard drop only the pending sign-up record: NativeAuthenticator also
  deleted the hub user of that name, whose server then ran on as an orphan
  with its slice released;
- stops a deleted user's gpulab jobs and endpoints before the record goes
  (:mod:`~gpulab.hub_ext.user_removal`);
- counts failed logins per client address, not per user name
  (:mod:`~gpulab.hub_ext.login_limits`), so wrong passwords typed for the
  admin lock out the one who typed them, not the admin;
- shows NativeAuthenticator's links (Change password, Authorize users) in
  the hub's navigation bar, and its Authorize page with JupyterHub 6's styles
  (``templates/``);
- answers bad form input (missing fields, passwords bcrypt cannot hash) with
  a 400 or a login error instead of a 500, and refuses cross-site requests to
  the GET links that approve or discard a sign-up.

Settings, in ``<data-dir>/gpulab_config.py``::

    c.GpuLabNativeAuthenticator.minimum_password_length = 12
    c.NativeAuthenticator.open_signup = True   # no approval (not recommended)
"""

from __future__ import annotations

import asyncio
import hmac
import math
import re
import unicodedata
from pathlib import Path

import bcrypt
from jinja2 import ChoiceLoader, FileSystemLoader
from jupyterhub import orm
from jupyterhub.scopes import needs_scope
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import (
    AuthorizationAreaHandler,
    ChangePasswordAdminHandler,
    ChangePasswordHandler,
    DiscardHandler,
    LoginHandler,
    SignUpHandler,
    ToggleAuthorizationHandler,
)
from nativeauthenticator.orm import UserInfo
from tornado import web
from tornado.escape import url_escape
from tornado.httputil import url_concat
from traitlets import Integer, Unicode, default

from .login_limits import SourceLockout, login_source
from .user_removal import refuse_while_servers_run, service_client_for, stop_work

TEMPLATES = str(Path(__file__).with_name("templates"))
#: bcrypt reads at most 72 bytes; bcrypt >= 5 raises on longer input.
MAX_PASSWORD_BYTES = 72
PASSWORD_FIELDS = (
    "password",
    "signup_password",
    "signup_password_confirmation",
    "old_password",
    "new_password",
    "new_password_confirmation",
)


def _too_long(password: str) -> bool:
    return len(password.encode("utf-8", "surrogatepass")) > MAX_PASSWORD_BYTES


async def password_matches(info: UserInfo, password: str) -> bool:
    """bcrypt takes a good part of a second: check in a thread, not on the hub's loop."""
    if _too_long(password):
        return False
    return await asyncio.to_thread(bcrypt.checkpw, password.encode(), info.password)


class _FormChecks:
    """Bad form input gets a 400 that says what to do, not a 500."""

    async def prepare(self):
        await super().prepare()
        if self.request.method == "POST":
            for field in PASSWORD_FIELDS:
                value = self.get_body_argument(field, None, strip=False)
                if value is not None and _too_long(value):
                    raise web.HTTPError(
                        400,
                        f"Passwords are at most {MAX_PASSWORD_BYTES} bytes; choose a shorter one.",
                    )


class _SameSiteOnly:
    """These links change state on GET: honour them only with the ``_xsrf`` token the
    Authorize page puts in them (JupyterHub's, tied to the admin's login session), so
    a link or form elsewhere cannot make an admin approve or discard a sign-up.
    (A ``Sec-Fetch-Site`` check alone passes whatever sends no such header.)"""

    async def prepare(self):
        await super().prepare()
        sent = self.get_argument("_xsrf", "")
        if not sent or not hmac.compare_digest(sent.encode(), self.xsrf_token):
            raise web.HTTPError(403, "Open this from the hub's own Authorize page.")

    @needs_scope("admin:users")
    async def get(self, name):
        if self.authenticator.get_user(name) is None:
            raise web.HTTPError(404, f"No sign-up named {name!r}.")
        return await super().get(name)


class GpuLabLoginHandler(_FormChecks, LoginHandler):
    """NativeAuthenticator's login page on JupyterHub 6.

    Its own handler breaks there: ``post`` times itself with ``self.statsd``
    (gone in JupyterHub 6) and ``_render`` refuses the arguments JupyterHub's
    error pages pass (``sync``, ``status_code``...), so every failed or bad
    login was a 500. Same page and messages, 403 on a failed login as
    JupyterHub's own.
    """

    def _render(self, login_error=None, username=None, sync=False, **ignored):
        return self.render_template(
            "native-login.html",
            sync=sync,
            next=url_escape(self.get_argument("next", default="")),
            username=username,
            login_error=login_error,
            custom_html=self.authenticator.custom_html,
            login_url=self.settings["login_url"],
            enable_signup=self.authenticator.enable_signup,
            two_factor_auth=self.authenticator.allow_2fa,
            authenticator_login_url=url_concat(
                self.authenticator.login_url(self.hub.base_url),
                {"next": self.get_argument("next", "")},
            ),
        )

    async def post(self):
        data = {
            arg: self.get_argument(arg, strip=arg == "username")
            for arg in self.request.body_arguments
            if arg != "_xsrf"
        }
        if not data.get("username") or "password" not in data:
            raise web.HTTPError(400, "Fill in both the user name and the password.")
        user = await self.login_user(data)
        if user:
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return
        error = "Invalid username or password."
        source = await asyncio.to_thread(login_source, self.request)
        wait = self.authenticator.lockout.seconds_locked(source)
        info = self.authenticator.get_user(data["username"])
        if wait:
            error = (
                f"Too many failed logins from your address: try again in {math.ceil(wait)} seconds."
            )
        elif (
            info is not None
            and not info.is_authorized
            and await password_matches(info, data["password"])
        ):
            error = f"User {info.username} has not been authorized by an administrator yet."
        self.set_status(403)
        self.finish(await self._render(login_error=error, username=data["username"]))


class GpuLabSignUpHandler(_FormChecks, SignUpHandler):
    """NativeAuthenticator's sign-up, refusing names a hub user or a sign-up has."""

    async def post(self):
        auth = self.authenticator
        name = self.get_body_argument("username", "", strip=False)
        if not (auth.enable_signup and name and auth.name_taken(name)):
            return await super().post()
        self.set_status(409)
        html = await self.render_template(
            "signup.html",
            ask_email=auth.ask_email_on_signup,
            result_message=(
                f"The name {auth.normalize_username(name)} is already in use: choose another one."
            ),
            alert="alert-danger",
            two_factor_auth=auth.allow_2fa,
            recaptcha_key=auth.recaptcha_key,
            tos=auth.tos,
        )
        self.finish(html)


class GpuLabAuthorizationAreaHandler(AuthorizationAreaHandler):
    """The Authorize page, saying which records carry the name of a hub user
    (an admin approving one gives that sign-up's password the user's account)."""

    @needs_scope("admin:users")
    async def get(self):
        records = self.db.query(UserInfo).all()
        hub_users = {}
        for info in records:
            user = self.find_user(info.username)
            if user is not None:
                hub_users[info.username] = {
                    "created": user.created,
                    "server": bool(user.active),
                }
        html = await self.render_template(
            "authorization-area.html",
            ask_email=self.authenticator.ask_email_on_signup,
            two_factor_auth=self.authenticator.allow_2fa,
            users=records,
            hub_users=hub_users,
        )
        self.finish(html)


class GpuLabChangePasswordHandler(_FormChecks, ChangePasswordHandler):
    pass


class GpuLabChangePasswordAdminHandler(_FormChecks, ChangePasswordAdminHandler):
    pass


class GpuLabToggleAuthorizationHandler(_SameSiteOnly, ToggleAuthorizationHandler):
    pass


class GpuLabDiscardHandler(_SameSiteOnly, DiscardHandler):
    """Discard drops the pending sign-up record and nothing else.

    NativeAuthenticator's also deleted the hub user of that name: a user an
    admin had created, or one with a running server, vanished from the hub
    while the server ran on and its slice was released (the GPU then given
    twice). Deleting a hub user is the admin page's (or the REST API's) job,
    which stops their server first.
    """

    @needs_scope("admin:users")
    async def get(self, name):
        info = self.authenticator.get_user(name)
        if info is None:
            raise web.HTTPError(404, f"No sign-up named {name!r}.")
        if not info.is_authorized:
            self.db.delete(info)
            self.db.commit()
        self.redirect(self.hub.base_url + "authorize")


_HARDENED = {
    LoginHandler: GpuLabLoginHandler,
    SignUpHandler: GpuLabSignUpHandler,
    ChangePasswordHandler: GpuLabChangePasswordHandler,
    ChangePasswordAdminHandler: GpuLabChangePasswordAdminHandler,
    ToggleAuthorizationHandler: GpuLabToggleAuthorizationHandler,
    DiscardHandler: GpuLabDiscardHandler,
    AuthorizationAreaHandler: GpuLabAuthorizationAreaHandler,
}


class GpuLabNativeAuthenticator(NativeAuthenticator):
    """NativeAuthenticator with a seeded admin and stricter names (see the module)."""

    admin_name = Unicode(
        "admin",
        config=True,
        help="""The user whose password is kept in admin_password_file.

        c.GpuLabNativeAuthenticator.admin_name = "admin"
        """,
    )
    admin_password_file = Unicode(
        "",
        config=True,
        help="""File holding admin_name's password. At every hub start their record is
        created or updated with it and authorized. Empty: no seeding.

        c.GpuLabNativeAuthenticator.admin_password_file = "/srv/gpulab/admin-password"
        """,
    )
    allowed_failed_logins = Integer(
        10,
        config=True,
        help="""Failed logins from one address before that address must wait
        seconds_before_next_try. Counted per client address (through the hub's
        proxy), not per user name, so nobody can lock another user out; the
        right password does not get in while the address waits. 0: no limit.

        c.GpuLabNativeAuthenticator.allowed_failed_logins = 5
        """,
    )
    seconds_before_next_try = Integer(
        60,
        config=True,
        help="""How long an address waits after allowed_failed_logins failed
        logins; its count is forgotten once it has failed nothing for this long.

        c.GpuLabNativeAuthenticator.seconds_before_next_try = 300
        """,
    )

    @default("username_pattern")
    def _ascii_names(self):
        # Also what the Unix accounts want; checked after normalize_username.
        return r"[a-z0-9][a-z0-9._-]{0,31}\Z"

    @default("username_regex")
    def _compile_pattern(self):
        # traitlets only compiles username_pattern when it is set, not for a default.
        return re.compile(self.username_pattern) if self.username_pattern else None

    @default("minimum_password_length")
    def _min_length(self):
        return 8

    @default("check_common_password")
    def _refuse_common(self):
        return True

    @default("db")
    def _hub_session(self):
        # The record table lives in the hub's database and NativeAuthenticator's
        # pages use the hub's session, so this class must use the same one.
        # Deprecated but supported in JupyterHub 6; taken here without the
        # warning JupyterHub would log on every start.
        return self._deprecated_db_session

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lockout = SourceLockout(self.allowed_failed_logins, self.seconds_before_next_try)
        self.seed_admin()

    def normalize_username(self, username: str) -> str:
        return super().normalize_username(unicodedata.normalize("NFKC", username))

    def get_authed_users(self):
        # Only approved records count: an admin name without a record must sign
        # up and be approved like anyone else.
        return {info.username for info in UserInfo.all_users(self.db) if info.is_authorized}

    def is_password_strong(self, password: str) -> bool:
        return not _too_long(password) and super().is_password_strong(password)

    def name_taken(self, username: str) -> bool:
        """Whether a sign-up record or a hub user has this name, in any form the
        hub normalises to the same name."""
        name = self.normalize_username(username)
        if self.get_user(name) is not None:
            return True
        # Hub users made through the REST API keep their name as given ("Bob").
        return any(
            existing == name or self.normalize_username(existing) == name
            for (existing,) in self.db.query(orm.User.name)
        )

    def create_user(self, username, password, **kwargs):
        if self.name_taken(username):
            return None
        return super().create_user(username, password, **kwargs)

    async def authenticate(self, handler, data):
        # NativeAuthenticator's, with bcrypt off the hub's event loop and failures
        # counted per address (login_limits), not per name.
        source = await asyncio.to_thread(login_source, handler.request) if handler else ""
        if self.lockout.seconds_locked(source):
            return None
        username = self.normalize_username(data.get("username", ""))
        password = data.get("password", "")
        info = self.get_user(username)
        valid = (
            info is not None
            and not _too_long(password)
            and info.is_authorized
            and await password_matches(info, password)
        )
        if valid and info.has_2fa:
            valid = info.is_valid_token(data.get("2fa"))
        if valid:
            return username
        self.lockout.failed(source)
        return None

    async def delete_user(self, user):
        # The hub has stopped the user's server; their jobs and endpoints stop
        # before their record goes (user_removal), or the deletion stops.
        refuse_while_servers_run(user)
        client = service_client_for(user)
        if client is not None:
            jobs, deployments = await stop_work(client, user.name)
            if jobs or deployments:
                self.log.info(
                    "Deleting %s: cancelled %d jobs, stopped %d endpoints",
                    user.name,
                    jobs,
                    deployments,
                )
        return super().delete_user(user)

    def seed_admin(self) -> None:
        """Create or update admin_name's record from admin_password_file, authorized."""
        if not self.admin_password_file:
            return
        path = Path(self.admin_password_file)
        password = path.read_text().strip()
        if not password or _too_long(password):
            raise ValueError(
                f"{path} must hold the admin's password (1 to "
                f"{MAX_PASSWORD_BYTES} bytes); write one, or delete the file "
                "and gpulab up makes a new one"
            )
        name = self.normalize_username(self.admin_name)
        info = UserInfo.find(self.db, name)
        if info is None:
            info = UserInfo(
                username=name, password=bcrypt.hashpw(password.encode(), bcrypt.gensalt())
            )
            self.db.add(info)
        elif not info.is_valid_password(password):
            info.password = bcrypt.hashpw(password.encode(), bcrypt.gensalt())
        info.is_authorized = True
        self.db.commit()
        self.log.info("%s logs in with the password in %s", name, path)

    def get_handlers(self, app):
        # Our pages (navigation links, the Authorize page for Bootstrap 5) go in
        # front of the hub's; the hub has built its template loaders by now.
        for key in ("jinja2_env", "jinja2_env_sync"):
            env = app.tornado_settings[key]
            env.loader = ChoiceLoader([FileSystemLoader(TEMPLATES), env.loader])
        return [
            (route, _HARDENED.get(handler, handler)) for route, handler in super().get_handlers(app)
        ]
