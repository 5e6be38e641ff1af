"""Which JupyterHub user a process belongs to, from ``/proc``.

Single-user servers carry ``JUPYTERHUB_USER`` in their environment and every
kernel and job they start inherits it; a process that lacks it (a job runner
that cleaned its environment) is attributed through its parents. Another
user's environ is readable only by root or that user, so an agent that runs
unprivileged reports ``user: null`` for those and still gives ``unix_user``.
"""

from __future__ import annotations

import os
import pwd

_MAX_ANCESTORS = 8


def _environ_user(proc: str, pid: int) -> str | None:
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as f:
            raw = f.read()
    except OSError:  # gone, or not ours to read
        raise LookupError(pid) from None
    for item in raw.split(b"\0"):
        if item.startswith(b"JUPYTERHUB_USER="):
            return item.split(b"=", 1)[1].decode(errors="replace") or None
    return None


def _parent(proc: str, pid: int) -> int | None:
    try:
        with open(os.path.join(proc, str(pid), "stat")) as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields follow the last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    ppid = int(fields[1])
    return ppid if ppid > 1 else None


def jupyterhub_user(pid: int, proc: str = "/proc") -> str | None:
    """``JUPYTERHUB_USER`` of ``pid`` or its nearest ancestor that has it."""
    current: int | None = pid
    for _ in range(_MAX_ANCESTORS):
        if current is None:
            return None
        try:
            user = _environ_user(proc, current)
        except LookupError:
            return None
        if user:
            return user
        current = _parent(proc, current)
    return None


def unix_user(pid: int, proc: str = "/proc") -> str | None:
    try:
        uid = os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
