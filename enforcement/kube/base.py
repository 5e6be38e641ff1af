"""What a GPU slice turns into on a Kubernetes pod, one backend per mechanism.

A slice is held on Kubernetes by whatever the cluster runs for GPU sharing:
HAMi, MIG, MPS or time-slicing through NVIDIA's device plugin, a
driver-level memory limiter reading annotations, or a GPU-aware scheduler
(KAI, Volcano). Each backend is a module in this package with one pure
function, ``patch(slice, options) -> SlicePatch``, that says what the pod
needs: resource limits, annotations, labels, environment, scheduler name,
node selector and tolerations. Nothing here talks to a cluster, so the pod
builders (the notebook spawner, training jobs, serving deployments) share it:

    patch = pod_slice_patch("hami", GpuSlice.of(250, memory_mib=81920), "H100-80GB")
    pod_spec = apply_to_pod_spec(pod_spec, patch)

Hooks a backend module provides:

- ``NAME``: the name operators choose it by (``c.FractionalKubeSpawner.enforcement``);
- ``DEFAULTS``: its options and their defaults (checked: unknown keys are an error);
- ``patch(slice, options) -> SlicePatch``: for a slice of at least one GPU
  (``milli > 0``); the no-GPU pod is the same for every backend
  (:func:`no_gpu_patch`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpulab.scheduler.slices import MILLI_PER_GPU, noun, shape_of

#: GPU nodes are commonly tainted so that only pods asking for GPUs land there.
GPU_TOLERATION = MappingProxyType(
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
)


#: Extended resources that hand out GPUs; on a pod they come from the slice only.
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "volcano.sh/", "amd.com/gpu")
#: Annotations that grant or pick GPUs (KAI's fractions, HAMi's card choice, ours).
GPU_ANNOTATIONS = frozenset(
    {"gpu-fraction", "gpu-memory", "nvidia.com/use-gpuuuid", "nvidia.com/use-gputype"}
)
GPU_ANNOTATION_PREFIXES = ("gpulab.io/",)


def without_gpu_resources(resources: Mapping | None) -> dict:
    """``resources`` (limits or requests) without anything that hands out GPUs."""
    return {k: v for k, v in (resources or {}).items() if not k.startswith(GPU_RESOURCE_PREFIXES)}


def without_gpu_annotations(annotations: Mapping | None) -> dict:
    return {
        k: v
        for k, v in (annotations or {}).items()
        if k not in GPU_ANNOTATIONS and not k.startswith(GPU_ANNOTATION_PREFIXES)
    }


class EnforcementError(ValueError):
    """A slice a backend cannot render, or a backend/option that does not exist."""


@dataclass(frozen=True)
class GpuSlice:
    """A slice as the ledger placed it: ``milli`` in all, on ``num_gpus`` GPUs."""

    milli: int
    memory_mib: int = 0  # device memory of the slice on each GPU
    card_memory_mib: int = 0  # memory of one whole card (MIG snapping needs it)
    gpu_model: str = ""
    node: str | None = None  # the node the ledger chose; None lets the scheduler pick
    gpu_uuids: tuple[str, ...] = ()
    simulated: bool = False

    @classmethod
    def of(cls, milli: int, memory_mib: int = 0, gpu_model: str = "", **kw) -> GpuSlice:
        """A slice of ``milli`` on cards of ``memory_mib`` each (the slice's share is derived)."""
        shape = shape_of(milli)
        share = memory_mib * shape.milli_per_gpu // MILLI_PER_GPU if memory_mib else 0
        return cls(milli, share, memory_mib, gpu_model, **kw)

    @property
    def num_gpus(self) -> int:
        return shape_of(self.milli).num_gpus

    @property
    def milli_per_gpu(self) -> int:
        return shape_of(self.milli).milli_per_gpu

    @property
    def fractional(self) -> bool:
        return 0 < self.milli < MILLI_PER_GPU

    @property
    def core_percent(self) -> int:
        """Share of each GPU's compute as a percentage, at least 1."""
        return max(1, math.ceil(self.milli_per_gpu / 10))


@dataclass(frozen=True)
class DeviceClaim:
    """A slice held through Dynamic Resource Allocation: what the pod's claim asks for.

    ``spec`` is a ``resource.k8s.io/v1`` ResourceClaimSpec. A claim of the pod's own
    (``shared_name`` empty) is named by whoever builds the pod: a ResourceClaim per
    server, a ResourceClaimTemplate per job or deployment version. A shared claim is
    one card's (MPS, time-slicing), named after it and referenced by every pod that
    holds a fraction of that card: DRA gives a device to one claim only.
    """

    spec: Mapping
    shared_name: str = ""


@dataclass(frozen=True)
class SlicePatch:
    """Everything a slice adds to a pod; :func:`apply_to_pod_spec` merges it."""

    limits: Mapping[str, int | str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, str], ...] = ()
    claim: DeviceClaim | None = None  # DRA: the devices come from a ResourceClaim

    def to_dict(self) -> dict:
        """The patch as plain data: ``{resources, annotations, labels, env, ...}``."""
        return {
            "resources": {"limits": dict(self.limits)} if self.limits else {},
            "annotations": dict(self.annotations),
            "labels": dict(self.labels),
            "env": dict(self.env),
            "scheduler_name": self.scheduler_name,
            "node_selector": dict(self.node_selector),
            "tolerations": [dict(t) for t in self.tolerations],
            **(
                {"claim": {"spec": self.claim.spec, "shared_name": self.claim.shared_name}}
                if self.claim
                else {}
            ),
        }


