"""A user's CPU and memory quota: what their work may use at once, on by default.

``c.HostQuota.user_cpu_quota`` (default: the host's cores) and
``user_memory_quota`` (default: the host's memory less a tenth, kept for the hub,
the service and the kernel) are held by the kernel, not counted here: every group
of the user's (a job node, a replica) is capped at the quota instead of asking
ranks x floor, and the account's groups together are held to it
(:meth:`gpulab.enforcement.account_limits.AccountLimits.quota`).

What is checked here is the ask of one job or deployment, at submit: CPU time
is shared, so ranks beyond the quota run slower, up to ``cpu_overcommit`` times
the quota; memory is not shared, so the ranks' floors must fit the memory quota.
A job that could never run within them is refused with the fix (403).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from traitlets import Float, Int, default, validate
from traitlets.config import Configurable

from gpulab.enforcement.account_limits import host_memory
from gpulab.enforcement.limits import format_bytes, host_user_quota

from ..setting_checks import at_least_one, zero_or_more


class HostQuota(Configurable):
    """The settings of one user's quota on this host: ``c.HostQuota.*`` in the
    service's config (the kernel holds the account to them; :class:`CpuQuota` checks
    a job's or a deployment's ask against them)."""

    user_cpu_quota = Float(
        help="""CPU cores one user's work on this host (jobs of the local backend,
        local endpoints' replicas) may use at once. Held by the kernel: no job node
        or replica gets more (not ranks x c.AccountLimits.cpu_floor), and all of the
        user's groups together are held to it. A job asking more than
        cpu_overcommit times it is refused at submit. Default: the host's cores.
        0: no CPU quota.

        c.HostQuota.user_cpu_quota = 8
        """,
    ).tag(config=True)

    user_memory_quota = Int(
        help="""Memory in bytes one user's work on this host may use at once, held as
        user_cpu_quota is; a job whose ranks' memory (c.AccountLimits.memory_floor or
        their slices' share each) is over it is refused at submit. Default: the
        host's memory less a tenth (kept for the hub, the service and the kernel).
        0: no memory quota.

        c.HostQuota.user_memory_quota = 64 * 2**30
        """,
    ).tag(config=True)

    cpu_overcommit = Float(
        4.0,
        help="""How many times their CPU quota one job or deployment of a user may ask
        (ranks x c.AccountLimits.cpu_floor): CPU time is shared, so ranks beyond the
        quota run slower rather than fail, up to this (OpenStack's default CPU
        allocation ratio is 4 too).

        c.HostQuota.cpu_overcommit = 1
        """,
    ).tag(config=True)

    @default("user_cpu_quota")
    def _user_cpu_quota(self):
        return host_user_quota(os.cpu_count() or 1, host_memory())[0]

    @default("user_memory_quota")
    def _user_memory_quota(self):
        return host_user_quota(os.cpu_count() or 1, host_memory())[1]

    @validate("user_cpu_quota", "user_memory_quota")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "no quota")

    @validate("cpu_overcommit")
    def _at_least_one(self, proposal):
        return at_least_one(proposal, "no overcommit")


@dataclass(frozen=True)
class CpuQuota:
    """The quota's settings and what one process asks: built from the service's
    settings once (:meth:`of`), then asked by the job and deployment managers."""

    #: The hosts' per-group limits (``AccountLimits``): what one process of a slice asks.
    account_limits: object
    gpu_count: int
    cpu_quota: float  # cores, 0 = none
    cpu_overcommit: float
    memory_quota: int  # bytes, 0 = none

    @classmethod
    def of(cls, service) -> CpuQuota:
        return cls(
            account_limits=service.account_limits,
            gpu_count=len(service.gpus),
            cpu_quota=service.host_quota.user_cpu_quota,
            cpu_overcommit=service.host_quota.cpu_overcommit,
            memory_quota=service.host_quota.user_memory_quota,
        )

    def per_process(self, gpu_milli: int) -> tuple[float, int]:
        """The cores and bytes one rank or replica of ``gpu_milli`` asks (its group's
        limits before the quota; the floors where the host gives no per-GPU share)."""
        limits = self.account_limits
        one = limits.asked(gpu_milli, self.gpu_count)
        return one.cpu_cores or limits.cpu_floor, one.memory_bytes or limits.memory_floor

    def over(self, user: str, processes: int, gpu_milli: int, what: str) -> str | None:
        """Why ``processes`` ranks (or replicas) of ``gpu_milli`` cannot run within the
        user's quota, or None. ``what`` names them ("ranks", "replicas")."""
        cpu_each, memory_each = self.per_process(gpu_milli)
        asks = f"{processes} {what} need" if processes != 1 else f"1 {what.rstrip('s')} needs"
        quota, overcommit = self.cpu_quota, self.cpu_overcommit
        cpu = processes * cpu_each
        if quota and cpu > quota * overcommit:
            return (
                f"{asks} {cpu:g} CPUs; your quota is {quota:g} "
                f"(up to {quota * overcommit:g} shared): use fewer {what} "
                f"or ask an admin to raise c.HostQuota.user_cpu_quota"
            )
        memory = processes * memory_each
        if self.memory_quota and memory > self.memory_quota:
            return (
                f"{asks} {format_bytes(memory)} of memory "
                f"({format_bytes(memory_each)} each); your quota is "
                f"{format_bytes(self.memory_quota)}: use fewer {what} or ask an admin to "
                f"raise c.HostQuota.user_memory_quota"
            )
        return None
