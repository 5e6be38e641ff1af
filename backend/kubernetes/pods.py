"""What every pod of a training job shares: names, labels, the job volume, the node container.

One pod is one node of the job: one torchrun agent starting ``nproc_per_node``
ranks. The pod template is the same for every node, so nothing in it may name
a node; the pod learns its node from its completion index, which the Job
controller writes to the annotation ``batch.kubernetes.io/job-completion-index``
(and to ``JOB_COMPLETION_INDEX``):

- ``PET_NODE_RANK`` comes from that annotation through the downward API;
- ``--log-dir=.../node$(PET_NODE_RANK)`` and ``--local-addr=$(GPULAB_POD_IP)``
  use the kubelet's ``$(VAR)`` expansion of container args (``GPULAB_POD_IP``
  is ``status.podIP``; literal ``$`` elsewhere is written ``$$``);
- ``is_host`` (which agent hosts the c10d store) is a condition, which the
  kubelet cannot compute: a two-line POSIX sh wrapper (:data:`NODE_WRAPPER`) sets
  ``is_host=1`` on index 0 and ``is_host=0`` on every other index, then execs torchrun.

The rendezvous endpoint is index 0's stable DNS name: with ``subdomain`` set to
a headless Service, an Indexed Job's pod ``<job>-<i>`` is ``<job>-<i>.<service>``.
The job directory (code, logs, metrics, checkpoints) is a PersistentVolumeClaim
mounted in every pod at the path the service sees it at, so the service reads
what the ranks write, as with the local backend.

Whatever image the job names, its pods run as a fixed non-root uid with no
capabilities and no privilege escalation (:mod:`.pod_security`), and a site may
hold jobs to a list of images (``JobOptions.allowed_images``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from gpulab.training import env as rank_env

from ..jobdir import JobDir
from ..render import render_node, torchrun_argv
from ..spec import JobSpec, SpecError
from .egress import METADATA_CIDRS, ipv4_networks
from .pod_security import DEFAULT_POD_SECURITY, PodSecurity, check_image

#: The pod annotation (and label) where the Job controller puts a pod's index.
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
POD_IP = "GPULAB_POD_IP"
JOB_ID_LABEL = "gpulab.io/job-id"
USER_ANNOTATION = "gpulab.io/user"
COMMON_LABELS = {"app.kubernetes.io/name": "gpulab", "app.kubernetes.io/managed-by": "gpulab"}
CONTAINER = "node"
RDZV_PORT_NAME = "c10d"
#: The key of the job's Secret (:func:`rdzv_secret_name`) that holds its rendezvous secret.
RDZV_SECRET_KEY = "rdzv-secret"

# Runs as `sh -c NODE_WRAPPER gpulab-node torchrun ARGS...`: rewrites the one
# `--rdzv-conf=is_host=?,...` argument for this pod's index, then execs torchrun
# (which so replaces the shell and gets the kubelet's SIGTERM itself).
NODE_WRAPPER = (
    'case "$PET_NODE_RANK" in 0) h=1;; [1-9]*) h=0;; '
    '*) echo "gpulab: PET_NODE_RANK=$PET_NODE_RANK is not a completion index;'
    ' run this pod from an Indexed Job" >&2; exit 2;; esac\n'
    'for a do shift; case "$a" in --rdzv-conf=is_host=?,*) '
    'a="--rdzv-conf=is_host=$h,${a#--rdzv-conf=is_host=?,}";; esac; set -- "$@" "$a"; done\n'
    'exec "$@"'
)

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# An Indexed Job's pod hostname is `<job>-<index>`; a hostname is at most 63
# characters, and JobSet adds `-<replicated job>-<job index>` too.
MAX_JOB_NAME = 40


def job_name(spec: JobSpec) -> str:
    """The Job's (and its headless Service's) name: ``gpulab-<job id>``."""
    if not spec.id:
        raise SpecError("the job has no id yet; the service gives it one when it is submitted")
    name = f"gpulab-{spec.id.lower()}"
    if not _DNS_LABEL.match(name) or len(name) > MAX_JOB_NAME:
        raise SpecError(
            f"job id {spec.id!r} cannot name a Kubernetes Job: use at most "
            f"{MAX_JOB_NAME - 7} lowercase letters, digits and '-'"
        )
    return name


def rdzv_secret_name(spec: JobSpec) -> str:
    """The job's Secret (:mod:`.isolation`): ``gpulab-<job id>-rdzv``."""
    return f"{job_name(spec)}-rdzv"


