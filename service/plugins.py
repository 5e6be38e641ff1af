"""The plug-ins a site picks by a short name: job backends, serving backends and
inventories, each an entry point group of Python packaging.

gpulab registers its own in ``pyproject.toml``; a site's package adds one with an
entry point and nothing else::

    [project.entry-points."gpulab.jobs_backends"]
    mycluster = "mysite.backend:MyClusterBackend"

after which ``c.InventorySettings.pools = [{"name": "lab", "jobs": "mycluster"}]`` (or
``c.GpuLabService.jobs_backend_class = "mycluster"``) runs jobs on it. Names are read
when a setting is, so an installed package is found without a change to gpulab.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points

from traitlets import Int, TraitError, Type

from gpulab.scheduler.slices import noun

log = logging.getLogger("gpulab.service.plugins")


class ConfigError(Exception):
    """A setting the service cannot start with. ``main()`` logs it on one line and
    exits 1 before anything listens, so the hub's log says what to fix."""


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
        "local": "gpulab.backend.local_inventory.LocalInventory",
        "kubernetes": "gpulab.backend.kubernetes.inventory.KubernetesInventory",
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


def build(cls: type, service, *, root: str, gpus, shortcut: tuple[str, dict] | None = None):
    """The one way the service builds a backend (:class:`gpulab.backend.plugin.Plugin`):
    its own settings from the config, the parts of the service it works with by name,
    and its :meth:`check_settings` run, so a setting it cannot run with stops the start.

    ``shortcut``: a deprecated dict setting of old (``("kubernetes_jobs", {...})``),
    whose keys are the class's setting names; they win over the config, as they did.
    """
    from gpulab.backend.plugin import Plugin

    if not issubclass(cls, Plugin):
        raise ConfigError(
            f"{cls.__module__}.{cls.__qualname__} is not a gpulab backend: derive it from "
            f"gpulab.backend.base.Backend (jobs) or gpulab.backend.serving_base.ServingBackend "
            f"(endpoints) and declare its settings as traits"
        )
    given = {}
    if shortcut and shortcut[1]:
        name, given = shortcut[0], dict(shortcut[1])
        known = sorted(cls.class_trait_names(config=True))
        unknown = sorted(map(str, set(given) - set(known)))
        if unknown:
            raise ConfigError(
                f"c.GpuLabService.{name}: unknown {noun(len(unknown), 'key')} "
                f"{', '.join(unknown)}; "
                f"known: {', '.join(known)}"
            )
        given = {k: _shortcut_value(cls.class_traits()[k], v) for k, v in given.items()}
    try:
        plugin = cls(
            parent=service,
            log=service.log,
            root=root,
            gpus=list(gpus),
            accounts=service.accounts,
            limits=service.account_limits,
            log_max_bytes=service.job_log_max_bytes,
            grace_seconds=service.job_queue.preemption_grace_seconds,
            **given,
        )
        plugin.check_settings()
    except (TraitError, ValueError) as e:
        where = f"c.GpuLabService.{shortcut[0]}: " if given else ""
        raise ConfigError(f"{where}{e}") from None
    return plugin


def _shortcut_value(trait, value):
    """A dict shortcut's value as the trait takes it: None is the default, and a
    number may come as a string (as a chart's values do)."""
    if value is None:
        return trait.default_value
    if isinstance(trait, Int) and isinstance(value, str) and value.isdigit():
        return int(value)
    return value
