"""A Unix account per hub user: who a server, a job's ranks and a replica run as.

When gpulab runs as root (the embedded default on a real machine), every hub
user maps to an account of their own, ``<prefix><name>`` (default prefix
``gpulab-``), created on first use with a private group, a ``0700`` home under
``home_root`` and membership in one shared group (``gpulab-users``). The
spawner, the local job backend and the local serving backend start their
processes as that account, so the kernel's own permissions keep users out of
each other's homes, processes (``/proc/<pid>/environ``, signals) and of the
hub's state.

Names follow The Littlest JupyterHub's rule, made collision-free
(:mod:`gpulab.enforcement.account_names`): a hub name made only of
``[a-z0-9-]`` that fits is used as it is; any other name (unicode, ``_``,
``.``, too long) becomes ``<prefix>_<120 bits of its SHA-256>``. Every account
records the hub name it was made for in its comment, and an account recorded
for another hub user is refused, never shared.

Both the hub (spawner) and the gpulab service read the same settings, from
``<data-dir>/gpulab_config.py``::

    c.UserAccounts.prefix = "jupyter-"
    c.UserAccounts.home_root = "/srv/homes"
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shlex
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass

from traitlets import Bool, Unicode, default, validate
from traitlets.config import Configurable

from .account_names import (
    MAX_NAME,
    account_record,
    is_plain,
    legacy_unix_name,
    recorded_for,
    retired_on,
    unix_name,
)

__all__ = [
    "MAX_NAME",
    "Account",
    "AccountError",
    "UserAccounts",
    "run_module_as",
    "separated",
    "unix_name",
    "unreachable",
]


class AccountError(RuntimeError):
    """An account could not be found or made; the message says why and what to do."""


@dataclass(frozen=True)
class Account:
    """A resolved account: what a process needs to become it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str = "/bin/bash"

    def popen_kwargs(self) -> dict:
        """``subprocess.Popen`` arguments that start the child as this account.

        Python sets the groups, then the gid, then the uid in the child, before
        any ``preexec_fn`` and before ``exec``.
        """
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self) -> dict[str, str]:
        return {
            "HOME": self.home,
            "USER": self.name,
            "LOGNAME": self.name,
            "SHELL": self.shell,
            # torch.compile's cache (compiled code it loads again) is by default
            # /tmp/torchinductor_<account>: a name another account can make first, in
            # mode 0777, and then swap the code in. In the private home nobody can.
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(self.home, ".cache", "torchinductor"),
        }

    def owns(self, st: os.stat_result) -> bool:
        return st.st_uid == self.uid


#: The files cron and at read for who may not use them: an account's crontab (or
#: ``at`` job) would run its processes outside every group gpulab holds it to (no
#: slice, no memory cap, every GPU device) and after its work has stopped.
SCHEDULER_DENY_FILES = ("/etc/cron.deny", "/etc/at.deny")


def deny_schedulers(name: str) -> None:
    """Name the account in :data:`SCHEDULER_DENY_FILES` (once; the files are made
    if missing, which denies no one else). A file that cannot be written is skipped:
    the account is still made (a site without root has neither cron nor accounts)."""
    for path in SCHEDULER_DENY_FILES:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o644)
        except OSError:
            continue
        with os.fdopen(fd, "r+") as f:
            text = f.read()
            if name not in text.split():
                f.write(("" if not text or text.endswith("\n") else "\n") + name + "\n")


