"""The placement policy interface: where does one request go?

A policy sees a :class:`Cluster` (free resources as numpy arrays, so a policy can
score every node at once) and a :class:`Request`, and answers a
:class:`Placement` or ``None`` when the request fits nowhere. It never changes
the cluster: the caller commits a placement with :meth:`Cluster.apply`. The
ledger (one node, live allocations) and the trace replay benchmark (1,213
nodes) both drive policies through this one interface.

Writing a policy::

    @register_policy("my-policy")
    class MyPolicy(PlacementPolicy):
        def place(self, cluster, request):
            ...

and ``get_policy("my-policy")`` finds it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .slices import MILLI_PER_GPU

#: ``gpu_model`` value of a padded slot where a node has no GPU.
NO_GPU = -1


@dataclass(frozen=True)
class Request:
    """One task or server to place.

    ``num_gpu`` GPUs on one node, each with ``gpu_milli`` free (1..1000);
    ``num_gpu == 0`` is a CPU-only request. ``gpu_models`` restricts the GPU
    model (the trace's ``gpu_spec``, e.g. ``{"V100M16", "V100M32"}``); ``None``
    accepts any.
    """

    gpu_milli: int = 0
    num_gpu: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] | None = None

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli * self.num_gpu


@dataclass(frozen=True)
class Placement:
    """Where a request goes: a node index and the GPU slots used on it."""

    node: int
    gpus: tuple[int, ...] = ()


@dataclass
class Cluster:
    """Free resources of every node, as arrays a policy can score at once.

    ``gpu_free[n, g]`` is the free milli of GPU slot ``g`` on node ``n``; nodes
    with fewer GPUs than the widest node are padded with slots whose
    ``gpu_model`` is :data:`NO_GPU` and ``gpu_free`` is 0.
    """

    node_names: list[str]
    cpu_free: np.ndarray  # (N,) int64, milli-CPU
    mem_free: np.ndarray  # (N,) int64, MiB
    gpu_free: np.ndarray  # (N, G) int64, milli-GPU
    gpu_model: np.ndarray  # (N, G) int64, index into ``models`` or NO_GPU
    models: list[str] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        nodes: Sequence[tuple[str, int, int, Sequence[str]]],
    ) -> Cluster:
        """Make an empty cluster from ``(name, cpu_milli, memory_mib, gpu_models)``."""
        width = max((len(g) for *_, g in nodes), default=0)
        models: list[str] = sorted({m for *_, gpus in nodes for m in gpus})
        index = {m: i for i, m in enumerate(models)}
        n = len(nodes)
        gpu_model = np.full((n, max(width, 1)), NO_GPU, dtype=np.int64)
        gpu_free = np.zeros((n, max(width, 1)), dtype=np.int64)
        for i, (_, _, _, gpus) in enumerate(nodes):
            for g, model in enumerate(gpus):
                gpu_model[i, g] = index[model]
                gpu_free[i, g] = MILLI_PER_GPU
        return cls(
            node_names=[name for name, *_ in nodes],
            cpu_free=np.array([c for _, c, _, _ in nodes], dtype=np.int64),
            mem_free=np.array([m for _, _, m, _ in nodes], dtype=np.int64),
            gpu_free=gpu_free,
            gpu_model=gpu_model,
            models=models,
        )

    def copy(self) -> Cluster:
        return Cluster(
            list(self.node_names),
            self.cpu_free.copy(),
            self.mem_free.copy(),
            self.gpu_free.copy(),
            self.gpu_model.copy(),
            list(self.models),
        )

    @property
    def gpu_exists(self) -> np.ndarray:
        return self.gpu_model != NO_GPU

    def model_mask(self, request: Request) -> np.ndarray:
        """(N, G) bool: slots whose GPU model the request accepts."""
        if request.gpu_models is None:
            return self.gpu_exists
        wanted = [i for i, m in enumerate(self.models) if m in request.gpu_models]
        return np.isin(self.gpu_model, wanted)

    def eligible_gpus(self, request: Request) -> np.ndarray:
        """(N, G) bool: slots that could hold one of the request's GPU shares."""
        return self.model_mask(request) & (self.gpu_free >= request.gpu_milli)

    def feasible_nodes(self, request: Request) -> np.ndarray:
        """(N,) bool: nodes with room for the whole request."""
        ok = (self.cpu_free >= request.cpu_milli) & (self.mem_free >= request.memory_mib)
        if request.num_gpu:
            ok &= self.eligible_gpus(request).sum(axis=1) >= request.num_gpu
        return ok

    def apply(self, placement: Placement, request: Request) -> None:
        """Commit a placement: take its resources out of the free arrays."""
        n = placement.node
        if len(placement.gpus) != request.num_gpu:
            raise ValueError(
                f"placement uses {len(placement.gpus)} GPUs, request needs {request.num_gpu}"
            )
        self.cpu_free[n] -= request.cpu_milli
        self.mem_free[n] -= request.memory_mib
        for g in placement.gpus:
            if self.gpu_free[n, g] < request.gpu_milli:
                raise ValueError(f"GPU slot {g} of node {n} has no room for the request")
            self.gpu_free[n, g] -= request.gpu_milli


class PlacementPolicy(ABC):
    """Chooses a node and GPUs for a request. Subclasses implement :meth:`place`.

    ``workload`` is the typical task mix (a list of requests, e.g. the trace's
    tasks); policies that look ahead at what will arrive (FGD) use it, others
    ignore it. ``seed`` feeds policies that break ties at random.
    """

    name: str = ""

    def __init__(self, workload: Iterable[Request] | None = None, seed: int = 0):
        self.workload = list(workload) if workload is not None else []
        self.rng = np.random.default_rng(seed)

    @abstractmethod
    def place(self, cluster: Cluster, request: Request) -> Placement | None:
        """Return where ``request`` goes on ``cluster``, or ``None`` if nowhere."""


_POLICIES: dict[str, type[PlacementPolicy]] = {}


def register_policy(name: str) -> Callable[[type[PlacementPolicy]], type[PlacementPolicy]]:
    """Class decorator: make a policy available to :func:`get_policy` by ``name``."""

    def wrap(cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
        cls.name = name
        _POLICIES[name] = cls
        return cls

    return wrap


def _load_builtin() -> None:
    # The built-in policies register themselves on import.
    from . import policies  # noqa: F401


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_POLICIES)


def get_policy(name: str, **kwargs) -> PlacementPolicy:
    """Instantiate the policy registered as ``name``; unknown names say what exists."""
    _load_builtin()
    try:
        cls = _POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; registered: {', '.join(sorted(_POLICIES))}"
        ) from None
    return cls(**kwargs)
