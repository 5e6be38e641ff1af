"""Accounts of the platform's own processes (not a hub user's): the vector engine runs
as one, so a fault in it reaches neither the service's files nor any user's.

The name has an underscore after ``gpulab`` (``gpulab_vectors``): a hub user's account
is ``<prefix><name>`` with ``[a-z0-9-]`` or ``<prefix>_<hash>`` after a prefix ending
in ``-``, so no hub user can ever be given it.
"""

from __future__ import annotations

import os
import pwd
import subprocess

from .accounts import Account, AccountError


def ensure_system_account(name: str) -> Account:
    """The system account ``name`` (no home, no login shell), created if missing."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home"]
            + ["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
        )
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise AccountError(
                f"cannot create the system account {name}: "
                f"{done.stderr.strip() or done.returncode}; create it with useradd --system"
            ) from None
    return Account(name=name, uid=pw.pw_uid, gid=pw.pw_gid, groups=(), home="/nonexistent")


def running_as_root() -> bool:
    return os.geteuid() == 0
