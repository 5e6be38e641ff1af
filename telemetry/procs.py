"""Which JupyterHub user a process belongs to, from ``/proc``.

Single-user servers carry ``JUPYTERHUB_USER`` in their environment and every
kernel and job they start inherits it; a process that lacks it (a job runner
that cleaned its environment) is attributed through its parents. Another
user's environ is readable only by root or that user, so an agent that runs
unprivileged reports ``user: null`` for those and still gives ``unix_user``.

The variable is the process's own to set, so it is believed only as far as the
account allows: a process of a gpulab account (per-user accounts) counts as its
hub user's only when it claims that user (a claim of another name gives ``null``,
so nobody puts their GPU memory under another user's name), and a claim longer
than a hub name can be is no claim. Everything here reads ``/proc`` as bytes: a
process names itself (``prctl``) with any bytes, and none may stop the sample.
"""

from __future__ import annotations

import os
import pwd

from gpulab.enforcement.account_names import recorded_for

_MAX_ANCESTORS = 8
#: The longest hub user name believed (JupyterHub's database column holds 255).
MAX_USER = 255


def _read(proc: str, pid: int, name: str) -> bytes:
    with open(os.path.join(proc, str(pid), name), "rb") as f:
        return f.read()


def _environ_user(proc: str, pid: int) -> str | None:
    try:
        raw = _read(proc, pid, "environ")
    except OSError:  # gone, or not ours to read
        raise LookupError(pid) from None
    for item in raw.split(b"\0"):
        if item.startswith(b"JUPYTERHUB_USER="):
            return item.split(b"=", 1)[1].decode(errors="replace") or None
    return None


def _parent(proc: str, pid: int) -> int | None:
    try:
        stat = _read(proc, pid, "stat")
        # The command name may hold spaces, parentheses and any bytes; fields
        # follow the last ')'.
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return ppid if ppid > 1 else None


def _claimed_user(proc: str, pid: int) -> str | None:
    current: int | None = pid
    for _ in range(_MAX_ANCESTORS):
        if current is None:
            return None
        try:
            user = _environ_user(proc, current)
        except LookupError:
            return None
        if user:
            return user if len(user) <= MAX_USER else None
        current = _parent(proc, current)
    return None


def real_uid(pid: int, proc: str = "/proc") -> int | None:
    """The process's real uid, from ``status`` (``/proc/<pid>`` itself shows root
    for a process that made itself undumpable)."""
    try:
        for line in _read(proc, pid, "status").splitlines():
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def jupyterhub_user(pid: int, proc: str = "/proc") -> str | None:
    """``JUPYTERHUB_USER`` of ``pid`` or its nearest ancestor that has it, where the
    process's account does not say it is another user's."""
    claimed = _claimed_user(proc, pid)
    if claimed is None:
        return None
    uid = real_uid(pid, proc)
    if uid is None:
        return None
    try:
        record = pwd.getpwuid(uid).pw_gecos
    except KeyError:  # an account this host does not list (a pod's): nothing to check
        return claimed
    return None if recorded_for(record, claimed) is False else claimed


def unix_user(pid: int, proc: str = "/proc") -> str | None:
    uid = real_uid(pid, proc)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
