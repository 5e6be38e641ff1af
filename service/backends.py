"""Which classes do the service's work, chosen by configuration.

``c.GpuLabService.jobs_backend_class``, ``serving_backend_class`` and
``inventory_class`` are :class:`NamedType` traits: a class, its import path, or a
short name (``"local"``, ``"kubernetes"``, ``"slurm"``). This module builds the job backends
from them; the serving backend is the deployment manager's to build.
"""

from __future__ import annotations

from traitlets import Type

from gpulab.backend.base import Backend, JobStatus
from gpulab.backend.job_network import JobNetwork
from gpulab.backend.local import LocalBackend
from gpulab.backend.spec import JobSpec, SpecError


class ConfigError(Exception):
    """A setting the service cannot start with. ``main()`` logs it on one line and
    exits 1 before anything listens, so the hub's log says what to fix."""


JOB_BACKENDS = {
    "local": "gpulab.backend.local.LocalBackend",
    "kubernetes": "gpulab.backend.kubernetes.backend.KubernetesBackend",
    "slurm": "gpulab.backend.slurm.SlurmBackend",
}
SERVING_BACKENDS = {
    "local": "gpulab.backend.local_serving.LocalServing",
    "kubernetes": "gpulab.backend.kubernetes.serving.KubernetesServing",
}
INVENTORIES = {
    "local": "gpulab.scheduler.inventory.LocalInventory",
    "kubernetes": "gpulab.scheduler.inventory_kube.KubernetesInventory",
    "slurm": "gpulab.backend.slurm_inventory.SlurmInventory",
}


class NamedType(Type):
    """A ``Type`` trait that also takes one of a few short names."""

    def __init__(self, names: dict[str, str], default: str = "local", **kwargs):
        self.names = names
        super().__init__(names[default], **kwargs)

    def validate(self, obj, value):
        if isinstance(value, str):
            value = self.names.get(value, value)
        return super().validate(obj, value)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


#: What runs user code beside the service, and the chart value that gives it pods.
_LOCAL_USER_CODE = {
    "jobs_backend_class": ("jobs' ranks", "jobs.kubernetes.enabled: true"),
    "serving_backend_class": ("endpoints' replicas", "deployments.kubernetes.enabled: true"),
}


def refuse_local_user_code(service, trait: str) -> None:
    """Stop the start where ``c.GpuLabService.user_code_in_service`` is off (the chart's
    service pod) but ``trait`` still names a local backend: its work would be processes
    in the service's own pod, beside the hub tokens and the database."""
    if service.user_code_in_service:
        return
    local = service.traits()[trait].validate(service, "local")
    if not issubclass(getattr(service, trait), local):
        return
    what, chart = _LOCAL_USER_CODE[trait]
    raise ConfigError(
        f"c.GpuLabService.{trait} is 'local' but c.GpuLabService.user_code_in_service "
        f"is False: {what} would run in the service's own pod, beside its tokens and "
        f"database; set {trait} = 'kubernetes' (chart: {chart}), or accept user code "
        f"there with user_code_in_service = True (chart: "
        f"service.allowUserCodeInServicePod: true)"
    )


#: How the refusal of a local job names where this site's jobs run instead, and the
#: service's own place.
_SITE_JOBS = {
    "kubernetes": ("as Kubernetes pods", "the service pod"),
    "slurm": ("on its Slurm cluster", "the service's machine"),
}


class NoLocalJobs(Backend):
    """The "local" backend where the service's machine runs no user code (the chart's
    service pod). A job for it is refused at submit with the backend to use; a job of
    an earlier local run (its directory survives) reads as before and reports as
    ended, since nothing of it can be running here."""

    name = "local"

    def __init__(self, jobs_root: str, site_backend: str):
        super().__init__(jobs_root)
        where, here = _SITE_JOBS.get(
            site_backend, (f"on its {site_backend} backend", "the service's machine")
        )
        self.refusal = (
            f"this site runs jobs {where}; {here} runs no user code (use --backend {site_backend})"
        )

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
    """The backends jobs can name (JobSpec.backend): always "local" (the default of
    every job), and the configured class under its own name when it is another.
    Without user code beside the service, "local" only refuses (:class:`NoLocalJobs`)."""
    refuse_local_user_code(service, "jobs_backend_class")
    local = dict(
        real_gpus=any(not g.simulated for g in service.gpus),
        accounts=service.accounts,
        limits=service.account_limits,
        gpu_count=len(service.gpus),
        network=JobNetwork(parent=service),
        log_max_bytes=service.job_log_max_bytes,
    )
    cls = service.jobs_backend_class
    if issubclass(cls, LocalBackend):
        return {"local": cls(root, **local)}
    if service.user_code_in_service:
        backends: dict[str, Backend] = {"local": LocalBackend(root, **local)}
    else:
        backends = {"local": NoLocalJobs(root, cls.name)}
    from gpulab.backend.kubernetes.backend import KubernetesBackend

    if issubclass(cls, KubernetesBackend):
        from .kube_jobs import jobs_settings, kubernetes_backend

        backends[cls.name] = kubernetes_backend(jobs_settings(service), root, service.gpus, cls=cls)
    elif hasattr(cls, "from_service"):  # a site's own backend builds itself
        backends[cls.name] = cls.from_service(service, root)
    else:
        raise ConfigError(
            f"c.GpuLabService.jobs_backend_class = {_name(cls)!r}: the service "
            f"cannot build it; give the class a classmethod "
            f"from_service(service, jobs_root)"
        )
    return backends
