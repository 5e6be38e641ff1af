"""NativeAuthenticator's pages on JupyterHub 6, hardened, each saying what it did.

The pages of :class:`~gpulab.hub_ext.native_auth.GpuLabNativeAuthenticator`
(``HARDENED`` maps NativeAuthenticator's handlers to these):

- bad form input (missing fields, passwords bcrypt cannot hash, bytes that are
  not UTF-8) gets a 400 or a login error instead of a 500, and no password in
  the hub's log;
- the GET links that approve or discard a sign-up are honoured only from the
  hub's own Authorize page;
- each page notes what it did for the audit trail
  (:func:`~gpulab.hub_ext.audit_hook.note`): a sign-up, an approval, a discard,
  a password change, a login and a logout, each with its result and, when
  refused, the reason (a wrong password, not approved yet, locked out...), since
  these pages answer 200 whether they worked or not.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from contextvars import ContextVar

import bcrypt
from jupyterhub.handlers.login import LogoutHandler
from jupyterhub.scopes import needs_scope
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

from .audit_hook import note
from .login_limits import login_source

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


#: Why a login was refused, as the audit trail says it (never the password).
UNKNOWN_USER = "unknown user"
BAD_PASSWORD = "bad password"
BAD_2FA = "bad 2fa code"
NOT_APPROVED = "not approved"
LOCKED_OUT = "locked out"
NOT_ALLOWED = "not allowed"


def too_long(password: str) -> bool:
    return len(password.encode("utf-8", "surrogatepass")) > MAX_PASSWORD_BYTES


#: A sign-up's password and its bcrypt hash, made in a thread by the sign-up page before
#: NativeAuthenticator creates the record (it hashes on the hub's event loop: a quarter
#: of a second each, so a few sign-ups a second stalled every login, spawn and API call).
PREHASHED: ContextVar[tuple[str, bytes] | None] = ContextVar("gpulab_prehashed", default=None)


async def password_matches(info: UserInfo, password: str) -> bool:
    """bcrypt takes a good part of a second: check in a thread, not on the hub's loop."""
    if too_long(password):
        return False
    return await asyncio.to_thread(bcrypt.checkpw, password.encode(), info.password)


class _Audited:
    """A page that says what it did: ``audit_action`` and :meth:`audited`."""

    #: The action of this page in the audit trail (gpulab.service.operations.audit).
    audit_action = ""
    #: Pages of people who are not logged in yet: the actor is the name typed.
    typed_actor = False

    def audit_user(self) -> str | None:
        """Whose record the page is about."""
        if self.typed_actor:
            raw = (self.request.body_arguments.get("username") or [b""])[0]
            name = raw.decode("utf-8", "backslashreplace").strip()
            return self.authenticator.normalize_username(name) if name else None
        if self.path_args:
            return self.path_args[0]
        return self.current_user.name if self.current_user else None

    def audited(self, result: str, reason: str | None = None, **detail) -> None:
        user = self.audit_user()
        actor = (user or "anonymous") if self.typed_actor else None
        note(self, self.audit_action, result, user=user, actor=actor, reason=reason, **detail)


class _FormChecks(_Audited):
    """Bad form input gets a 400 that says what to do, not a 500."""

    @property
    def refused(self) -> str:
        # Any login that does not log in is a refused one; other forms just failed.
        return "denied" if self.audit_action == "login" else "failed"

    def check_xsrf_cookie(self):
        try:
            return super().check_xsrf_cookie()
        except web.HTTPError:
            self.audited("denied", "form expired or from another site")
            raise

    async def prepare(self):
        await super().prepare()
        if self.request.method != "POST":
            return
        # Tornado's own 400 for such bytes would write the field (a password) to the log.
        form = self.request.body_arguments
        if not all(_is_utf8(v) for values in form.values() for v in values):
            self.audited(self.refused, "form not UTF-8")
            # The error page reads the form again (the login page shows the name typed).
            for args in (form, self.request.arguments):
                for key, values in args.items():
                    args[key] = [v.decode("utf-8", "replace").encode() for v in values]
            raise web.HTTPError(400, "The form must be sent as UTF-8 text; try again.")
        for field in PASSWORD_FIELDS:
            value = self.get_body_argument(field, None, strip=False)
            if value is not None and too_long(value):
                self.audited(self.refused, "password too long")
                raise web.HTTPError(
                    400,
                    f"Passwords are at most {MAX_PASSWORD_BYTES} bytes; choose a shorter one.",
                )


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _SameSiteOnly(_Audited):
    """These links change state on GET: honour them only with the ``_xsrf`` token the
    Authorize page puts in them (JupyterHub's, tied to the admin's login session), so
    a link or form elsewhere cannot make an admin approve or discard a sign-up.
    (A ``Sec-Fetch-Site`` check alone passes whatever sends no such header.)"""

    async def prepare(self):
        await super().prepare()
        sent = self.get_argument("_xsrf", "")
        if not sent or not hmac.compare_digest(sent.encode(), self.xsrf_token):
            self.audited("denied", "not from the Authorize page")
            raise web.HTTPError(403, "Open this from the hub's own Authorize page.")


