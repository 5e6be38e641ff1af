"""Which classes do the service's work, chosen by configuration.

``c.GpuLabService.jobs_backend_class``, ``serving_backend_class`` and
``inventory_class`` are :class:`NamedType` traits: a class, its import path, or a
short name (``"local"``, ``"kubernetes"``, ``"slurm"``). This module builds the job backends
from them; the serving backend is the deployment manager's to build.
"""

from __future__ import annotations

from traitlets import Type

from gpulab.backend.base import Backend
from gpulab.backend.local import LocalBackend


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


def job_backends(service, root: str) -> dict[str, Backend]:
    """The backends jobs can name (JobSpec.backend): always "local" (the default of
    every job), and the configured class under its own name when it is another."""
    local = dict(
        real_gpus=any(not g.simulated for g in service.gpus),
        accounts=service.accounts,
        limits=service.account_limits,
        gpu_count=len(service.gpus),
    )
    cls = service.jobs_backend_class
    if issubclass(cls, LocalBackend):
        return {"local": cls(root, **local)}
    backends: dict[str, Backend] = {"local": LocalBackend(root, **local)}
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