class UserAccounts(Configurable):
    """Maps hub users to Unix accounts and creates them on first use."""

    enabled = Bool(
        help="""Run each user's server, job ranks and model replicas as a Unix account of
        their own. On by default when gpulab runs as root; needs `useradd` (Debian's
        `passwd` package). Off, everything runs as the hub's own account and users are
        not separated on the host.

        c.UserAccounts.enabled = True
        """,
    ).tag(config=True)

    @default("enabled")
    def _enabled_default(self):
        return os.geteuid() == 0

    prefix = Unicode(
        "gpulab-",
        help="""Prefix of the Unix account names (`gpulab-alice`). Must start with a
        lowercase letter.

        c.UserAccounts.prefix = "jupyter-"
        """,
    ).tag(config=True)

    @validate("prefix")
    def _check_prefix(self, proposal):
        value = proposal["value"]
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", value):
            raise ValueError(
                f"c.UserAccounts.prefix {value!r}: use 1-16 characters of a-z, "
                f"0-9 and '-', starting with a letter, e.g. 'gpulab-'"
            )
        return value

    home_root = Unicode(
        "/home",
        help="""Where the accounts' homes are made (`<home_root>/<account>`, mode 0700).

        c.UserAccounts.home_root = "/srv/gpulab/homes"
        """,
    ).tag(config=True)

    group = Unicode(
        "gpulab-users",
        help="""A group every account joins (for file shares and limits you add).

        c.UserAccounts.group = "gpulab-users"
        """,
    ).tag(config=True)

    shell = Unicode(
        "/bin/bash",
        help="""Login shell of new accounts (JupyterLab's
        terminals start it).

        c.UserAccounts.shell = "/bin/bash"
        """,
    ).tag(config=True)

    _lock = threading.Lock()

    def name_for(self, hub_name: str) -> str:
        return unix_name(hub_name, self.prefix)

    def home_for(self, hub_name: str) -> str:
        return os.path.join(self.home_root, self.name_for(hub_name))

    def lookup(self, hub_name: str) -> Account | None:
        """The existing account of a hub user, or None.

        Raises :class:`AccountError` if the account of that name was made for
        another hub user (or, for a hashed name, not by gpulab): it is never
        shared. An account the earlier naming rule made is found when its record
        names exactly this hub user.
        """
        name = self.name_for(hub_name)
        pw = _getpw(name)
        if pw is not None:
            deleted = retired_on(pw.pw_gecos)
            if deleted is not None:
                # The message reaches the user's spawn page; the person it names
                # had their name.
                record = shlex.quote(account_record(hub_name))
                raise AccountError(
                    f"the Unix account {name} belonged to an earlier hub user named "
                    f"{hub_name!r}, deleted on {deleted}; it is locked and its home "
                    f"kept. An admin removes it (userdel -r {name}) to give the name to "
                    f"this user, or, for the same person, gives it back: usermod "
                    f"--unlock --expiredate '' --comment {record} {name}"
                )
            owner = recorded_for(pw.pw_gecos, hub_name)
            if owner is False or (owner is None and not is_plain(hub_name, self.prefix)):
                whose = "another hub user's" if owner is False else "not made by gpulab"
                # The message reaches the user's spawn page: it names no one else.
                raise AccountError(
                    f"the Unix account {name} for {hub_name!r} exists but is {whose}: "
                    f"remove it (userdel {name}) if it is stale, or rename this hub user"
                )
            return self._account(pw)
        legacy = legacy_unix_name(hub_name, self.prefix)
        pw = _getpw(legacy) if legacy != name else None
        if pw is not None and recorded_for(pw.pw_gecos, hub_name):
            return self._account(pw)
        return None

    def _account(self, pw: pwd.struct_passwd) -> Account:
        name = pw.pw_name
        groups = tuple(g for g in os.getgrouplist(name, pw.pw_gid) if g != pw.pw_gid)
        return Account(
            name=name,
            uid=pw.pw_uid,
            gid=pw.pw_gid,
            groups=groups,
            home=os.path.join(self.home_root, name),
            shell=pw.pw_shell or self.shell,
        )

    def ensure(self, hub_name: str) -> Account:
        """The account of a hub user, created (with its home) if it is missing.

        Safe to call from the hub and the service at once: a lost race with
        another process's ``useradd`` is taken as success.
        """
        with self._lock:
            account = self.lookup(hub_name)
            if account is None:
                self._ensure_group()
                name = self.name_for(hub_name)
                done = subprocess.run(
                    [
                        "useradd",
                        "--no-create-home",
                        "--user-group",
                        "--home-dir",
                        self.home_for(hub_name),
                        "--shell",
                        self.shell,
                        "--groups",
                        self.group,
                        "--comment",
                        account_record(hub_name),
                        name,
                    ],
                    capture_output=True,
                    text=True,
                )
                account = self.lookup(hub_name)
                if account is None:
                    raise AccountError(
                        f"cannot create the Unix account {name} for "
                        f"{hub_name!r}: {done.stderr.strip() or done.returncode}"
                    )
            self._ensure_home(account)
            deny_schedulers(account.name)
            return account

    def _ensure_group(self) -> None:
        try:
            grp.getgrnam(self.group)
        except KeyError:
            subprocess.run(["groupadd", "--force", self.group], capture_output=True)

    def _ensure_home(self, account: Account) -> None:
        if not os.path.isdir(self.home_root):  # ours to make; an existing one is left alone
            os.makedirs(self.home_root, exist_ok=True)
            os.chmod(self.home_root, 0o711)
        try:
            os.mkdir(account.home, 0o700)
        except FileExistsError:
            st = os.lstat(account.home)
            if not (
                os.path.isdir(account.home)
                and not os.path.islink(account.home)
                and account.owns(st)
            ):
                raise AccountError(
                    f"{account.home} exists but is not {account.name}'s own "
                    f"directory; move it away or set c.UserAccounts.home_root"
                ) from None
            return
        os.chown(account.home, account.uid, account.gid)
        os.chmod(account.home, 0o700)


