"""A training job as a headless Service and an Indexed Job: pure functions.

One pod per node (``completions == parallelism == spec.nodes``), each pod's
node taken from its completion index (:mod:`.pods`). The headless Service
gives index 0 the DNS name the other nodes rendezvous at,
``<job>-0.<job>``; it publishes pods before they are ready because the
rendezvous happens before anything could call them ready.

Restarts happen at two levels. torchrun restarts the ranks of every node when
one rank fails (``--max-restarts``, all in the running pods); the Job replaces
a pod that died (evicted, its node lost) up to ``spec.max_restarts`` times per
index (``backoffLimitPerIndex``), and ``maxFailedIndexes: 0`` fails the whole
job as soon as one index is out of retries. A replaced pod resumes from the
last checkpoint on the job volume (``gpulab.training.checkpoint``).

An elastic job (``--nodes MIN:MAX``) is the same Indexed Job at its size now
(``completions == parallelism == spec.nodes``) whose torchrun agents are told the
range (``--nnodes=MIN:MAX``, :func:`elastic_template`): the c10d rendezvous then
takes any count of nodes from MIN to MAX, and a pod that joins later makes the
running agents restart their ranks in a new round with it (torchrun counts that as
a membership change, not a restart). Kubernetes lets an Indexed Job's
``completions`` change together with ``parallelism`` while the two stay equal
(elastic Indexed Jobs, GA in 1.31); scaling down removes the highest indexes, so
index 0, which hosts the rendezvous store, stays. The backend's ``resize`` patches
both. Under Kueue the Job carries ``kueue.x-k8s.io/elastic-job: "true"``, so that
Kueue (``ElasticJobsViaWorkloadSlices``) admits a growth as a workload slice instead
of evicting the Job whose pod count changed.
"""

from __future__ import annotations

import copy

from gpulab.enforcement.kube.kueue import QUEUE_LABEL

from ..spec import JobSpec, SpecError
from .pods import (
    CONTAINER,
    INDEX_ANNOTATION,
    JOB_ID_LABEL,
    RDZV_PORT_NAME,
    USER_ANNOTATION,
    JobOptions,
    common_labels,
    job_name,
    pod_template,
)

#: On an elastic Job: Kueue's opt-in to workload slices (a change of parallelism is
#: admitted as a new slice, not answered by evicting the Job). Needs Kueue >= 0.13 with
#: the ElasticJobsViaWorkloadSlices feature gate (on by default from 0.18); without
#: it the annotation does nothing. Kueue refuses it on a JobSet: only Jobs carry it.
KUEUE_ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
#: The scheduling gate Kueue's webhook adds to an elastic Job's pod template (and
#: lifts from each pod as its slice is admitted): the sign that Kueue took it as elastic.
KUEUE_ELASTIC_GATE = "kueue.x-k8s.io/elastic-job"
#: The rendezvous of an elastic job, beyond the fixed job's (``--rdzv-conf``). Once
#: MIN nodes are in, a round waits ``last_call_timeout`` seconds more for the rest
#: (all of them at once end it at once), so a resize costs seconds, not torch's 30;
#: an agent gone without leaving (its pod deleted) is dropped after
#: ``keep_alive_interval * keep_alive_max_attempt`` seconds without a heartbeat.
ELASTIC_RDZV_CONF = {"last_call_timeout": 10, "keep_alive_interval": 2, "keep_alive_max_attempt": 3}
#: How long torchrun lets its ranks stop after it passes SIGTERM on (torch's
#: default: 30 s): an elastic job's is the pod's grace, so a node that leaves has all
#: of it to checkpoint.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def nnodes(spec: JobSpec) -> str:
    """torchrun's ``--nnodes``: ``MIN:MAX`` for an elastic job, its size otherwise."""
    return f"{spec.min_nodes}:{spec.max_nodes}" if spec.elastic else str(spec.nodes)


