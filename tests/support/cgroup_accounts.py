"""Real Unix accounts and cgroups for one test (root in CI): the accounts and limits
the service's backends use, and a user of this test only, removed at the end."""

from __future__ import annotations

import subprocess
import uuid
from contextlib import contextmanager

import pytest


@contextmanager
def cgroup_accounts(tmp_path, prefix: str):
    """``(accounts, limits, user)``; the test is skipped on a host without a cgroup
    mechanism."""
    from hubproc import fresh_user, let_accounts_reach

    from gpulab.enforcement.account_limits import AccountLimits
    from gpulab.enforcement.accounts import UserAccounts

    let_accounts_reach(tmp_path)
    limits = AccountLimits()
    if limits.cgroups().kind == "none":
        pytest.skip(f"no cgroup mechanism on this host: {limits.cgroups().describe()}")
    accounts = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    user = fresh_user(f"{prefix}{uuid.uuid4().hex[:4]}")
    try:
        yield accounts, limits, user
    finally:
        subprocess.run(["userdel", accounts.name_for(user)], capture_output=True)
