"""The parts of ``GpuLabService`` that building a backend reads, for tests that build
one the service's way (:func:`gpulab.service.plugins.build`) without starting one."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from traitlets import Dict, Float, Int
from traitlets.config import Config, Configurable

from gpulab.service.plugins import build


class Host(Configurable):
    """Stands in for the service as a backend's parent (its config and collaborators)."""

    preemption_grace_seconds = Float(None, allow_none=True).tag(config=True)
    job_log_max_bytes = Int(0).tag(config=True)
    kubernetes_jobs = Dict().tag(config=True)
    kubernetes_deployments = Dict().tag(config=True)
    accounts = None
    account_limits = None
    log = logging.getLogger("tests.plugin_host")

    @property
    def job_queue(self):
        """The service's c.JobQueue as a backend reads it: the preemption grace (None
        here unless c.Host sets it: the backend's own default)."""
        return SimpleNamespace(preemption_grace_seconds=self.preemption_grace_seconds)


def built(cls, root: str, gpus=(), *, shortcut: tuple[str, dict] | None = None, config=None):
    """``cls`` as the service builds it, with ``config`` (a traitlets Config) and the
    deprecated dict ``shortcut`` on top."""
    host = Host(config=config or Config())
    return build(cls, host, root=root, gpus=gpus, shortcut=shortcut)


def kubernetes_backend(settings: dict, root: str, gpus=(), config=None):
    """The Kubernetes job backend of ``c.GpuLabService.kubernetes_jobs = settings``."""
    from gpulab.backend.kubernetes.backend import KubernetesBackend

    return built(
        KubernetesBackend, root, gpus, shortcut=("kubernetes_jobs", settings), config=config
    )


def kubernetes_serving(settings: dict, root: str, gpus=(), config=None):
    """The Kubernetes serving backend of ``c.GpuLabService.kubernetes_deployments = settings``."""
    from gpulab.backend.kubernetes.serving import KubernetesServing

    shortcut = ("kubernetes_deployments", settings)
    return built(KubernetesServing, root, gpus, shortcut=shortcut, config=config)
