"""What a hub may leave on the host: cgroups, jobs' network namespaces, its own processes.

Read from the host itself (``/sys/fs/cgroup``, ``/run/netns``, ``/proc``), so a test
sees what an operator would find after a stop.
"""

from __future__ import annotations

import os

from gpulab.backend.job_network import NETNS_DIR, PREFIX
from gpulab.enforcement.accounts import unix_name
from gpulab.hub_ext import leftover_processes

CGROUP_ROOT = "/sys/fs/cgroup"


def cgroups_of(user: str) -> list[str]:
    """Every cgroup gpulab made for ``user``'s account, in every hierarchy (v1: one per
    controller; v2: the unified one), the account's own and each below it."""
    account = unix_name(user)
    found = []
    for top, dirs, _ in os.walk(CGROUP_ROOT):
        if os.path.basename(top) == "gpulab" and account in dirs:
            mine = os.path.join(top, account)
            found += [d for d, _, _ in os.walk(mine)]
            dirs.remove(account)
    return sorted(found)


def job_namespaces(job_ids) -> list[str]:
    """The network namespaces of these jobs that still exist."""
    return [j for j in job_ids if os.path.exists(os.path.join(NETNS_DIR, PREFIX + j))]


def platform_processes(data_dir) -> list[str]:
    """The hub's own processes on ``data_dir`` still running (service, standby, culler,
    proxy, hub), as ``"the gpulab service (pid 12)"``."""
    left = leftover_processes.find(data_dir)
    for p in left:
        p.close()
    return [f"{p.what} (pid {p.pid})" for p in left]
