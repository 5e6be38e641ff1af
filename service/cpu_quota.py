"""A per-user CPU quota for work without a GPU slice.

GPU work is bounded by the ledger's milli-GPU quotas; CPU-only job ranks and
CPU-only model replicas hold no slice, so without this one user could fill
the host's cores. Each such process counts the cores its cgroup gets
(``c.AccountLimits.cpu_floor``) from submit (queued jobs too) until it ends.
``c.GpuLabService.user_cpu_quota = 0`` (the default) leaves it off.
"""

from __future__ import annotations

from gpulab.db.jobs import TERMINAL


def cpu_held(service, user: str) -> float:
    """Cores held by the user's CPU-only jobs (queued or running) and replicas."""
    per = service.account_limits.cpu_floor
    ranks = 0
    jobs = getattr(service, "jobs", None)
    if jobs is not None:
        ranks += sum(
            j["nodes"] * j["nproc_per_node"]
            for j in jobs.queue.list(user=user)
            if not j["gpu_milli"] and j["state"] not in TERMINAL
        )
    deployments = getattr(service, "deployments", None)
    if deployments is not None:
        ranks += sum(
            d["replicas"]
            for d in deployments.store.list(user=user)
            if not d["gpu_milli"] and d["state"] not in ("failed", "stopped")
        )
    return ranks * per


def over_cpu_quota(service, user: str, processes: int) -> str | None:
    """Why ``processes`` more CPU-only processes would pass the user's quota, or None."""
    quota = service.user_cpu_quota
    if not quota:
        return None
    asked = processes * service.account_limits.cpu_floor
    held = cpu_held(service, user)
    if held + asked <= quota:
        return None
    return (
        f"over your CPU quota: your CPU-only jobs and endpoints hold {held:g} core(s) and "
        f"this asks {asked:g} more; the quota is {quota:g}. Stop some first, ask for a GPU "
        f"slice, or ask an admin to raise c.GpuLabService.user_cpu_quota"
    )