def elastic_template(template: dict, spec: JobSpec, options: JobOptions) -> dict:
    """The node pod ``template`` of an elastic ``spec``: torchrun takes ``MIN:MAX``
    nodes and rounds end quickly (:data:`ELASTIC_RDZV_CONF`). A new dict."""
    template = copy.deepcopy(template)
    [node] = [c for c in template["spec"]["containers"] if c["name"] == CONTAINER]
    fixed, conf = f"--nnodes={spec.nodes}", "--rdzv-conf="
    if node["args"].count(fixed) != 1 or sum(a.startswith(conf) for a in node["args"]) != 1:
        raise SpecError(f"the node command has no single {fixed} and {conf}: {node['args']}")
    args = []
    for a in node["args"]:
        if a == fixed:
            a = f"--nnodes={nnodes(spec)}"
        elif a.startswith(conf):
            have = {kv.split("=", 1)[0] for kv in a[len(conf) :].split(",")}
            a += "".join(f",{k}={v}" for k, v in ELASTIC_RDZV_CONF.items() if k not in have)
        args.append(a)
    node["args"] = args
    env = node["env"]
    for e in env:
        if e["name"] == "PET_NNODES":
            e["value"] = nnodes(spec)
    grace = options.termination_grace_seconds
    if grace is not None and not any(e["name"] == SHUTDOWN_TIMEOUT_ENV for e in env):
        env.append({"name": SHUTDOWN_TIMEOUT_ENV, "value": str(grace)})
    return template


def rdzv_host(spec: JobSpec) -> str:
    """Index 0's DNS name inside the namespace: ``<job>-0.<headless service>``."""
    name = job_name(spec)
    return f"{name}-0.{name}"


def make_headless_service(spec: JobSpec, options: JobOptions) -> dict:
    name = job_name(spec)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": common_labels(spec, options)},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_ID_LABEL: spec.id},
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": RDZV_PORT_NAME,
                    "port": options.rdzv_port,
                    "targetPort": options.rdzv_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def make_job(spec: JobSpec, options: JobOptions) -> dict:
    """The Indexed Job of ``spec``; its pods need :func:`make_headless_service` for DNS."""
    name = job_name(spec)
    template = pod_template(spec, options, rdzv_host(spec), subdomain=name)
    if spec.elastic:
        template = elastic_template(template, spec, options)
    job_spec = {
        "completionMode": "Indexed",
        # An elastic job's size now; the backend's resize changes both together.
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimitPerIndex": spec.max_restarts,
        "maxFailedIndexes": 0,
        # A replacement starts only once the failed pod is gone, so two pods
        # never claim the same index (and node rank) at once.
        "podReplacementPolicy": "Failed",
        "template": template,
    }
    if spec.timeout:
        job_spec["activeDeadlineSeconds"] = max(1, int(spec.timeout))
    if options.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = options.ttl_seconds_after_finished
    if QUEUE_LABEL in options.labels:
        # Kueue unsuspends it on admission. Kueue's webhook suspends a queued Job as
        # it is made; where no webhook is reached (Kueue run without one) the pods of
        # a Job made running start outside the quota until Kueue's reconciler
        # suspends it ("Running job is not admitted by a cluster queue").
        job_spec["suspend"] = True
    annotations = {USER_ANNOTATION: spec.user}
    if spec.elastic:
        annotations[KUEUE_ELASTIC_ANNOTATION] = "true"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": common_labels(spec, options),
            "annotations": annotations,
        },
        "spec": job_spec,
    }


def job_objects(spec: JobSpec, options: JobOptions) -> list[dict]:
    """``[Service, Job]``: ``spec`` on a cluster without JobSet, in the order to create them."""
    return [make_headless_service(spec, options), make_job(spec, options)]


__all__ = [
    "ELASTIC_RDZV_CONF",
    "INDEX_ANNOTATION",
    "KUEUE_ELASTIC_ANNOTATION",
    "elastic_template",
    "job_objects",
    "make_headless_service",
    "make_job",
    "nnodes",
    "rdzv_host",
]
