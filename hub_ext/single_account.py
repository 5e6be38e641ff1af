"""Where one Unix account runs every user's code, and saying so.

`gpulab up` as root gives each hub user a Unix account of their own
(:mod:`gpulab.enforcement.accounts`): their server, job ranks and model replicas run
as it. Without root there are no such accounts: everyone's code would run as the
hub's own account, beside its secrets and each other's work. So `gpulab up` without
root refuses to start unless ``--single-account`` says that is meant (a one-person
hub); then, and wherever accounts are off as root (``c.UserAccounts.enabled =
False``), the banner, the spawn form and ``%gpulab`` say whose account runs the code.
"""

from __future__ import annotations

import os
import pwd
import sys

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
