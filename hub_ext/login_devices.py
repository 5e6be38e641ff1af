"""A browser that has logged in to a name before keeps its own count of failures for it.

Failed logins lock the pair (source, name) (:mod:`.login_limits`). On one machine
the source cannot always tell people apart: every process that reaches the proxy
over loopback (a user's kernel, and the admin's browser on the same machine) is
the same source. So an attacker's kernel could still lock the admin out of her own
laptop. A device cookie (OWASP's "device cookies" against online guessing) ends
that: after a successful login the browser gets a signed cookie naming the user
and a random id; its later tries at that name count under that id alone, so
nobody else's failures, from whatever address, hold it up, and its own typos lock
only itself.

The cookie is signed with the hub's cookie secret (it cannot be forged or moved to
another name), HttpOnly, Secure on https, scoped to the hub's pages, and one per
browser: the last name logged in to.
"""

from __future__ import annotations

import json
import secrets

#: The cookie's name, and how long a browser keeps it.
COOKIE = "gpulab-login-device"
MAX_AGE_DAYS = 365


def device_of(handler, name: str) -> str | None:
    """The id of the device cookie ``handler``'s request carries for ``name``, if any."""
    get = getattr(handler, "get_secure_cookie", None)
    if get is None:
        return None
    raw = get(COOKIE, max_age_days=MAX_AGE_DAYS)
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("user") != name:
        return None
    device = value.get("id")
    return device if isinstance(device, str) and device else None


def remember_device(handler, name: str) -> None:
    """After a successful login to ``name``: the browser's device cookie for it (the
    one it has, or a new one)."""
    if getattr(handler, "_set_cookie", None) is None or device_of(handler, name):
        return
    value = json.dumps({"user": name, "id": secrets.token_hex(16)})
    handler._set_cookie(
        COOKIE, value, encrypted=True, path=handler.hub.base_url, expires_days=MAX_AGE_DAYS
    )
