"""CPU, memory, process and device limits for what an account runs: a server, a
job's node (torchrun and its ranks) or a model replica.

Proportional to the slice (``cpu_per_gpu``, ``memory_per_gpu``; by default
the host divided among its GPUs), never below the floors, at most ``pids_max``
processes, held by the host's own mechanism (:mod:`gpulab.enforcement.cgroups`:
systemd, cgroup v2 or v1). A slice on real GPUs also gets a device rule: only its
own cards. Settings, in ``<data-dir>/gpulab_config.py`` (the hub and the service
both read them)::

    c.AccountLimits.cpu_per_gpu = 8
    c.AccountLimits.memory_per_gpu = 64 * 2**30
    c.AccountLimits.memory_floor = 4 * 2**30
    c.AccountLimits.pids_max = 4096

The service also holds each user to their quota (``quota_cpu``, ``quota_memory``,
from ``c.HostQuota.user_cpu_quota`` and ``user_memory_quota``): no group of
theirs gets more, and the account's groups together are held to it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from traitlets import Bool, Float, Int, Unicode
from traitlets.config import Configurable

from .cgroups import CgroupError, Cgroups, Group
from .limits import (
    DEFAULT_CPU_FLOOR,
    DEFAULT_MEMORY_FLOOR,
    DEFAULT_PIDS,
    Limits,
    capped,
    host_share_per_gpu,
    limits_for_slice,
)

log = logging.getLogger("gpulab.limits")


def host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class LimitsNotHeld(OSError):
    """The host holds groups (a mechanism was found) but could not make this one: the
    work is not started, since it would run with no limits and, where the cards are
    real, with every GPU of the host rather than its slice."""


class AccountLimits(Configurable):
    enabled = Bool(
        True,
        help="""Hold every server, job node and replica of a user's account to CPU,
        memory and device limits (needs root and cgroups; says why not otherwise).

        c.AccountLimits.enabled = False
        """,
    ).tag(config=True)

    mechanism = Unicode(
        "auto",
        help="""How limits are held: auto (systemd when it is PID 1, else cgroup v2, else
        cgroup v1), systemd, cgroup2, cgroup1 or none.

        c.AccountLimits.mechanism = "cgroup1"
        """,
    ).tag(config=True)

    cpu_per_gpu = Float(
        0.0,
        help="""CPU cores per whole GPU of the slice (a 1/4 slice gets a quarter).
        0: the host's cores divided among its GPUs.

        c.AccountLimits.cpu_per_gpu = 8
        """,
    ).tag(config=True)

    memory_per_gpu = Int(
        0,
        help="""Memory in bytes per whole GPU of the slice. 0: nine tenths of the host's
        memory divided among its GPUs.

        c.AccountLimits.memory_per_gpu = 64 * 2**30
        """,
    ).tag(config=True)

    cpu_floor = Float(
        DEFAULT_CPU_FLOOR,
        help="""CPU cores for the smallest slice and for
        work without a GPU (per rank for jobs).

        c.AccountLimits.cpu_floor = 1
        """,
    ).tag(config=True)

    memory_floor = Int(
        DEFAULT_MEMORY_FLOOR,
        help="""Memory in bytes for the smallest slice
        and for work without a GPU (per rank for jobs).

        c.AccountLimits.memory_floor = 4 * 2**30
        """,
    ).tag(config=True)

    pids_max = Int(
        DEFAULT_PIDS,
        help="""Most processes and threads one server, job node or model replica may
        have at once (a fork bomb gets EAGAIN there, not the host's process table).
        0: not limited.

        c.AccountLimits.pids_max = 8192
        """,
    ).tag(config=True)

    #: The user's quota, set by the service (c.HostQuota.user_cpu_quota and
    #: user_memory_quota): no group gets more; 0: none (the hub's own instance).
    quota_cpu = Float(0.0)
    quota_memory = Int(0)

    _cgroups: Cgroups | None = None

    def cgroups(self) -> Cgroups:
        if AccountLimits._cgroups is None:
            AccountLimits._cgroups = Cgroups.detect(self.mechanism if self.enabled else "none")
        return AccountLimits._cgroups

    def limits(
        self,
        gpu_milli: int,
        gpu_count: int,
        ranks: int = 1,
        gpu_devices: Sequence[str] | None = None,
    ) -> Limits:
        """The limits of ``ranks`` processes with ``gpu_milli`` each, within the quota."""
        asked = self.asked(gpu_milli, gpu_count, ranks, gpu_devices)
        # Never more than the user's quota (nor, by its default, than the host has).
        return capped(asked, self.quota_cpu, self.quota_memory)

    def asked(
        self,
        gpu_milli: int,
        gpu_count: int,
        ranks: int = 1,
        gpu_devices: Sequence[str] | None = None,
    ) -> Limits:
        """What ``ranks`` processes with ``gpu_milli`` each ask, before the quota."""
        cpu, memory = host_share_per_gpu(os.cpu_count() or 1, host_memory(), max(gpu_count, 1))
        one = limits_for_slice(
            gpu_milli,
            self.cpu_per_gpu or cpu,
            self.memory_per_gpu or memory,
            cpu_floor=self.cpu_floor,
            memory_floor=self.memory_floor,
            gpu_devices=gpu_devices,
        )
        return Limits(
            cpu_cores=one.cpu_cores and round(one.cpu_cores * ranks, 3),
            memory_bytes=one.memory_bytes and one.memory_bytes * ranks,
            devices=one.devices,
            pids=self.pids_max or None,
        )

    def quota(self) -> Limits:
        """What one account's groups are held to together."""
        return Limits(self.quota_cpu or None, self.quota_memory or None, None)

    def group(
        self,
        account_name: str,
        unit: str,
        gpu_milli: int,
        gpu_count: int,
        ranks: int = 1,
        gpu_devices: Sequence[str] | None = None,
    ) -> Group | None:
        """A group ``<account>/<unit>`` with the slice's limits. On a host with no way
        to hold them (not root, no cgroup filesystem) the group holds nothing and its
        notes say why (the work runs unlimited, as the docs say). Where the host has a
        way and making this group failed: :class:`LimitsNotHeld`, and the work does
        not start (it ran unlimited, and saw every GPU of the host)."""
        try:
            notes = self._hold(account_name)
            group = self.cgroups().create(
                f"{account_name}/{unit}", self.limits(gpu_milli, gpu_count, ranks, gpu_devices)
            )
            group.notes += [n for n in notes if n not in group.notes]
            return group
        except (CgroupError, OSError, ValueError) as e:
            log.warning("No limits for %s/%s: %s", account_name, unit, e)
            raise LimitsNotHeld(
                f"the host could not hold {unit} of {account_name} to its slice ({e}); "
                "it was not started: an admin finds why in the service's log"
            ) from e

    def _hold(self, account_name: str) -> list[str]:
        if self.quota().unlimited:
            return []
        try:
            return self.cgroups().hold(account_name, self.quota())
        except (CgroupError, OSError) as e:
            # e.g. v1 refuses a CPU quota below one a running group of the account has.
            log.warning("The quota of %s is not held: %s", account_name, e)
            return [f"the account's quota is not held: {e}"]

    def remove(self, account_name: str, unit: str) -> None:
        """Remove a group (killing what is left in it); quietly, if it is gone."""
        try:
            self.cgroups().open(f"{account_name}/{unit}").remove()
        except (CgroupError, OSError) as e:
            log.warning("Could not remove the group %s/%s: %s", account_name, unit, e)