class GpuLabLoginHandler(_FormChecks, LoginHandler):
    """NativeAuthenticator's login page on JupyterHub 6.

    Its own handler breaks there: ``post`` times itself with ``self.statsd``
    (gone in JupyterHub 6) and ``_render`` refuses the arguments JupyterHub's
    error pages pass (``sync``, ``status_code``...), so every failed or bad
    login was a 500. Same page and messages, 403 on a failed login as
    JupyterHub's own.
    """

    audit_action = "login"
    typed_actor = True
    #: Why the authenticator refused this login, who it counted the try for
    #: (login_limits.login_source) and where (its throttle's keys); set by authenticate().
    gpulab_refusal: str | None = None
    gpulab_source: str | None = None
    gpulab_throttle: list | None = None

    def local_account(self) -> str | None:
        """``uid <n>`` when the login came straight from another account on this
        machine (a kernel past the proxy): the trail's address is only loopback then."""
        source = self.gpulab_source or ""
        return source if source.startswith("uid ") else None

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
        account = self.local_account()
        if user:
            self._jupyterhub_user = user
            # The actor: the user, or an admin (not the name as typed).
            note(self, "login", "ok", user=user.name, local_account=account)
            self.redirect(self.get_next_url(user))
            return
        # No refusal from authenticate(): the hub's own checks refused the name
        # (blocked_users, allowed_users).
        refusal = self.gpulab_refusal or NOT_ALLOWED
        self.audited("denied", refusal, local_account=account)
        error = "Invalid username or password."
        keys = self.gpulab_throttle
        if keys is None:  # refused before authenticate() (the hub's own checks)
            source = await asyncio.to_thread(login_source, self.request)
            name = self.authenticator.normalize_username(data["username"])
            keys = self.authenticator.throttle_keys(self, source, name)
        wait = self.authenticator.seconds_locked(keys)
        if wait:
            error = (
                f"Too many failed logins from your address: try again in {math.ceil(wait)} seconds."
            )
        elif refusal == NOT_APPROVED:
            name = self.authenticator.normalize_username(data["username"])
            error = f"User {name} has not been authorized by an administrator yet."
        self.set_status(403)
        self.finish(await self._render(login_error=error, username=data["username"]))


class GpuLabSignUpHandler(_FormChecks, SignUpHandler):
    """NativeAuthenticator's sign-up, refusing names a hub user or a sign-up has."""

    audit_action = "user.signup"
    typed_actor = True

    def get_result_message(
        self, user, assume_user_is_human, username_already_taken, confirmation_matches, *args
    ):
        # NativeAuthenticator's post() hands its outcome here (and answers 200 anyway).
        if user is not None:
            self.audited("ok", approved=bool(user.is_authorized))
        elif not assume_user_is_human:
            self.audited("denied", "failed the reCAPTCHA")
        elif username_already_taken:
            self.audited("denied", "name taken")
        elif not confirmation_matches:
            self.audited("failed", "confirmation does not match")
        else:
            self.audited("failed", self._why_not_created())
        return super().get_result_message(
            user, assume_user_is_human, username_already_taken, confirmation_matches, *args
        )

    def _why_not_created(self) -> str:
        auth = self.authenticator
        name = auth.normalize_username(self.get_body_argument("username", "", strip=False))
        if not auth.validate_username(name):
            return "name not allowed"
        if not auth.is_password_strong(self.get_body_argument("signup_password", strip=False)):
            return "password too short or common"
        return "not created"

    async def post(self):
        auth = self.authenticator
        name = self.get_body_argument("username", "", strip=False)
        if not (auth.enable_signup and name and auth.name_taken(name)):
            password = self.get_body_argument("signup_password", "", strip=False)
            if (
                not too_long(password)
                and auth.validate_username(auth.normalize_username(name))
                and auth.is_password_strong(password)
            ):
                hashed = await asyncio.to_thread(bcrypt.hashpw, password.encode(), bcrypt.gensalt())
                PREHASHED.set((password, hashed))
            return await super().post()
        self.audited("denied", "name taken")
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


def set_password(handler, name: str, new: str, confirmation: str, whose: str, starts: str):
    """Set ``name``'s password on a change-password page and note the outcome; None, or
    NativeAuthenticator's message for why not (``whose``: "your new password", ...;
    ``starts``: how the confirmation's message starts, "Your new" or "The new")."""
    if new != confirmation:
        handler.audited("failed", "confirmation does not match")
        return f"{starts} password didn't match the confirmation. Please try again."
    if not handler.authenticator.change_password(name, new):
        handler.audited("failed", "password too short or common")
        return (
            f"Something went wrong!\nBe sure {whose} has at least "
            f"{handler.authenticator.minimum_password_length} characters and is not too common."
        )
    handler.audited("ok")
    return None


