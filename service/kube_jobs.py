"""The Kubernetes job backend, as the service configures it.

Selecting the class turns it on (jobs submitted with ``backend="kubernetes"``,
``%%train_distributed --backend kubernetes``); :class:`KubernetesJobsSettings`
holds where and how::

    c.GpuLabService.jobs_backend_class = "kubernetes"
    c.KubernetesJobsSettings.namespace = "gpulab"
    c.KubernetesJobsSettings.jobs_pvc = "gpulab-jobs"   # ReadWriteMany; holds <data-dir>/jobs
    c.KubernetesJobsSettings.enforcement = "hami"
    c.KubernetesJobsSettings.queue = "gpulab-jobs"      # optional: Kueue LocalQueue

The older ``c.GpuLabService.kubernetes_jobs = {"namespace": ..., ...}`` (one
dict, these names as keys) still works and does the same, with a warning.

The service's jobs directory must be that claim, mounted at the same path in
the service's pod (the Helm chart does it). Here the slice of a node's pod
comes from the spawner's enforcement backends (pure functions), the part of
gpulab that already knows how a pod holds a slice.
"""

from __future__ import annotations

from traitlets import Bool, Dict, Enum, Int, Unicode, Union
from traitlets.config import Configurable

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.kubernetes.pods import JobOptions
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, check_backend, pod_slice_patch
from gpulab.enforcement.kube.kueue import queue_patch

KEYS = {
    "namespace",
    "jobs_pvc",
    "checkpoint_pvc",
    "enforcement",
    "enforcement_options",
    "queue",
    "priority",
    "priority_class",
    "use_jobset",
    "kubeconfig",
    "rdzv_port",
}


class KubernetesJobsSettings(Configurable):
    """Where and how jobs run on Kubernetes (with c.GpuLabService.jobs_backend_class =
    "kubernetes"). Its trait names are the keys of the older kubernetes_jobs dict."""

    namespace = Unicode(
        help="""Namespace the jobs' Indexed Jobs (or JobSets) are created in. Required.

        c.KubernetesJobsSettings.namespace = "gpulab"
        """,
    ).tag(config=True)

    jobs_pvc = Unicode(
        help="""ReadWriteMany claim holding <data-dir>/jobs, mounted at that path in the
        service's pod and in every job pod. Required.

        c.KubernetesJobsSettings.jobs_pvc = "gpulab-jobs"
        """,
    ).tag(config=True)

    enforcement = Unicode(
        "hami",
        help="""How a pod holds its slice: an enforcement backend of gpulab.enforcement.kube
        (hami, mig, mps, timeslice, nvml-cgroup, kai, volcano).

        c.KubernetesJobsSettings.enforcement = "mig"
        """,
    ).tag(config=True)

    enforcement_options = Dict(
        help="""Options of the enforcement backend (as the spawner takes them).

        c.KubernetesJobsSettings.enforcement_options = {"queue": "research"}
        """,
    ).tag(config=True)

    queue = Unicode(
        "",
        help="""Kueue LocalQueue the jobs are submitted to; empty: no Kueue.

        c.KubernetesJobsSettings.queue = "gpulab-jobs"
        """,
    ).tag(config=True)

    priority = Unicode(
        "",
        help="""Kueue WorkloadPriorityClass of the jobs; empty: Kueue's default.

        c.KubernetesJobsSettings.priority = "gpulab-low"
        """,
    ).tag(config=True)

    priority_class = Unicode(
        "",
        help="""Kubernetes PriorityClass of the job pods; empty: the cluster's default.

        c.KubernetesJobsSettings.priority_class = "batch-low"
        """,
    ).tag(config=True)

    checkpoint_pvc = Unicode(
        "",
        help="""A claim of its own for checkpoints, mounted where a job's --checkpoint-dir
        points when that is outside the jobs claim. Empty: checkpoints go on the jobs
        claim (under each job's directory), and a checkpoint_dir elsewhere is refused.

        c.KubernetesJobsSettings.checkpoint_pvc = "gpulab-checkpoints"
        """,
    ).tag(config=True)

    use_jobset = Union(
        [Bool(), Enum(["auto"])],
        default_value="auto",
        help="""Run multi-node jobs as JobSets: True, False, or "auto" (when the CRD is
        installed).

        c.KubernetesJobsSettings.use_jobset = False
        """,
    ).tag(config=True)

    kubeconfig = Unicode(
        "",
        help="""Kubeconfig file to reach the cluster with. Default: in-cluster credentials.

        c.KubernetesJobsSettings.kubeconfig = "/etc/gpulab/kubeconfig"
        """,
    ).tag(config=True)

    rdzv_port = Int(
        29400,
        help="""Port of the torchrun rendezvous on a job's first pod.

        c.KubernetesJobsSettings.rdzv_port = 29500
        """,
    ).tag(config=True)

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in sorted(KEYS)}


