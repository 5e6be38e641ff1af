"""The settings of the Kubernetes job backend, and what each becomes in a job's objects.

Selecting the class turns it on (``c.GpuLabService.jobs_backend_class =
"kubernetes"``); these say where and how::

    c.KubernetesJobsSettings.namespace = "gpulab"
    c.KubernetesJobsSettings.jobs_pvc = "gpulab-jobs"   # ReadWriteMany; holds <data-dir>/jobs
    c.KubernetesJobsSettings.enforcement = "hami"
    c.KubernetesJobsSettings.queue = "gpulab-jobs"      # optional: Kueue LocalQueue
    c.KubernetesJobsSettings.priority_class_prefix = "gpulab-"  # each job's own class

A job's pods get the PriorityClass of the job's own priority class,
``gpulab-<class>`` (and, in a Kueue queue, the WorkloadPriorityClass of that name),
when ``priority_class_prefix`` is set and the cluster has those objects (the Helm
chart makes them). ``priority_class`` and ``priority``, when set, name one class
for every job instead (they win over the job's own).

The service's jobs directory must be the jobs claim, mounted at the same path in
the service's pod (the Helm chart does it). A node's pod holds its slice through
the spawner's enforcement backends (``gpulab.enforcement.kube``), the part of gpulab
that already knows how a pod holds a slice. A setting is a trait here and what it
does is a line below: adding one touches this file only.
"""

from __future__ import annotations

import logging
import math
import os

from traitlets import Bool, Dict, Enum, Float, Int, List, Unicode, Union
from traitlets.config import Configurable

from gpulab.enforcement.kube import check_backend
from gpulab.enforcement.kube.kueue import class_patch

from ..spec import JobSpec, SpecError
from .egress import METADATA_CIDRS
from .pod_security import PodSecurity
from .pod_slice import slice_claim_objects, slice_pod_patch
from .pods import COMMON_LABELS, JobOptions, job_name

log = logging.getLogger(__name__)