def first_user_uid(login_defs: str = "/etc/login.defs") -> int:
    """The first uid of people's accounts (``UID_MIN``; 1000 where it is not said):
    below it are the system's own (root, daemon, slurm, munge...)."""
    try:
        with open(login_defs) as f:
            for line in f:
                words = line.split()
                if len(words) == 2 and words[0] == "UID_MIN" and words[1].isdigit():
                    return int(words[1])
    except OSError:
        pass
    return 1000


def _getpw(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def unreachable(path: str, execute: bool = False) -> str | None:
    """Why other accounts cannot use ``path`` (read it, or run it), or None.

    Every folder above it must let others pass (``o+x``); a checkout under a
    ``0700`` home is the usual culprit.
    """
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        folder = os.sep.join(parts[:i]) or os.sep
        try:
            mode = os.stat(folder).st_mode
        except OSError as e:
            return f"{folder}: {e.strerror}"
        if not mode & 0o001:
            return (
                f"{folder} is mode {mode & 0o777:04o}, so other accounts cannot reach "
                f"{path}: install gpulab where users can read it (e.g. /opt/gpulab) or "
                f"run `chmod o+x {folder}`"
            )
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"{path}: {e.strerror}"
    want = 0o001 if stat.S_ISDIR(mode) else 0o005 if execute else 0o004
    if mode & want != want:
        return (
            f"{path} is mode {mode & 0o777:04o}: other accounts cannot "
            f"{'run' if execute else 'read'} it; run `chmod o+r{'x' if execute else ''} "
            f"{path}`"
        )
    return None


def run_module_as(
    account: Account, module: str, *args: str, stdin: str | None = None
) -> str | None:
    """``python -I -m module args...`` as ``account``, in its home: the way root does
    something in a user's home (a link they planted there cannot make root write
    elsewhere). ``stdin``: what it reads (a secret never goes on a command line).
    None on success, else the child's last line."""
    run = subprocess.run(
        # -I: not the home (the cwd) on sys.path, nor the user site: only gpulab runs.
        [sys.executable, "-I", "-m", module, *args],
        env={**account.env(), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        cwd=account.home,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        **account.popen_kwargs(),
    )
    if run.returncode:
        lines = (run.stderr or run.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {run.returncode}"
    return None


def separated(root: str, accounts: UserAccounts | None, limits):
    """``(accounts, limits)`` a backend runs users' processes with, both None when
    accounts are off (everything runs as the service). With accounts, ``root`` (where
    the backend keeps each job's or deployment's folder) becomes 0711: owners reach
    their own folder, nobody lists them."""
    if accounts is None or not accounts.enabled:
        return None, None
    os.chmod(root, 0o711)
    return accounts, limits
