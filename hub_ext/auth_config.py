"""Who may log in to the embedded hub (`gpulab up`), and what the banner says about it.

Default: per-user passwords with admin approval
(:class:`~gpulab.hub_ext.native_auth.GpuLabNativeAuthenticator`): people sign
up at ``/hub/signup``, the admin authorizes them at ``/hub/authorize``. The
admin ``admin`` logs in with the password in ``<data-dir>/admin-password``.

``gpulab up --demo`` (``GPULAB_DEMO_LOGIN=1``): JupyterHub's shared-password
authenticator, one password in ``<data-dir>/user-password`` for any user name,
for workshops. The banner, the spawn form and ``%gpulab`` say so.

Any JupyterHub authenticator replaces both through ``<data-dir>/gpulab_config.py``
(loaded after this), e.g. ``c.JupyterHub.authenticator_class = "pam"``.
"""

from __future__ import annotations

import os

from gpulab.spawner.form import DEMO_LOGIN_ENV, DEMO_LOGIN_WARNING, demo_login

from .hub_config import ADMIN_USER, SERVICE_NAME, Settings, secret_file

NATIVE = "gpulab.hub_ext.native_auth.GpuLabNativeAuthenticator"


def configure_auth(c, s: Settings, env=os.environ) -> None:
    """Authentication settings; call after the spawner and services are configured
    (demo mode adds its flag to their environments)."""
    data = s.data_dir
    admin_password_file = data / "admin-password"
    admin_password = secret_file(admin_password_file, 32)
    c.Authenticator.admin_users = {ADMIN_USER}
    # Our two authenticators decide alone who gets in (approved sign-ups; holders
    # of the shared password), hence allow_all on them only: another authenticator
    # set in gpulab_config.py (GitHub, PAM...) keeps JupyterHub's default, no one
    # until an allow-list says who.
    c.GpuLabNativeAuthenticator.allow_all = True
    c.SharedPasswordAuthenticator.allow_all = True
    if not demo_login(env):
        c.JupyterHub.authenticator_class = NATIVE
        c.GpuLabNativeAuthenticator.admin_name = ADMIN_USER
        c.GpuLabNativeAuthenticator.admin_password_file = str(admin_password_file)
        return

    c.JupyterHub.authenticator_class = "shared-password"
    c.SharedPasswordAuthenticator.user_password = secret_file(data / "user-password", 12)
    c.SharedPasswordAuthenticator.admin_password = admin_password
    # Servers (%gpulab) and the service learn it from their environment; the
    # hub's own spawn form reads the hub's.
    c.Spawner.environment = {**_configured(c.Spawner, "environment", {}), DEMO_LOGIN_ENV: "1"}
    services = _configured(c.JupyterHub, "services", [])
    for service in services:
        if service.get("name") == SERVICE_NAME:
            service["environment"] = {**service.get("environment", {}), DEMO_LOGIN_ENV: "1"}
    c.JupyterHub.services = services


def _configured(section, name, empty):
    return section.get(name, empty)


def login_banner(s: Settings, demo: bool) -> str:
    """The lines of `gpulab up`'s banner that say how to log in."""
    data = s.data_dir
    admin = f"  Admin: user '{ADMIN_USER}' with the password in {data / 'admin-password'}"
    if demo:
        return "\n".join(
            [
                f"  {DEMO_LOGIN_WARNING}",
                f"  Log in with any user name and the password in {data / 'user-password'}",
                admin,
            ]
        )
    return "\n".join(
        [
            f"  Log in: sign up at {s.public_url}/hub/signup, then the admin approves you",
            f"    at {s.public_url}/hub/authorize (your own password, stored bcrypt-hashed)",
            admin,
            "  Other logins (PAM, GitHub, ...): docs/howto/configure.md",
        ]
    )
