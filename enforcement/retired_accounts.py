"""The Unix account of a deleted hub user: locked, its processes ended, kept for no one.

Deleting a hub user used to leave their account as it was, and a new user
approved under the same name later got it: the old user's home, files, crontab
and any process still running as that uid. Now the hub's ``delete_user``
(:mod:`gpulab.hub_ext.native_auth`) retires the account once the user's work has
stopped: its record becomes ``gpulab retired <date> ...``
(:func:`~gpulab.enforcement.account_names.retired_record`), it is locked and
expired (no login, no cron), and every process still running as it is killed.
The home is kept, for an admin to archive or hand back. A new user of the name
is refused until an admin removes the account (``userdel -r``) or gives it back;
the refusal says both (:meth:`~gpulab.enforcement.accounts.UserAccounts.lookup`).
"""

from __future__ import annotations

import datetime
import os
import pwd
import signal
import subprocess
import time

from .account_names import recorded_for, retired_for, retired_record
from .accounts import AccountError, UserAccounts

#: Rounds of "find the account's processes, kill them" before giving up on a
#: process tree that forks faster than it is killed.
KILL_ROUNDS = 50


def retire_account(accounts: UserAccounts, hub_name: str, today: str | None = None) -> str | None:
    """Retire the account gpulab made for ``hub_name``; its name, or None if there
    is none (never spawned, or an account the site made itself, which is left
    alone). Raises :class:`AccountError` if it cannot be locked."""
    try:
        account = accounts.lookup(hub_name)
    except AccountError:
        # Not this user's, or retired already: then a deletion tried again (the
        # first one's kill failed) ends what still runs as it.
        pw = _getpw(accounts.name_for(hub_name))
        if pw is not None and retired_for(pw.pw_gecos, hub_name):
            end_processes_of(pw.pw_uid)
            return pw.pw_name
        return None
    if account is None:
        return None
    comment = pwd.getpwnam(account.name).pw_gecos
    if recorded_for(comment, hub_name) is not True:
        return None
    on = today or datetime.date.today().isoformat()
    done = subprocess.run(
        [
            "usermod",
            "--lock",
            "--expiredate",
            "1",
            "--comment",
            retired_record(comment, on),
            account.name,
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise AccountError(
            f"cannot lock the Unix account {account.name} of deleted hub user "
            f"{hub_name!r}: {done.stderr.strip() or done.returncode}"
        )
    end_processes_of(account.uid)
    return account.name


def end_processes_of(uid: int) -> int:
    """Kill every process running as ``uid`` (real, effective, saved or filesystem
    uid); how many were killed. Each is signalled through a pidfd opened before its
    uid is read, so a pid reused by another account's process is never hit."""
    killed: set[int] = set()
    for _ in range(KILL_ROUNDS):
        found = _processes_of(uid)
        if not found:
            return len(killed)
        for pid, fd in found:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed.add(pid)
            except OSError:  # ended meanwhile
                pass
            finally:
                os.close(fd)
        time.sleep(0.05)
    raise AccountError(
        f"processes of uid {uid} still run after SIGKILL (new ones, or stuck in the "
        f"kernel: an NFS home, a GPU context); delete the user again later, or kill them "
        f"by hand (pkill -KILL -U {uid})"
    )


def _processes_of(uid: int) -> list[tuple[int, int]]:
    """(pid, pidfd) of each live (not zombie) process that runs as ``uid``."""
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        if _runs_as(pid, uid):
            found.append((pid, fd))
        else:
            os.close(fd)
    return found


def _runs_as(pid: int, uid: int) -> bool:
    # Bytes: the Name line is the process's own to set, in any bytes (prctl).
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = dict(line.split(b":", 1) for line in f if b":" in line)
    except OSError:
        return False  # gone
    if status.get(b"State", b"").split()[:1] == [b"Z"]:
        return False  # already ended; its parent reaps it
    return str(uid).encode() in status.get(b"Uid", b"").split()


def _getpw(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None
