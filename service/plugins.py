"""The plug-ins a site picks by a short name: job backends, serving backends and
inventories, each an entry point group of Python packaging.

gpulab registers its own in ``pyproject.toml``; a site's package adds one with an
entry point and nothing else::

    [project.entry-points."gpulab.jobs_backends"]
    mycluster = "mysite.backend:MyClusterBackend"

after which ``c.GpuLabService.pools = [{"name": "lab", "jobs": "mycluster"}]`` (or
``c.GpuLabService.jobs_backend_class = "mycluster"``) runs jobs on it. Names are read
when a setting is, so an installed package is found without a change to gpulab.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points

from traitlets import Type


class Plugins(Mapping):
    """Short name -> import path of one entry point group, over gpulab's own (a
    checkout run without its package metadata installed still finds those)."""

    def __init__(self, group: str, built_in: dict[str, str]):
        self.group = group
        self.built_in = built_in

    def _all(self) -> dict[str, str]:
        found = {ep.name: ep.value.replace(":", ".") for ep in entry_points(group=self.group)}
        return {**self.built_in, **found}

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


JOB_BACKENDS = Plugins(
    "gpulab.jobs_backends",
    {
        "local": "gpulab.backend.local.LocalBackend",
        "kubernetes": "gpulab.backend.kubernetes.backend.KubernetesBackend",
        "slurm": "gpulab.backend.slurm.SlurmBackend",
    },
)
SERVING_BACKENDS = Plugins(
    "gpulab.serving_backends",
    {
        "local": "gpulab.backend.local_serving.LocalServing",
        "kubernetes": "gpulab.backend.kubernetes.serving.KubernetesServing",
    },
)
INVENTORIES = Plugins(
    "gpulab.inventories",
    {
        "local": "gpulab.scheduler.inventory.LocalInventory",
        "kubernetes": "gpulab.scheduler.inventory_kube.KubernetesInventory",
        "slurm": "gpulab.backend.slurm_inventory.SlurmInventory",
    },
)


class NamedType(Type):
    """A ``Type`` trait that also takes a plug-in's short name."""

    def __init__(self, names: Plugins, default: str = "local", **kwargs):
        self.names = names
        super().__init__(names.built_in[default], **kwargs)

    def validate(self, obj, value):
        if isinstance(value, str):
            value = self.names.get(value, value)
        return super().validate(obj, value)
