"""The Kubernetes job backend, as the service configures it.

``c.GpuLabService.kubernetes_jobs`` turns it on (jobs submitted with
``backend="kubernetes"``, ``%%train_distributed --backend kubernetes``)::

    c.GpuLabService.kubernetes_jobs = {
        "namespace": "gpulab",
        "jobs_pvc": "gpulab-jobs",          # ReadWriteMany; holds <data-dir>/jobs
        "enforcement": "hami",              # how a pod holds its slice (spawner's backends)
        "queue": "gpulab-jobs",             # optional: Kueue LocalQueue
        "priority_class": "",               # optional
        "use_jobset": "auto",               # JobSet when the CRD is installed
        "kubeconfig": "",                   # default: in-cluster
    }

The service's jobs directory must be that claim, mounted at the same path in
the service's pod (the Helm chart does it). Here the slice of a node's pod
comes from the spawner's enforcement backends (pure functions), the part of
gpulab that already knows how a pod holds a slice.
"""

from __future__ import annotations

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.kubernetes.pods import JobOptions
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, check_backend, pod_slice_patch
from gpulab.enforcement.kube.kueue import queue_patch

KEYS = {"namespace", "jobs_pvc", "enforcement", "enforcement_options", "queue", "priority",
        "priority_class", "use_jobset", "kubeconfig", "rdzv_port"}


def slice_pod_patch(enforcement: str, options: dict, milli: int, allocations: list[dict],
                    by_uuid: dict):
    """A function putting a slice of ``milli`` (on the card the ledger chose) into a pod
    template through the enforcement backend; None for no GPU."""
    if not milli:
        return None
    first = by_uuid.get(allocations[0]["gpu_uuid"]) if allocations else None
    piece = GpuSlice.of(milli, first.memory_mib if first else 0, first.model if first else "")
    patch = pod_slice_patch(enforcement, piece, options=options)
    return lambda template: apply_to_pod(template, patch)


def check_settings(what: str, settings: dict, known: set[str],
                   required: tuple[str, ...]) -> tuple[str, dict]:
    """Refuse unknown or missing keys of ``c.GpuLabService.<what>``; return the
    enforcement backend's name and its checked options."""
    unknown = set(settings) - known
    if unknown:
        raise SpecError(f"{what}: unknown key(s) {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(sorted(known))}")
    for key in required:
        if not settings.get(key):
            raise SpecError(f"{what} needs {key!r}")
    enforcement = settings.get("enforcement", "hami")
    return enforcement, check_backend(enforcement, settings.get("enforcement_options"))


def kubernetes_backend(settings: dict, jobs_root: str, gpus) -> KubernetesBackend:
    """The backend for ``settings`` (``c.GpuLabService.kubernetes_jobs``); clear errors."""
    enforcement, enforcement_options = check_settings("kubernetes_jobs", settings, KEYS,
                                                      ("namespace", "jobs_pvc"))
    by_uuid = {g.uuid: g for g in gpus}

    def pod_patch_for(spec: JobSpec, allocations: list[dict]):
        # A node's pod holds its ranks' slices; on Kubernetes they are one request.
        return slice_pod_patch(enforcement, enforcement_options,
                               spec.gpu_milli * spec.nproc_per_node, allocations, by_uuid)

    labels = queue_patch("job", settings.get("queue"), settings.get("priority"))["labels"]
    options = JobOptions(jobs_root=jobs_root, jobs_pvc=settings["jobs_pvc"], labels=labels,
                         priority_class=settings.get("priority_class", ""),
                         rdzv_port=int(settings.get("rdzv_port", 29400)))
    return KubernetesBackend(jobs_root, namespace=settings["namespace"], options=options,
                             kubeconfig=settings.get("kubeconfig") or None,
                             use_jobset=settings.get("use_jobset", "auto"),
                             pod_patch_for=pod_patch_for)