def slice_env(s: GpuSlice, **extra: str) -> dict[str, str]:
    """Variables that state the slice inside the container (the contract's names).

    Inside a pod the device plugin exposes only the slice's devices, so CUDA
    numbers them from 0; the ledger's UUIDs are named in ``GPULAB_GPU_UUID``.
    """
    env = {
        "GPULAB_GPU_MILLI": str(s.milli),
        "GPULAB_GPU_UUID": ",".join(s.gpu_uuids),
        "GPULAB_GPU_MEMORY_MIB": str(s.memory_mib * s.num_gpus),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(s.num_gpus)),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    env.update(extra)
    return env


def no_gpu_patch() -> SlicePatch:
    # Images built on nvidia/cuda set NVIDIA_VISIBLE_DEVICES=all, which makes the
    # NVIDIA runtime hand every GPU of the node to a pod that asked for none.
    return SlicePatch(
        env={
            "GPULAB_GPU_MILLI": "0",
            "GPULAB_GPU_UUID": "",
            "CUDA_VISIBLE_DEVICES": "",
            "NVIDIA_VISIBLE_DEVICES": "void",
        }
    )


def simulated_patch(s: GpuSlice) -> SlicePatch:
    """A slice of a declared GPU: stated in the environment, enforced nowhere."""
    return SlicePatch(
        env={
            **slice_env(s),
            "CUDA_VISIBLE_DEVICES": "",
            "NVIDIA_VISIBLE_DEVICES": "void",
            "GPULAB_GPU_SIMULATED": "1",
        }
    )


def placement(s: GpuSlice) -> dict:
    """Node selector and tolerations every GPU backend shares."""
    return {
        "node_selector": {"kubernetes.io/hostname": s.node} if s.node else {},
        "tolerations": (GPU_TOLERATION,),
    }


def check_options(
    name: str, defaults: Mapping[str, object], options: Mapping[str, object] | None
) -> dict:
    """``defaults`` updated by ``options``; an unknown key names the known ones."""
    options = dict(options or {})
    unknown = set(options) - set(defaults)
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise EnforcementError(
            f"unknown {noun(len(unknown), 'option')} {', '.join(sorted(unknown))} for the "
            f"{name!r} enforcement "
            f"backend; its options are: {known}"
        )
    return {**defaults, **options}


def with_env(patch: SlicePatch, **env: str) -> SlicePatch:
    return replace(patch, env={**patch.env, **env})


def whole_gpus(s: GpuSlice, resource: str = "nvidia.com/gpu", **fields) -> SlicePatch:
    """Whole cards: a plain request of ``resource``, nothing shared to enforce."""
    return SlicePatch(limits={resource: s.num_gpus}, env=slice_env(s), **placement(s), **fields)


def capped_env(s: GpuSlice) -> dict:
    """The slice's environment with PyTorch's allocator held to its share of the card
    (where the platform shares the card but does not cap its memory)."""
    fraction = f"per_process_memory_fraction:{s.milli_per_gpu / 1000:.3f}"
    return slice_env(s, PYTORCH_CUDA_ALLOC_CONF=fraction)