def escape(value: str) -> str:
    """``value`` as a literal in container args or env (the kubelet reads ``$$`` as ``$``)."""
    return value.replace("$", "$$")


@dataclass(frozen=True)
class JobOptions:
    """What a cluster adds to a job spec: where its files live, how it queues.

    ``jobs_root`` is the service's jobs directory, which ``jobs_pvc`` holds and
    every pod mounts at the same path. ``labels`` go on the Job (e.g. Kueue's
    ``kueue.x-k8s.io/queue-name``), ``pod_labels`` on its pods only (e.g. KAI's
    ``kai.scheduler/preemptibility``); ``priority_class`` is the pods'
    PriorityClass; ``pod_patch`` returns a pod template holding the slice (from
    ``gpulab.enforcement.kube``). What depends on the job's own priority class
    comes per job from the backend's ``options_for`` (see
    ``gpulab.enforcement.kube.kueue.class_patch``).

    ``security`` is who the pods' code runs as (:class:`.pod_security.PodSecurity`);
    ``allowed_images`` the glob patterns a job's image must match (empty: any image);
    ``egress_blocked_cidrs`` the IPv4 ranges the job's NetworkPolicy keeps its pods
    from (:func:`.isolation.make_job_network_policy`).
    """

    jobs_root: str
    jobs_pvc: str
    checkpoint_pvc: str = ""  # a claim of its own for spec.checkpoint_dir, if outside jobs_root
    rdzv_port: int = 29400
    #: torchrun with gpulab's signed rendezvous registered (``--rdzv-backend=gpulab``).
    launcher: tuple[str, ...] = tuple(torchrun_argv("python"))
    labels: dict = field(default_factory=dict)
    pod_labels: dict = field(default_factory=dict)
    priority_class: str = ""
    service_account: str = ""
    #: The pods' terminationGracePeriodSeconds: SIGTERM (the ranks checkpoint at the
    #: next step) to SIGKILL when Kueue, the kube-scheduler or gpulab stops them.
    termination_grace_seconds: int | None = None
    ttl_seconds_after_finished: int | None = 3600
    pod_patch: Callable[[dict], dict] | None = None
    security: PodSecurity = DEFAULT_POD_SECURITY
    allowed_images: tuple[str, ...] = ()
    egress_blocked_cidrs: tuple[str, ...] = METADATA_CIDRS

    def __post_init__(self):
        if not self.jobs_root.startswith("/"):
            raise SpecError(f"jobs_root must be an absolute path, got {self.jobs_root!r}")
        if not self.jobs_pvc:
            raise SpecError(
                "jobs_pvc must name the PersistentVolumeClaim that holds jobs_root "
                "(ReadWriteMany: every pod of a job mounts it)"
            )
        if not 1 <= self.rdzv_port <= 65535:
            raise SpecError(f"rdzv_port must be a TCP port, got {self.rdzv_port!r}")
        if not isinstance(self.security, PodSecurity):
            raise SpecError(f"security must be a PodSecurity, got {self.security!r}")
        for pattern in self.allowed_images:
            if not isinstance(pattern, str) or not pattern.strip():
                raise SpecError(f"allowed_images holds glob patterns, got {pattern!r}")
        ipv4_networks(self.egress_blocked_cidrs, "egress_blocked_cidrs")


def pod_labels(spec: JobSpec) -> dict:
    return {**COMMON_LABELS, "app.kubernetes.io/component": "job", JOB_ID_LABEL: spec.id}


def common_labels(spec: JobSpec, options: JobOptions) -> dict:
    """Labels of the Job (JobSet, Service): the caller's (Kueue's) and ours, ours winning.

    The caller's stay off the pods: Kueue admits the Job as a whole, and would
    take pods carrying a queue name for workloads of their own.
    """
    return {**options.labels, **pod_labels(spec)}


def check_spec(spec: JobSpec, options: JobOptions | None = None) -> None:
    """``spec`` can run as pods: it has an image, one the site allows (``options``)."""
    spec.validate()
    if not spec.image:
        raise SpecError(
            "'image' is required on Kubernetes: a container image with gpulab "
            "and torch installed (e.g. the notebook image)"
        )
    if options is not None:
        check_image(spec.image, options.allowed_images)


def node_gpus(spec: JobSpec) -> list[str]:
    """Device numbers of the local ranks inside the pod (the device plugin numbers from 0)."""
    if not spec.gpu_milli:
        return []
    if spec.gpu_milli < 1000:  # fractional ranks of one pod share its card
        return ["0"] * spec.nproc_per_node
    per = spec.gpu_milli // 1000
    return [str(i * per) for i in range(spec.nproc_per_node)]


