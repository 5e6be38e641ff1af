"""Where one Unix account runs every user's code, and saying so.

`gpulab up` as root gives each hub user a Unix account of their own
(:mod:`gpulab.enforcement.accounts`): their server, job ranks and model replicas run
as it. Without root there are no such accounts: everyone's code would run as the
hub's own account, beside its secrets and each other's work. So `gpulab up` without
root refuses to start unless ``--single-account`` says that is meant (a one-person
hub); then, and wherever accounts are off as root (``c.UserAccounts.enabled =
False``), the banner, the spawn form and ``%gpulab`` say whose account runs the code.

Such a hub is one person's: the first user to start a server on it owns it
(``<data-dir>/single-account-user``), and any other user's start is refused with
the fix, since two people on one account can read and change each other's files
and processes. A site that means to share it (a trusted pair) names who else may:
``c.SingleAccount.shared_by = ["bob"]`` (``["*"]``: anyone).
"""

from __future__ import annotations

import os
import pwd
import sys

from tornado import web
from traitlets import List, Unicode
from traitlets.config import Configurable

from gpulab.enforcement.accounts import UserAccounts
from gpulab.spawner.form import SINGLE_ACCOUNT_ENV, SINGLE_ACCOUNT_WARNING


def account_name(uid: int | None = None) -> str:
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return f"uid {uid}"


def refusal(root: bool, single_account: bool) -> str:
    """Why `gpulab up` will not start, with the fix; "" when it may."""
    if not root and not single_account:
        return (
            f"not root, so every user's code would run as {account_name()} and users "
            f"could read each other's work: run as root so each user gets a Unix "
            f"account, or pass --single-account for a one-person hub"
        )
    if root and single_account:
        return (
            "--single-account as root would run every user's code as root: drop it "
            "(as root each user gets a Unix account of their own)"
        )
    return ""


def shared_account(c) -> str:
    """The account every user's code runs as under the hub config ``c`` (its
    ``c.UserAccounts`` settings), or "" where each user has one of their own."""
    if UserAccounts(config=c).enabled:
        return ""
    return account_name()


def say_single_account(c, env=os.environ, out=None) -> str:
    """Where one account runs everyone's code: put its name in the hub's environment
    (the spawn form) and the servers' (``%gpulab``), and print the banner's line.
    Call after <data-dir>/gpulab_config.py is loaded: it may turn accounts off."""
    account = shared_account(c)
    if not account:
        return ""
    env[SINGLE_ACCOUNT_ENV] = account
    environment = c.Spawner.environment if "environment" in c.Spawner else {}
    c.Spawner.environment = {**environment, SINGLE_ACCOUNT_ENV: account}
    print(f"  {SINGLE_ACCOUNT_WARNING.format(account=account)}", file=out or sys.stdout, flush=True)
    return account


#: Who owns a single-account hub: the first user to start a server, in the data dir.
OWNER_FILE = "single-account-user"


class SingleAccount(Configurable):
    """Who may use a hub where one Unix account runs everyone's code."""

    shared_by = List(
        Unicode(),
        help="""Hub users who may start servers on a single-account hub besides its
        first user (`["*"]`: anyone). They share one Unix account: each can read and
        change the others' files and processes.

        c.SingleAccount.shared_by = ["bob"]
        """,
    ).tag(config=True)


def owner_of(path: str, name: str) -> str:
    """The hub's one user: the name already recorded at ``path``, else ``name`` (then
    recorded; O_EXCL, so two first starts at once cannot both win)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(name + "\n")
    return name


def one_person_only(c, data_dir) -> None:
    """On a single-account hub, refuse a server to anyone but its first user (and
    ``c.SingleAccount.shared_by``), before the hub's own ``pre_spawn_hook``."""
    account = shared_account(c)
    shared = set(SingleAccount(config=c).shared_by)
    if not account or "*" in shared:
        return
    earlier = c.Spawner.pre_spawn_hook if "pre_spawn_hook" in c.Spawner else None
    path = os.path.join(str(data_dir), OWNER_FILE)

    def refuse_a_second_person(spawner):
        name = spawner.user.name
        owner = owner_of(path, name)
        if name != owner and name not in shared:
            raise web.HTTPError(
                403,
                f"This hub runs everyone's code as one account ({account}), so it is "
                f"{owner}'s alone. Ask its admin to run gpulab as root (each user then "
                f"gets an account of their own).",
            )
        return earlier(spawner) if earlier else None

    c.Spawner.pre_spawn_hook = refuse_a_second_person
