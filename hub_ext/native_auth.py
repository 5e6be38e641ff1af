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
- stops a deleted user's gpulab jobs and endpoints before the record goes, then
  retires their Unix account
  (:mod:`~gpulab.hub_ext.user_removal`);
- counts failed logins per client address and name, with a device cookie for
  browsers that logged in before (:mod:`~gpulab.hub_ext.login_limits`,
  :mod:`~gpulab.hub_ext.login_devices`), never per name alone, so wrong
  passwords typed for the admin lock out the one who typed them, not the admin;
  the change-password form counts wrong current passwords the same way;
- shows NativeAuthenticator's links (Change password, Authorize users) in
  the hub's navigation bar, and its Authorize page with JupyterHub 6's styles
  (``templates/``);
- serves NativeAuthenticator's pages hardened (:mod:`~gpulab.hub_ext.native_pages`):
  bad form input gets a 400 or a login error instead of a 500, cross-site
  requests cannot approve or discard a sign-up, and each page says what it did
  for the audit trail (a sign-up, an approval, a discard, a password change, a
  login with the reason it was refused, a logout).

Settings, in ``<data-dir>/gpulab_config.py``::

    c.GpuLabNativeAuthenticator.minimum_password_length = 12
    c.NativeAuthenticator.open_signup = True   # no approval (not recommended)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import bcrypt
from jinja2 import ChoiceLoader, FileSystemLoader
from jupyterhub import orm
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import TEMPLATE_DIR as NATIVE_TEMPLATES
from nativeauthenticator.orm import UserInfo
from traitlets import Integer, Unicode, default

from .login_devices import device_of, remember_device
from .login_limits import SourceLockout, login_source, throttle_unit
from .native_pages import (
    BAD_2FA,
    BAD_PASSWORD,
    HARDENED,
    LOCKED_OUT,
    MAX_PASSWORD_BYTES,
    NOT_APPROVED,
    PREHASHED,
    UNKNOWN_USER,
    GpuLabLogoutHandler,
    password_matches,
    too_long,
)
from .user_removal import refuse_while_servers_run, retire, service_client_for, stop_work

TEMPLATES = str(Path(__file__).with_name("templates"))
#: The longest name a login is checked for (an account's name is far shorter).
MAX_LOGIN_NAME_CHARS = 256


