"""The job backend of each pool, built from the classes the settings name.

``c.GpuLabService.jobs_backend_class``, ``serving_backend_class`` and
``inventory_class`` (and each pool's keys) are
:class:`~gpulab.service.plugins.NamedType` traits: a class, its import path, or a
plug-in's short name (``"local"``, ``"kubernetes"``, ``"slurm"``, or a site's own entry
point). This module builds the job backends from them, each the one way
(:func:`gpulab.service.plugins.build`); the serving backend is the deployment
manager's to build.
"""

from __future__ import annotations

from gpulab.backend.base import Backend, JobStatus
from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.service.plugins import ConfigError, build

#: What runs user code beside the service, and the chart value that gives it pods.
_LOCAL_USER_CODE = {
    "jobs_backend_class": ("jobs' ranks", "jobs.kubernetes.enabled: true"),
    "serving_backend_class": ("endpoints' replicas", "deployments.kubernetes.enabled: true"),
}


def refuse_local_user_code(service, trait: str, cls: type | None = None) -> None:
    """Stop the start where ``c.GpuLabService.user_code_in_service`` is off (the chart's
    service pod) but ``trait`` (or a pool's ``cls`` of that trait) is a local backend:
    its work would be processes in the service's own pod, beside the hub tokens and
    the database."""
    if service.user_code_in_service:
        return
    local = service.traits()[trait].validate(service, "local")
    if not issubclass(cls or service.traits()[trait].get(service), local):
        return
    what, chart = _LOCAL_USER_CODE[trait]
    where = f"c.GpuLabService.{trait} is" if cls is None else "a pool's backend is"
    raise ConfigError(
        f"{where} 'local' but c.GpuLabService.user_code_in_service "
        f"is False: {what} would run in the service's own pod, beside its tokens and "
        f"database; set {trait} = 'kubernetes' (chart: {chart}), or accept user code "
        f"there with user_code_in_service = True (chart: "
        f"service.allowUserCodeInServicePod: true)"
    )


class NoLocalJobs(Backend):
    """Jobs of an earlier local run on a site that has no local pool now (their
    directories survive): they read as before and report as ended, since nothing of
    them can be running here. New jobs never come here (the pools refuse them)."""

    name = "local"

    refusal = "this site has no local pool now; the job cannot run here"

    def check(self, spec: JobSpec) -> None:
        raise SpecError(self.refusal)

    async def start(self, spec: JobSpec, allocations: list[dict]) -> None:
        raise SpecError(self.refusal)  # check() stops it first; never a process here

    async def poll(self, spec: JobSpec) -> JobStatus:
        return JobStatus("failed", message=self.refusal)

    async def reattach(self, spec: JobSpec) -> bool:
        return False

    async def cancel(self, spec: JobSpec) -> None:
        pass

    async def preempt(self, spec: JobSpec) -> None:
        pass


def job_backends(service, root: str) -> dict[str, Backend]:
    """The job backend of each pool of the site (``service.site_pools``), under the
    pool's name. A local one only where user code may run beside the service."""
    return {pool.name: pool_backend(service, pool, root) for pool in service.site_pools.list}


def pool_backend(service, pool, root: str) -> Backend:
    cls = pool.jobs
    if cls.runs_on_this_host:
        # Named as the site set it: the trait, or a pool of c.InventorySettings.pools.
        pools = service.inventory_settings.pools
        refuse_local_user_code(service, "jobs_backend_class", cls if pools else None)
    shortcut = ("kubernetes_jobs", service.kubernetes_jobs)
    return build(
        cls,
        service,
        root=root,
        gpus=pool.gpus,
        shortcut=shortcut if issubclass(cls, KubernetesBackend) else None,
    )