class GpuLabChangePasswordHandler(_FormChecks, ChangePasswordHandler):
    """A user's own password change: NativeAuthenticator's page and messages, with
    bcrypt off the hub's event loop and the outcome noted for the audit trail.

    The current password is a password guess like a login's: wrong ones count
    where a failed login would (:meth:`GpuLabNativeAuthenticator.throttle_keys`), and
    while that waits even the right one is refused, so a stolen session or a token
    (a kernel's own, sent to this page) cannot guess it unthrottled."""

    audit_action = "password.change"

    @web.authenticated
    async def post(self):
        auth = self.authenticator
        name = self.current_user.name
        old = self.get_body_argument("old_password", strip=False)
        new = self.get_body_argument("new_password", strip=False)
        confirmation = self.get_body_argument("new_password_confirmation", strip=False)
        keys = auth.throttle_keys(self, await asyncio.to_thread(login_source, self.request), name)
        wait = auth.seconds_locked(keys)
        info = auth.get_user(name)
        if wait:
            self.audited("denied", LOCKED_OUT)
            self.set_status(403)
            message = (
                f"Too many wrong passwords from your address: try again in {math.ceil(wait)} "
                "seconds."
            )
        elif info is None or not await password_matches(info, old):
            auth.count_failure(keys)
            self.audited("denied", "wrong current password")
            message = "Your current password was incorrect. Please try again."
        else:
            message = set_password(self, name, new, confirmation, "your new password", "Your new")
        html = await self.render_template(
            "change-password.html",
            user_name=name,
            result_message=message or "Your password has been changed successfully!",
            alert="alert-danger" if message else "alert-success",
        )
        self.finish(html)


class GpuLabChangePasswordAdminHandler(_FormChecks, ChangePasswordAdminHandler):
    """An admin sets a user's password: NativeAuthenticator's page, the outcome noted."""

    audit_action = "password.change"

    @needs_scope("admin:users")
    async def post(self, user_name):
        new = self.get_body_argument("new_password", strip=False)
        confirmation = self.get_body_argument("new_password_confirmation", strip=False)
        if self.authenticator.get_user(user_name) is None:
            self.audited("failed", "no such user")
            raise web.HTTPError(404, f"No sign-up named {user_name!r}.")
        message = set_password(
            self, user_name, new, confirmation, f"the new password for {user_name}", "The new"
        )
        html = await self.render_template(
            "change-password-admin.html",
            user_name=user_name,
            result_message=message or f"The password for {user_name} has been changed successfully",
            alert="alert-danger" if message else "alert-success",
        )
        self.finish(html)


class GpuLabToggleAuthorizationHandler(_SameSiteOnly, ToggleAuthorizationHandler):
    """Approve a sign-up, or take the approval back (the same link)."""

    audit_action = "user.authorize"

    @needs_scope("admin:users")
    async def get(self, name):
        info = self.authenticator.get_user(name)
        if info is None:
            self.audited("failed", "no such sign-up")
            raise web.HTTPError(404, f"No sign-up named {name!r}.")
        UserInfo.change_authorization(self.db, info.username)
        # Before the redirect: the request's entry is written when it finishes.
        self.audited("ok", authorized=bool(info.is_authorized))
        self.redirect(self.hub.base_url + "authorize#" + info.username)


class GpuLabDiscardHandler(_SameSiteOnly, DiscardHandler):
    """Discard drops the pending sign-up record and nothing else.

    NativeAuthenticator's also deleted the hub user of that name: a user an
    admin had created, or one with a running server, vanished from the hub
    while the server ran on and its slice was released (the GPU then given
    twice). Deleting a hub user is the admin page's (or the REST API's) job,
    which stops their server first.
    """

    audit_action = "user.discard"

    @needs_scope("admin:users")
    async def get(self, name):
        info = self.authenticator.get_user(name)
        if info is None:
            self.audited("failed", "no such sign-up")
            raise web.HTTPError(404, f"No sign-up named {name!r}.")
        if info.is_authorized:
            self.audited("failed", "already approved")  # kept: see the class
        else:
            self.db.delete(info)
            self.db.commit()
            self.audited("ok")
        self.redirect(self.hub.base_url + "authorize")


class GpuLabLogoutHandler(LogoutHandler):
    """JupyterHub's logout, noted for the audit trail (it forgets the user before
    the request ends, so the note names them)."""

    async def handle_logout(self):
        who = self.current_user
        if who is not None:
            kind = "admin" if who.admin else "user"
            note(self, "logout", "ok", user=who.name, actor=who.name, actor_kind=kind)
        await super().handle_logout()


HARDENED = {
    LoginHandler: GpuLabLoginHandler,
    SignUpHandler: GpuLabSignUpHandler,
    ChangePasswordHandler: GpuLabChangePasswordHandler,
    ChangePasswordAdminHandler: GpuLabChangePasswordAdminHandler,
    ToggleAuthorizationHandler: GpuLabToggleAuthorizationHandler,
    DiscardHandler: GpuLabDiscardHandler,
    AuthorizationAreaHandler: GpuLabAuthorizationAreaHandler,
}