@contextlib.contextmanager
def _hashed_as(hashed: bytes):
    """NativeAuthenticator's ``bcrypt.hashpw`` answering ``hashed`` (made in a thread
    by the sign-up page) for the length of one synchronous ``create_user`` on the
    hub's thread; its module's name only, not the bcrypt module."""
    from nativeauthenticator import nativeauthenticator as upstream

    real = upstream.bcrypt
    upstream.bcrypt = SimpleNamespace(
        hashpw=lambda password, salt: hashed, gensalt=lambda: b"", checkpw=real.checkpw
    )
    try:
        yield
    finally:
        upstream.bcrypt = real


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
        help="""Failed logins at one name from one client address before that
        address must wait seconds_before_next_try to try that name again. Counted
        per client address (through the hub's proxy) and name, not per user name
        alone, so nobody can lock another user out: the same user from another
        address, or from a browser that logged in to the name before (its device
        cookie), is not held up. The right password does not get in while the
        address waits. The change-password form counts the same. 0: no limit.

        c.GpuLabNativeAuthenticator.allowed_failed_logins = 5
        """,
    )
    allowed_failed_logins_per_source = Integer(
        100,
        config=True,
        help="""Failed logins from one client address, whatever names they try
        (guessing many accounts), before the address waits seconds_before_next_try
        for every name; browsers with a device cookie for the name are not held up.
        0: no such limit.

        c.GpuLabNativeAuthenticator.allowed_failed_logins_per_source = 50
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
        wait = self.seconds_before_next_try
        #: Counts per (source, name) and per device cookie; and per source alone.
        self.lockout = SourceLockout(self.allowed_failed_logins, wait)
        self.source_lockout = SourceLockout(self.allowed_failed_logins_per_source, wait)
        self.seed_admin()

    def normalize_username(self, username: str) -> str:
        return super().normalize_username(unicodedata.normalize("NFKC", username))

    def get_authed_users(self):
        # Only approved records count: an admin name without a record must sign
        # up and be approved like anyone else.
        return {info.username for info in UserInfo.all_users(self.db) if info.is_authorized}

    def is_password_strong(self, password: str) -> bool:
        return not too_long(password) and super().is_password_strong(password)

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
        made = PREHASHED.get()
        if made is None or made[0] != password:
            return super().create_user(username, password, **kwargs)
        with _hashed_as(made[1]):
            return super().create_user(username, password, **kwargs)

    async def authenticate(self, handler, data):
        # NativeAuthenticator's, with bcrypt off the hub's event loop and failures
        # counted per address and name (login_limits), never per name alone. The
        # login page learns why it refused (handler.gpulab_refusal), whose try it
        # counted (handler.gpulab_source) and where (handler.gpulab_throttle), for
        # the audit trail and its message.
        source = await asyncio.to_thread(login_source, handler.request) if handler else ""
        # A name past any account's length is no account's; cut before it is folded
        # or kept as a throttle key (100 MB names filled the hub's memory).
        typed = data.get("username", "")
        too_long = len(typed) > MAX_LOGIN_NAME_CHARS
        username = self.normalize_username(typed[:MAX_LOGIN_NAME_CHARS])
        keys = self.throttle_keys(handler, source, username)
        if handler is not None:
            handler.gpulab_source = source
            handler.gpulab_throttle = keys
        if too_long:
            refusal = LOCKED_OUT if self.seconds_locked(keys) else UNKNOWN_USER
        else:
            refusal = await self.refusal(keys, username, data.get("password", ""), data)
        if refusal is None:
            if handler is not None:
                remember_device(handler, username)
            return username
        if handler is not None:
            handler.gpulab_refusal = refusal
        if refusal != LOCKED_OUT:
            self.count_failure(keys)
        return None

    def throttle_keys(self, handler, source: str, name: str) -> list[tuple[SourceLockout, str]]:
        """Where a try at ``name`` from ``source`` counts: the browser's device cookie
        for the name if it has one (nobody else's failures hold it up), else the pair
        (source, name) and the source alone."""
        device = device_of(handler, name) if handler is not None else None
        if device:
            return [(self.lockout, f"device {device}")]
        unit = throttle_unit(source)
        return [(self.lockout, f"{unit} as {name}"), (self.source_lockout, unit)]

    def seconds_locked(self, keys: list[tuple[SourceLockout, str]]) -> float:
        """How long a try counted at ``keys`` must still wait (0: it may try)."""
        return max((lockout.seconds_locked(key) for lockout, key in keys), default=0.0)

    def count_failure(self, keys: list[tuple[SourceLockout, str]]) -> None:
        for lockout, key in keys:
            lockout.failed(key)

    async def refusal(self, keys, username: str, password: str, data: dict) -> str | None:
        """Why this login is refused (None: it is not). The password is checked
        before the approval, so "not approved" is said only to the right password."""
        if self.seconds_locked(keys):
            return LOCKED_OUT
        info = self.get_user(username)
        if info is None:
            return UNKNOWN_USER
        if not await password_matches(info, password):  # too long: False
            return BAD_PASSWORD
        if info.has_2fa and not info.is_valid_token(data.get("2fa")):
            return BAD_2FA
        if not info.is_authorized:
            return NOT_APPROVED
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
        await retire(self.config, user.name, self.log)
        return super().delete_user(user)

    def seed_admin(self) -> None:
        """Create or update admin_name's record from admin_password_file, authorized."""
        if not self.admin_password_file:
            return
        path = Path(self.admin_password_file)
        password = path.read_text().strip()
        if not password or too_long(password):
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
        # NativeAuthenticator adds its own pages to the async loader only (at its first
        # page); a refused login form's error page (a 400) renders from the sync one.
        sync = app.tornado_settings["jinja2_env_sync"]
        sync.loader = ChoiceLoader([sync.loader, FileSystemLoader(NATIVE_TEMPLATES)])
        return [
            (route, HARDENED.get(handler, handler)) for route, handler in super().get_handlers(app)
        ] + [(r"/logout", GpuLabLogoutHandler)]
