"""The Kubernetes job backend, as the service configures it.

Selecting the class turns it on (jobs submitted with ``backend="kubernetes"``,
``%%train_distributed --backend kubernetes``); :class:`KubernetesJobsSettings`
holds where and how::

    c.GpuLabService.jobs_backend_class = "kubernetes"
    c.KubernetesJobsSettings.namespace = "gpulab"
    c.KubernetesJobsSettings.jobs_pvc = "gpulab-jobs"   # ReadWriteMany; holds <data-dir>/jobs
    c.KubernetesJobsSettings.enforcement = "hami"
    c.KubernetesJobsSettings.queue = "gpulab-jobs"      # optional: Kueue LocalQueue
    c.KubernetesJobsSettings.priority_class_prefix = "gpulab-"  # each job's own class

A job's pods get the PriorityClass of the job's own priority class,
``gpulab-<class>`` (and, in a Kueue queue, the WorkloadPriorityClass of that name),
when ``priority_class_prefix`` is set and the cluster has those objects (the Helm
chart makes them). ``priority_class`` and ``priority``, when set, name one class
for every job instead, as before (they win over the job's own).

The older ``c.GpuLabService.kubernetes_jobs = {"namespace": ..., ...}`` (one
dict, these names as keys) still works and does the same, with a warning.

The service's jobs directory must be that claim, mounted at the same path in
the service's pod (the Helm chart does it). Here the slice of a node's pod
comes from the spawner's enforcement backends (pure functions), the part of
gpulab that already knows how a pod holds a slice.
"""

from __future__ import annotations

import math

from traitlets import Bool, Dict, Enum, Float, Int, Unicode, Union
from traitlets.config import Configurable

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.kubernetes.pods import JobOptions
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, check_backend, pod_slice_patch
from gpulab.enforcement.kube.kueue import class_patch

KEYS = {
    "namespace",
    "jobs_pvc",
    "checkpoint_pvc",
    "enforcement",
    "enforcement_options",
    "queue",
    "priority",
    "priority_class",
    "priority_class_prefix",
    "use_jobset",
    "kubeconfig",
    "rdzv_port",
    "termination_grace_seconds",
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
        help="""Kueue WorkloadPriorityClass of every job, over each job's own
        (<priority_class_prefix><class>); empty: each job's own, or Kueue's default
        when priority_class_prefix is empty too.

        c.KubernetesJobsSettings.priority = "gpulab-low"
        """,
    ).tag(config=True)

    priority_class = Unicode(
        "",
        help="""Kubernetes PriorityClass of every job's pods, over each job's own
        (<priority_class_prefix><class>); empty: each job's own, or the cluster's
        default when priority_class_prefix is empty too.

        c.KubernetesJobsSettings.priority_class = "batch-low"
        """,
    ).tag(config=True)

    priority_class_prefix = Unicode(
        "",
        help="""Map each job's priority class (batch, batch-high...) to the cluster's
        PriorityClass <prefix><class> and, in a Kueue queue, the WorkloadPriorityClass
        of the same name. Those must exist (the Helm chart creates gpulab-<class> and
        sets "gpulab-"). Empty: no per-class names.

        c.KubernetesJobsSettings.priority_class_prefix = "gpulab-"
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

    termination_grace_seconds = Float(
        None,
        allow_none=True,
        help="""Seconds a job's pods get from SIGTERM to SIGKILL when they are stopped or
        preempted (by gpulab, Kueue or the kube-scheduler): their
        terminationGracePeriodSeconds, rounded up. None: c.GpuLabService.preemption_grace_seconds
        (when the service has it), else Kubernetes' default (30 s).

        c.KubernetesJobsSettings.termination_grace_seconds = 120
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
    if settings.get("termination_grace_seconds") is None:
        # The grace gpulab gives a preempted job, as the pods' own.
        settings["termination_grace_seconds"] = getattr(service, "preemption_grace_seconds", None)
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


def termination_grace(seconds) -> int | None:
    """``terminationGracePeriodSeconds`` for a grace of ``seconds`` (whole, rounded up)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise SpecError(f"termination_grace_seconds must be seconds >= 0, got {seconds!r}")
    return math.ceil(seconds)


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

    def class_options(work_class: str | None, preemptible: bool | None) -> dict:
        # A job's own class: its PriorityClass, its Kueue WorkloadPriorityClass, and
        # on KAI whether it may be preempted. Fixed names in the settings win.
        patch = class_patch(
            "job",
            work_class,
            queue=settings.get("queue") or None,
            priority=settings.get("priority") or None,
            priority_class=settings.get("priority_class") or None,
            prefix=settings.get("priority_class_prefix") or "",
            preemptible=preemptible,
            kai=enforcement == "kai",
        )
        return {
            "labels": patch["labels"],
            "pod_labels": patch["pod_labels"],
            "priority_class": patch["priority_class_name"] or "",
        }

    def options_for(spec: JobSpec) -> dict:
        return class_options(spec.priority_class, spec.preemptible)

    options = JobOptions(
        jobs_root=jobs_root,
        jobs_pvc=settings["jobs_pvc"],
        checkpoint_pvc=settings.get("checkpoint_pvc", ""),
        rdzv_port=int(settings.get("rdzv_port", 29400)),
        termination_grace_seconds=termination_grace(settings.get("termination_grace_seconds")),
        **class_options(None, None),  # the default class's; each job's replace them
    )
    return cls(
        jobs_root,
        namespace=settings["namespace"],
        options=options,
        kubeconfig=settings.get("kubeconfig") or None,
        use_jobset=settings.get("use_jobset", "auto"),
        pod_patch_for=pod_patch_for,
        options_for=options_for,
    )
