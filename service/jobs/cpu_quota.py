"""A user's CPU and memory quota: what their work may use at once, on by default.

``c.GpuLabService.user_cpu_quota`` (default: the host's cores) and
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

from dataclasses import dataclass

from gpulab.enforcement.limits import format_bytes


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
            cpu_quota=service.user_cpu_quota,
            cpu_overcommit=service.cpu_overcommit,
            memory_quota=service.user_memory_quota,
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
                f"or ask an admin to raise c.GpuLabService.user_cpu_quota"
            )
        memory = processes * memory_each
        if self.memory_quota and memory > self.memory_quota:
            return (
                f"{asks} {format_bytes(memory)} of memory "
                f"({format_bytes(memory_each)} each); your quota is "
                f"{format_bytes(self.memory_quota)}: use fewer {what} or ask an admin to "
                f"raise c.GpuLabService.user_memory_quota"
            )
        return None
