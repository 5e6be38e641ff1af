"""The site's pools: the places where its GPUs are, each with its inventory and backend.

``c.InventorySettings.pools`` lists them in the site's order, e.g. the box itself first
and a Slurm cluster for the overflow::

    c.InventorySettings.pools = [
        {"name": "box", "inventory": "local", "jobs": "local", "serving": "local"},
        {"name": "slurm", "inventory": "slurm", "jobs": "slurm"},
    ]

Without it the site is one pool, named after its job backend (``"local"``,
``"slurm"``, ``"kubernetes"``), from ``inventory_class``, ``jobs_backend_class`` and
``serving_backend_class`` as before pools. Every GPU carries its pool's name
(:attr:`gpulab.scheduler.inventory.Gpu.pool`); the one ledger, its quotas and usage
see them all, and a placement for a job goes to one pool's GPUs only
(:meth:`gpulab.scheduler.ledger.Ledger.pool`), so a job runs where its slices are.

A job names a pool, a backend kind (the pool of that kind) or nothing: then it goes
to the site's pools, ``auto`` with several (the first with room, in the site's
order), never to the service's own machine unless a pool of the site is the box.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from gpulab.scheduler.inventory import Gpu
from gpulab.scheduler.slices import noun
from gpulab.service.plugins import INVENTORIES, JOB_BACKENDS, SERVING_BACKENDS, ConfigError

#: What a job may name instead of a pool: the first pool with room.
AUTO = "auto"
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_KEYS = {"name", "inventory", "jobs", "serving", "simulate"}
#: How a refusal of a local job names where this site's jobs run, and the service's place.
_SITE_JOBS = {
    "kubernetes": ("as Kubernetes pods", "the service pod"),
    "slurm": ("on its Slurm cluster", "the service's machine"),
}


class PoolRefused(ValueError):
    """A job or endpoint named a pool or backend this site has not got; the message
    lists what it has."""


@dataclass
class Pool:
    name: str
    inventory: type
    jobs: type
    serving: type | None = None
    #: A declared inventory for this pool; None: the service's simulate_gpus where
    #: the inventory is this machine's ("local").
    simulate: str | None = None
    gpus: list[Gpu] = field(default_factory=list)
    reason: str | None = None  # why it has no GPUs

    @property
    def kind(self) -> str:
        """The job backend's short name: local, slurm, kubernetes (or the class's)."""
        return getattr(self.jobs, "name", self.jobs.__name__)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "backend": self.kind,
            "inventory": _short(self.inventory, INVENTORIES),
            "serving": self.serving is not None,
            "gpus": len(self.gpus),
        }


def _short(cls: type, names: dict[str, str]) -> str:
    path = f"{cls.__module__}.{cls.__qualname__}"
    return next((k for k, v in names.items() if v == path), path)


def read_pools(service) -> list[Pool]:
    """The pools of ``service``'s settings, checked; ConfigError says what to fix."""
    placing = service.inventory_settings
    if not placing.pools:
        return [
            Pool(
                service.jobs_backend_class.name,
                placing.inventory_type(),
                service.jobs_backend_class,
                service.serving_backend_class,
                simulate=placing.simulate_gpus,
            )
        ]
    out: list[Pool] = []
    for i, entry in enumerate(placing.pools):
        where = f"c.InventorySettings.pools[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a dict like {{'name': 'box', 'jobs': 'local'}}")
        unknown = set(entry) - _KEYS
        if unknown:
            raise ConfigError(
                f"{where} has unknown {noun(len(unknown), 'key')} {', '.join(sorted(unknown))}; "
                f"use {', '.join(sorted(_KEYS))}"
            )
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name) or name == AUTO:
            raise ConfigError(
                f"{where}['name'] = {name!r}: give 1-32 lowercase letters, digits or '-' "
                f"(not 'auto'), e.g. 'box' or 'slurm'"
            )
        if any(p.name == name for p in out):
            raise ConfigError(f"{where}: two pools are named {name!r}; give each its own name")

        jobs = _class(service, entry, where, "jobs", "local")
        pool = Pool(
            name,
            _class(service, entry, where, "inventory", _kind_of(jobs)),
            jobs,
            _class(service, entry, where, "serving", None),
            simulate=entry.get("simulate"),
        )
        if any(p.kind == pool.kind for p in out):
            raise ConfigError(
                f"{where}: a second pool of backend {pool.kind!r}; one pool per backend "
                f"kind (its settings are c.SlurmSite / c.KubernetesJobsSettings)"
            )
        out.append(pool)
    if not any(p.serving for p in out):  # endpoints run somewhere: the first pool
        out[0].serving = service.serving_backend_class
    return out