def _volumes(spec: JobSpec, options: JobOptions, ckpt_dir: str) -> tuple[list, list]:
    volumes = [{"name": "jobs", "persistentVolumeClaim": {"claimName": options.jobs_pvc}}]
    # The job's own folder of the volume, at its path in the service's: other jobs'
    # folders (their specs, checkpoints and outputs) are not in its pods at all.
    job_dir = JobDir(options.jobs_root, spec.id).path
    mounts = [{"name": "jobs", "mountPath": job_dir, "subPath": spec.id}]
    inside = (ckpt_dir + "/").startswith(job_dir.rstrip("/") + "/")
    if options.checkpoint_pvc:
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": options.checkpoint_pvc}}
        )
        # The job's own folder of the claim, as for the jobs claim: the whole claim
        # would be every job's checkpoints, for any job to read or replace.
        mounts.append({"name": "checkpoints", "mountPath": ckpt_dir, "subPath": spec.id})
    elif not inside:
        raise SpecError(
            f"checkpoint_dir {ckpt_dir!r} is not in the job's folder on the jobs volume "
            f"({job_dir}): leave it empty, or set checkpoint_pvc"
        )
    return volumes, mounts


def node_container(spec: JobSpec, options: JobOptions, rdzv_host: str) -> dict:
    """The torchrun container of every node; it finds its node from its pod's index."""
    job_dir = JobDir(options.jobs_root, spec.id).path
    # Rendered for node 0, then every node-specific part made per-pod.
    local_addr = f"$({POD_IP})"
    launch = render_node(
        spec,
        0,
        job_dir=job_dir,
        rdzv_host=rdzv_host,
        rdzv_port=options.rdzv_port,
        local_addr=local_addr,
        node_gpus=node_gpus(spec),
        launcher=list(options.launcher),
    )
    args = []
    for a in launch.argv:
        if a.startswith("--log-dir="):
            a = escape(a[: -len("/node0")]) + "/node$(PET_NODE_RANK)"
        elif a != f"--local-addr={local_addr}":
            a = escape(a)
        args.append(a)
    env = [
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
        },
        {"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    # The rendezvous secret from the job's Secret, not a file on the jobs volume
    # (which other users' pods mount too).
    env.append(
        {
            "name": rank_env.RDZV_SECRET,
            "valueFrom": {"secretKeyRef": {"name": rdzv_secret_name(spec), "key": RDZV_SECRET_KEY}},
        }
    )
    skip = ("PET_NODE_RANK", rank_env.RDZV_SECRET_FILE)
    env += [{"name": k, "value": escape(v)} for k, v in launch.env.items() if k not in skip]
    return {
        "name": CONTAINER,
        "image": spec.image,
        "command": ["/bin/sh", "-c", NODE_WRAPPER, "gpulab-node"],
        "args": args,
        "env": env,
        "workingDir": job_dir,  # not expanded by the kubelet
        "ports": [{"name": RDZV_PORT_NAME, "containerPort": options.rdzv_port, "protocol": "TCP"}],
    }


def pod_template(spec: JobSpec, options: JobOptions, rdzv_host: str, subdomain: str | None) -> dict:
    """The pod template of every node (``subdomain`` gives pods DNS names; JobSet sets its own)."""
    check_spec(spec, options)
    container = node_container(spec, options, rdzv_host)
    ckpt_dir = spec.checkpoint_dir or JobDir(options.jobs_root, spec.id).p("checkpoints")
    volumes, mounts = _volumes(spec, options, ckpt_dir)
    container["volumeMounts"] = mounts
    pod_spec = {
        # Pod failures are the Job's to count (backoffLimitPerIndex); torchrun
        # restarts ranks inside a pod itself (--max-restarts).
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        # User code runs here: it gets no Kubernetes credentials, no service links.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    # Whatever the image says: a fixed non-root uid, no capabilities, no escalation.
    options.security.apply(pod_spec)
    if subdomain:
        pod_spec["subdomain"] = subdomain
    if options.priority_class:
        pod_spec["priorityClassName"] = options.priority_class
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    if options.termination_grace_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = options.termination_grace_seconds
    # The user is named on the Job, not on its pods: enforcement drops every
    # gpulab.io/ annotation from a pod (they may grant GPUs).
    template = {
        "metadata": {"labels": {**options.pod_labels, **pod_labels(spec)}},
        "spec": pod_spec,
    }
    if options.pod_patch is not None:
        template = options.pod_patch(template)
    return template
