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
"""

from __future__ import annotations

from ..spec import JobSpec
from .pods import (
    INDEX_ANNOTATION,
    JOB_ID_LABEL,
    RDZV_PORT_NAME,
    USER_ANNOTATION,
    JobOptions,
    common_labels,
    job_name,
    pod_template,
)


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
    job_spec = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        "backoffLimitPerIndex": spec.max_restarts,
        "maxFailedIndexes": 0,
        # A replacement starts only once the failed pod is gone, so two pods
        # never claim the same index (and node rank) at once.
        "podReplacementPolicy": "Failed",
        "template": pod_template(spec, options, rdzv_host(spec), subdomain=name),
    }
    if spec.timeout:
        job_spec["activeDeadlineSeconds"] = max(1, int(spec.timeout))
    if options.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = options.ttl_seconds_after_finished
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": common_labels(spec, options),
            "annotations": {USER_ANNOTATION: spec.user},
        },
        "spec": job_spec,
    }


def job_objects(spec: JobSpec, options: JobOptions) -> list[dict]:
    """``[Service, Job]``: ``spec`` on a cluster without JobSet, in the order to create them."""
    return [make_headless_service(spec, options), make_job(spec, options)]


__all__ = ["INDEX_ANNOTATION", "job_objects", "make_headless_service", "make_job", "rdzv_host"]