#: A pool's key -> the trait that reads its value (the service's, or InventorySettings'
#: for the inventory), and the short names.
_TRAITS = {
    "jobs": ("jobs_backend_class", JOB_BACKENDS),
    "inventory": ("inventory_class", INVENTORIES),
    "serving": ("serving_backend_class", SERVING_BACKENDS),
}


def _class(service, entry: dict, where: str, key: str, default: str | None) -> type | None:
    """A pool's class setting, read as the service's trait of it reads one."""
    value = entry.get(key, default)
    if value is None:
        return None
    trait, names = _TRAITS[key]
    owner = service if service.has_trait(trait) else service.inventory_settings
    try:
        return owner.traits()[trait].validate(owner, value)
    except Exception:
        raise ConfigError(
            f"{where}[{key!r}] = {value!r}: use one of "
            f"{', '.join(map(repr, names))} or an import path"
        ) from None


def _kind_of(jobs: type) -> str:
    name = getattr(jobs, "name", "local")
    return name if name in INVENTORIES else "local"


def load_gpus(service, pools: list[Pool]) -> tuple[list[Gpu], str | None]:
    """Each pool's inventory, loaded and tagged with the pool's name; the site's GPUs
    and why there are none (if so). A node in two pools stops the start."""
    from gpulab.backend.local_inventory import LocalInventory

    site: list[Gpu] = []
    owner: dict[str, str] = {}
    for pool in pools:
        simulate = pool.simulate
        placing = service.inventory_settings
        if simulate is None:
            single = len(pools) == 1  # as before pools: simulate_gpus wins everywhere
            simulate = (
                placing.simulate_gpus
                if single or issubclass(pool.inventory, LocalInventory)
                else ""
            )
        kwargs = {"node": placing.node_name, "simulate": simulate or ""}
        gpus, pool.reason = pool.inventory(parent=service, **kwargs).load()
        pool.gpus = [dataclasses.replace(g, pool=pool.name) for g in gpus]
        for gpu in pool.gpus:
            other = owner.setdefault(gpu.node, pool.name)
            if other != pool.name:
                raise ConfigError(
                    f"node {gpu.node!r} is in pools {other!r} and {pool.name!r}: a node "
                    f"belongs to one pool (set c.InventorySettings.node_name for the box)"
                )
        site += pool.gpus
    if site:
        return site, None
    reasons = [f"{p.name}: {p.reason}" if len(pools) > 1 else p.reason for p in pools]
    return site, "; ".join(r for r in reasons if r) or "no pool has GPUs"


class Pools:
    """The site's pools in order, and which a job or endpoint goes to."""

    def __init__(self, pools: list[Pool]):
        self.list = pools
        self.by_name = {p.name: p for p in pools}

    @property
    def default(self) -> str:
        """What a job that names no pool asks for."""
        return AUTO if len(self.list) > 1 else self.list[0].name

    def of_kind(self, kind: str) -> Pool | None:
        return next((p for p in self.list if p.kind == kind), None)

    def for_job(self, pool: str, backend: str) -> list[Pool]:
        """The pools a job may run in, in the order to try them."""
        pool = pool or ""
        if pool and pool != AUTO:
            chosen = self.by_name.get(pool)
            if chosen is None:
                raise PoolRefused(
                    f"no pool {pool!r} here; this site's pools: {self.names()} "
                    f"(or leave it out: {self.default})"
                )
            if backend and chosen.kind != backend:
                raise PoolRefused(
                    f"pool {pool!r} runs jobs on {chosen.kind}, not {backend}; "
                    f"give --pool or --backend, not both"
                )
            return [chosen]
        if backend:
            chosen = self.of_kind(backend)
            if chosen is None:
                raise PoolRefused(self._no_kind(backend))
            return [chosen]
        return list(self.list)

    def _no_kind(self, backend: str) -> str:
        if backend == "local":
            kinds = {p.kind for p in self.list}
            where, here = (
                _SITE_JOBS[kinds.pop()]
                if len(kinds) == 1 and kinds <= set(_SITE_JOBS)
                else (f"on {self.names()}", "the service's machine")
            )
            return (
                f"this site runs jobs {where}; {here} runs no user code (leave --backend "
                f"out, or an admin adds the box as a pool: c.InventorySettings.pools)"
            )
        return f"no pool runs the {backend} backend here; this site's pools: {self.names()}"

    def serving(self) -> Pool | None:
        """Where endpoints run: the first pool with a serving backend."""
        return next((p for p in self.list if p.serving is not None), None)

    def names(self) -> str:
        return ", ".join(f"{p.name} ({p.kind})" if p.name != p.kind else p.name for p in self.list)
