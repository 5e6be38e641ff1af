"""Model endpoints on Kubernetes, as the service configures them.

``c.GpuLabService.kubernetes_deployments`` turns it on: each ``%deploy``
endpoint becomes a Deployment (its replicas) and a Service in the namespace,
and the service forwards authenticated calls to that Service::

    c.GpuLabService.kubernetes_deployments = {
        "namespace": "gpulab",
        "models_pvc": "gpulab-models",   # ReadWriteMany; holds <data-dir>/deployments
        "image": "quay.io/example/gpulab-singleuser:1",   # gpulab + torch inside
        "enforcement": "hami",
        "queue": "", "priority": "", "priority_class": "",
    }

The claim must be mounted in the service's pod at ``<data-dir>/deployments``
(the Helm chart does it); model-server pods mount it at the same path.
Kubernetes restarts replicas that die; the ledger still holds one slice per
replica, so quotas and the cluster's free slices count them.
"""

from __future__ import annotations

from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.enforcement.kube.kueue import queue_patch

from .kube_jobs import check_settings, slice_pod_patch

KEYS = {"namespace", "models_pvc", "image", "enforcement", "enforcement_options", "queue",
        "priority", "priority_class", "kubeconfig", "port"}


def kubernetes_serving(settings: dict, root: str, gpus) -> KubernetesServing:
    """The serving backend for ``settings`` (``c.GpuLabService.kubernetes_deployments``)."""
    enforcement, options = check_settings("kubernetes_deployments", settings, KEYS,
                                          ("namespace", "models_pvc", "image"))
    by_uuid = {g.uuid: g for g in gpus}

    def pod_patch_for(dep: dict, rows: list[dict]):
        return slice_pod_patch(enforcement, options, dep["gpu_milli"], rows, by_uuid)

    labels = queue_patch("deployment", settings.get("queue"), settings.get("priority"))["labels"]
    return KubernetesServing(root, namespace=settings["namespace"],
                             models_pvc=settings["models_pvc"], image=settings["image"],
                             kubeconfig=settings.get("kubeconfig") or None,
                             pod_patch_for=pod_patch_for, labels=labels,
                             priority_class=settings.get("priority_class", ""),
                             port=int(settings.get("port", 8080)))
