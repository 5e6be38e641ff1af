"""A training job as a JobSet, where the JobSet CRD (``jobset.x-k8s.io``) is installed.

JobSet makes the headless Service itself (``spec.network``) and restarts the
whole group when one pod fails (``failurePolicy.maxRestarts``): every node
starts again together and resumes from the last checkpoint, which suits a
c10d rendezvous better than replacing one pod under a running store. The
pods are the same as in the Indexed Job (:mod:`.pods`): one replicated Job
``node`` of ``spec.nodes`` indexed pods, so the pod of node ``i`` is
``<jobset>-node-0-<i>.<jobset>`` and its index is still its completion index.

An elastic job (``--nodes MIN:MAX``) gets the elastic Job's pod template
(:func:`.job.elastic_template`: torchrun takes ``MIN:MAX`` nodes) in its one
replicated Job of ``spec.nodes`` pods. JobSet lets the replicated Job's
``completions`` and ``parallelism`` change together only from v0.12 with its
``ElasticJobSet`` feature gate (alpha, off by default); elsewhere the webhook
refuses the change and the backend relaunches the job at its new size instead.
Kueue has no elastic JobSets (it refuses ``kueue.x-k8s.io/elastic-job`` on one),
so a JobSet never carries that annotation, and one in a Kueue queue is always
relaunched to resize.

No schema for JobSet ships with kubernetes-validate; the tests check the
JobSet's own fields against the CRD's documented shape, and its embedded Job
template with kubernetes-validate.
"""

from __future__ import annotations

from gpulab.enforcement.kube.kueue import QUEUE_LABEL

from ..spec import JobSpec
from .job import elastic_template
from .pods import USER_ANNOTATION, JobOptions, common_labels, job_name, pod_labels, pod_template

GROUP = "jobset.x-k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "jobsets"
REPLICATED_JOB = "node"


def jobset_rdzv_host(spec: JobSpec) -> str:
    name = job_name(spec)
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def make_jobset(spec: JobSpec, options: JobOptions) -> dict:
    name = job_name(spec)
    template = pod_template(spec, options, jobset_rdzv_host(spec), subdomain=None)
    if spec.elastic:
        template = elastic_template(template, spec, options)
    job_spec = {
        "completionMode": "Indexed",
        "completions": spec.nodes,
        "parallelism": spec.nodes,
        # A failed pod fails its Job at once; the JobSet's failurePolicy restarts them all.
        "backoffLimit": 0,
        "template": template,
    }
    jobset_spec = {
        "network": {
            "enableDNSHostnames": True,
            "subdomain": name,
            "publishNotReadyAddresses": True,
        },
        "replicatedJobs": [
            {
                "name": REPLICATED_JOB,
                "replicas": 1,
                "template": {"metadata": {"labels": pod_labels(spec)}, "spec": job_spec},
            }
        ],
        "successPolicy": {"operator": "All"},
        "failurePolicy": {"maxRestarts": spec.max_restarts},
    }
    if spec.timeout:
        job_spec["activeDeadlineSeconds"] = max(1, int(spec.timeout))
    if options.ttl_seconds_after_finished is not None:
        jobset_spec["ttlSecondsAfterFinished"] = options.ttl_seconds_after_finished
    if QUEUE_LABEL in options.labels:
        jobset_spec["suspend"] = True  # as a queued Job (job.py): Kueue starts it
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "labels": common_labels(spec, options),
            "annotations": {USER_ANNOTATION: spec.user},
        },
        "spec": jobset_spec,
    }