def jobs_settings(service) -> dict:
    """c.KubernetesJobsSettings, with the deprecated c.GpuLabService.kubernetes_jobs
    dict's keys (checked) on top."""
    settings = KubernetesJobsSettings(parent=service).to_dict()
    legacy = dict(service.kubernetes_jobs)
    if legacy:
        check_settings("c.GpuLabService.kubernetes_jobs", legacy, KEYS, ())
        settings.update(legacy)
    return settings


def slice_pod_patch(
    enforcement: str, options: dict, milli: int, allocations: list[dict], by_uuid: dict
):
    """A function putting a slice of ``milli`` (on the card the ledger chose) into a pod
    template through the enforcement backend; None for no GPU."""
    if not milli:
        return None
    first = by_uuid.get(allocations[0]["gpu_uuid"]) if allocations else None
    piece = GpuSlice.of(milli, first.memory_mib if first else 0, first.model if first else "")
    patch = pod_slice_patch(enforcement, piece, options=options)
    return lambda template: apply_to_pod(template, patch)


def check_settings(
    what: str, settings: dict, known: set[str], required: tuple[str, ...]
) -> tuple[str, dict]:
    """Refuse unknown or missing keys of ``c.GpuLabService.<what>``; return the
    enforcement backend's name and its checked options."""
    unknown = set(settings) - known
    if unknown:
        raise SpecError(
            f"{what}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    for key in required:
        if not settings.get(key):
            raise SpecError(f"{what} needs {key!r}")
    enforcement = settings.get("enforcement", "hami")
    return enforcement, check_backend(enforcement, settings.get("enforcement_options"))


def kubernetes_backend(
    settings: dict, jobs_root: str, gpus, cls: type[KubernetesBackend] = KubernetesBackend
) -> KubernetesBackend:
    """The backend for ``settings`` (:func:`jobs_settings`); clear errors."""
    enforcement, enforcement_options = check_settings(
        "c.KubernetesJobsSettings", settings, KEYS, ("namespace", "jobs_pvc")
    )
    by_uuid = {g.uuid: g for g in gpus}

    def pod_patch_for(spec: JobSpec, allocations: list[dict]):
        # A node's pod holds its ranks' slices; on Kubernetes they are one request.
        return slice_pod_patch(
            enforcement,
            enforcement_options,
            spec.gpu_milli * spec.nproc_per_node,
            allocations,
            by_uuid,
        )

    labels = queue_patch("job", settings.get("queue"), settings.get("priority"))["labels"]
    options = JobOptions(
        jobs_root=jobs_root,
        jobs_pvc=settings["jobs_pvc"],
        checkpoint_pvc=settings.get("checkpoint_pvc", ""),
        labels=labels,
        priority_class=settings.get("priority_class", ""),
        rdzv_port=int(settings.get("rdzv_port", 29400)),
    )
    return cls(
        jobs_root,
        namespace=settings["namespace"],
        options=options,
        kubeconfig=settings.get("kubeconfig") or None,
        use_jobset=settings.get("use_jobset", "auto"),
        pod_patch_for=pod_patch_for,
    )