class KubernetesJobsSettings(Configurable):
    """Where and how jobs run on Kubernetes: the settings of
    :class:`~.backend.KubernetesBackend` (``c.KubernetesJobsSettings.*``, or
    ``c.KubernetesBackend.*``), and what each becomes in a job's objects. Its trait
    names are the keys of the older c.GpuLabService.kubernetes_jobs dict."""

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
        (hami, mig, mps, timeslice, nvml-cgroup, kai, volcano, dra).

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
        points when that is outside the jobs claim; each job's pods mount only the
        job's own folder of it (named by the job id). Empty: checkpoints go on the
        jobs claim (under each job's directory), and a checkpoint_dir elsewhere is
        refused.

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
        terminationGracePeriodSeconds, rounded up. None: c.JobQueue.preemption_grace_seconds
        (when the service has it), else Kubernetes' default (30 s).

        c.KubernetesJobsSettings.termination_grace_seconds = 120
        """,
    ).tag(config=True)

    service_account = Unicode(
        "",
        help="""ServiceAccount of every job's pods (e.g. one bound to a cloud identity that
        reads the training data); empty: the namespace's default.

        c.KubernetesJobsSettings.service_account = "gpulab-jobs"
        """,
    ).tag(config=True)

    run_as_user = Int(
        1000,
        allow_none=True,
        help="""The uid every job pod's code runs as, whatever the image says (the pods
        are runAsNonRoot, with no capabilities and no privilege escalation). It must be
        the uid the service writes the jobs claim as (the chart's service pod runs as
        1000): the ranks read the job's code there and write their logs and
        checkpoints beside it. 1000 is the Jupyter images' jovyan. None: the image's
        own user, which must then be a numeric uid other than 0.

        c.KubernetesJobsSettings.run_as_user = 1000
        """,
    ).tag(config=True)

    run_as_group = Int(
        100,
        allow_none=True,
        help="""The primary gid of every job pod's code (100: the Jupyter images' users
        group). None: the image's own.

        c.KubernetesJobsSettings.run_as_group = 100
        """,
    ).tag(config=True)

    fs_group = Int(
        1000,
        allow_none=True,
        help="""The job pods' fsGroup: the supplementary group the kubelet gives the
        volumes that support it (1000: the chart's service pod's fsGroup, so both agree
        on the jobs claim's group; fsGroupChangePolicy OnRootMismatch). None: none.

        c.KubernetesJobsSettings.fs_group = 1000
        """,
    ).tag(config=True)

    allowed_images = List(
        Unicode(),
        help="""Glob patterns (fnmatch: * also matches /) a job's image must match, e.g.
        ["ghcr.io/example/*"]; a job naming another image is refused at submit (400)
        with the patterns in the message. Empty: any image (which still runs as
        run_as_user, non-root, with no capabilities).

        c.KubernetesJobsSettings.allowed_images = ["registry.example.org/gpulab-*"]
        """,
    ).tag(config=True)

    egress_blocked_cidrs = List(
        Unicode(),
        default_value=list(METADATA_CIDRS),
        help="""IPv4 ranges a job's pods may not connect to (their NetworkPolicy's
        egress: DNS, the job's own pods and every other IPv4 address are open). The
        default keeps them from the cloud metadata server; add your private ranges
        (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16) to keep them from the cluster's
        and your network's services, as z2jh's singleuser.networkPolicy.egressAllowRules
        does for notebooks. Holds where the network plugin enforces NetworkPolicies.

        c.KubernetesJobsSettings.egress_blocked_cidrs = ["169.254.169.254/32", "10.0.0.0/8"]
        """,
    ).tag(config=True)

    # -- what the settings become -------------------------------------------------------
    # The backend (a Plugin) gives root (the jobs directory), gpus and grace_seconds.
    def check_settings(self) -> None:
        for key in ("namespace", "jobs_pvc"):
            if not getattr(self, key):
                raise SpecError(
                    f"Kubernetes jobs need {key!r}: set c.KubernetesJobsSettings.{key} "
                    f"(or that key of c.GpuLabService.kubernetes_jobs)"
                )
        check_backend(self.enforcement, self.enforcement_options or None)
        self.base_options()  # its own checks (paths, port)
        if os.geteuid() == 0 and self.run_as_user is not None:
            # A service on a box (`gpulab up` as root) writes each job's folder as root;
            # the backend hands it over to the pods' uid and gid at each start
            # (JobDir.hand_over: root:<gid> 0640 inputs), which no person may share.
            log.warning(
                "The service runs as root: each Kubernetes job's folder on the jobs claim "
                "is handed to uid %s, group %s (the pods' run_as_user and run_as_group) "
                "before its pods start. Make them an account and a group of their own on "
                "this machine: anyone in that group reads every job's code and inputs.",
                self.run_as_user,
                self.run_as_group if self.run_as_group is not None else self.run_as_user,
            )

    def base_options(self) -> JobOptions:
        """What every job's objects get (the default class's; each job's own replace them)."""
        grace = self.termination_grace_seconds
        return JobOptions(
            jobs_root=self.root,
            jobs_pvc=self.jobs_pvc,
            checkpoint_pvc=self.checkpoint_pvc,
            rdzv_port=self.rdzv_port,
            service_account=self.service_account,
            security=self.pod_security(),
            allowed_images=tuple(self.allowed_images),
            egress_blocked_cidrs=tuple(self.egress_blocked_cidrs),
            termination_grace_seconds=termination_grace(
                self.grace_seconds if grace is None else grace
            ),
            **self.class_options(None, None),
        )

    def pod_security(self) -> PodSecurity:
        """Who the job pods' code runs as (``run_as_user``, ``run_as_group``, ``fs_group``)."""
        return PodSecurity(self.run_as_user, self.run_as_group, self.fs_group)

    def class_options(self, work_class: str | None, preemptible: bool | None) -> dict:
        """A job's own class: its PriorityClass, its Kueue WorkloadPriorityClass, and on
        KAI whether it may be preempted. Fixed names in the settings win."""
        patch = class_patch(
            "job",
            work_class,
            queue=self.queue or None,
            priority=self.priority or None,
            priority_class=self.priority_class or None,
            prefix=self.priority_class_prefix,
            preemptible=preemptible,
            kai=self.enforcement == "kai",
        )
        return {
            "labels": patch["labels"],
            "pod_labels": patch["pod_labels"],
            "priority_class": patch["priority_class_name"] or "",
        }

    def settings_pod_patch(self, spec: JobSpec, allocations: list[dict]):
        """A node's pod holds its ranks' slices; on Kubernetes they are one request."""
        return slice_pod_patch(
            self.enforcement,
            check_backend(self.enforcement, self.enforcement_options or None),
            spec.gpu_milli * spec.nproc_per_node,
            allocations,
            {g.uuid: g for g in self.gpus},
            claim_name=claim_template_name(spec),
        )

    def settings_claim_objects(self, spec: JobSpec, allocations: list[dict]) -> list[dict]:
        """Under ``dra``: the job's ResourceClaimTemplate (or its card's shared claim),
        made before its pods; none for other backends."""
        return slice_claim_objects(
            self.enforcement,
            check_backend(self.enforcement, self.enforcement_options or None),
            spec.gpu_milli * spec.nproc_per_node,
            allocations,
            {g.uuid: g for g in self.gpus},
            claim_template_name(spec),
            labels={**COMMON_LABELS, "app.kubernetes.io/component": "job"},
        )


def claim_template_name(spec: JobSpec) -> str:
    """The job's ResourceClaimTemplate under ``dra``: ``<job name>-gpu``."""
    return f"{job_name(spec)}-gpu"


def termination_grace(seconds) -> int | None:
    """``terminationGracePeriodSeconds`` for a grace of ``seconds`` (whole, rounded up)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise SpecError(f"termination_grace_seconds must be seconds >= 0, got {seconds!r}")
    return math.ceil(seconds)
