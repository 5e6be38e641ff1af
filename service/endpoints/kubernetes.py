"""Model endpoints on Kubernetes, as the service configures them.

Each ``%deploy`` endpoint becomes a Deployment (its replicas) and a Service in
the namespace, and the service forwards authenticated calls to that Service.
``c.GpuLabService.serving_backend_class = "kubernetes"`` turns it on, and
:class:`KubernetesServingSettings` says where::

    c.GpuLabService.serving_backend_class = "kubernetes"
    c.KubernetesServingSettings.namespace = "gpulab"
    c.KubernetesServingSettings.models_pvc = "gpulab-models"  # RWX; holds <data-dir>/deployments
    c.KubernetesServingSettings.image = "quay.io/example/gpulab-singleuser:1"  # gpulab + torch

The older dict form is still accepted (its keys are the traits' names) and turns
it on as well::

    c.GpuLabService.kubernetes_deployments = {"namespace": "gpulab",
        "models_pvc": "gpulab-models", "image": "quay.io/example/gpulab-singleuser:1"}

The claim must be mounted in the service's pod at ``<data-dir>/deployments``
(the Helm chart does it); model-server pods mount it at the same path.
Kubernetes restarts replicas that die; the ledger still holds one slice per
replica, so quotas and the cluster's free slices count them.
"""

from __future__ import annotations

from traitlets import Dict, Integer, TraitError, Unicode, validate
from traitlets.config import Configurable

from gpulab.backend.kubernetes.serving import AUTOSCALERS, KubernetesServing
from gpulab.enforcement.kube import check_backend
from gpulab.enforcement.kube.kueue import class_patch
from gpulab.service.jobs.kubernetes import slice_pod_patch


class KubernetesServingSettings(Configurable):
    """Where and how model endpoints run on Kubernetes (with
    c.GpuLabService.serving_backend_class = "kubernetes")."""

    namespace = Unicode(
        "",
        help="""The namespace the endpoints' objects go in (required).

        c.KubernetesServingSettings.namespace = "gpulab"
        """,
    ).tag(config=True)
    models_pvc = Unicode(
        "",
        help="""A ReadWriteMany claim holding <data-dir>/deployments,
        mounted there in the service's pod and read-only in each replica (required).

        c.KubernetesServingSettings.models_pvc = "gpulab-models"
        """,
    ).tag(config=True)
    image = Unicode(
        "",
        help="""The replicas' container image: gpulab and torch inside
        (required).

        c.KubernetesServingSettings.image = "quay.io/example/gpulab-singleuser:1"
        """,
    ).tag(config=True)
    enforcement = Unicode(
        "hami",
        help="""How a replica's pod holds its slice: one of
        gpulab.enforcement.kube's backends (hami, mig, mps, kai...).

        c.KubernetesServingSettings.enforcement = "mig"
        """,
    ).tag(config=True)
    enforcement_options = Dict(
        help="""Options of the enforcement backend.

        c.KubernetesServingSettings.enforcement_options = {"resource_prefix": "nvidia.com"}
        """
    ).tag(config=True)
    queue = Unicode(
        "",
        help="""A Kueue LocalQueue the replicas are admitted through; empty
        for none.

        c.KubernetesServingSettings.queue = "gpulab-serving"
        """,
    ).tag(config=True)
    priority = Unicode(
        "",
        help="""A Kueue WorkloadPriorityClass for the replicas, over
        <priority_class_prefix>serving; empty: that one, or the queue's default
        when priority_class_prefix is empty too.

        c.KubernetesServingSettings.priority = "serving"
        """,
    ).tag(config=True)
    priority_class = Unicode(
        "",
        help="""The pods' PriorityClass, over <priority_class_prefix>serving;
        empty: that one, or the cluster's default when priority_class_prefix is
        empty too.

        c.KubernetesServingSettings.priority_class = "gpulab-serving"
        """,
    ).tag(config=True)
    priority_class_prefix = Unicode(
        "",
        help="""Give the replicas the PriorityClass of gpulab's serving class,
        <prefix>serving, and in a Kueue queue the WorkloadPriorityClass of that
        name. They must exist (the Helm chart creates gpulab-serving and sets
        "gpulab-"). Empty: none.

        c.KubernetesServingSettings.priority_class_prefix = "gpulab-"
        """,
    ).tag(config=True)
    kubeconfig = Unicode(
        "",
        help="""A kubeconfig file; empty: the pod's in-cluster account.

        c.KubernetesServingSettings.kubeconfig = "/etc/gpulab/kubeconfig"
        """,
    ).tag(config=True)
    port = Integer(
        8080,
        help="""The port the model server listens on in each pod.

        c.KubernetesServingSettings.port = 8080
        """,
    ).tag(config=True)
    autoscaler = Unicode(
        "service",
        help="""Who scales an endpoint between its MIN and MAX replicas
        (%deploy --replicas MIN:MAX) on the calls in flight per replica:
        "service" (the gpulab service itself, setting the Deployment's
        spec.replicas; scales to zero), "hpa" (a HorizontalPodAutoscaler on the
        External metric gpulab_endpoint_inflight_requests, which the cluster's
        external metrics API must serve, e.g. prometheus-adapter; never below one
        replica) or "keda" (a KEDA ScaledObject asking Prometheus at
        prometheus_url; scales to zero). See
        docs/howto/endpoint-autoscaling-kubernetes.md.

        c.KubernetesServingSettings.autoscaler = "keda"
        """,
    ).tag(config=True)
    prometheus_url = Unicode(
        "",
        help="""The Prometheus KEDA asks for the calls in flight (required with
        autoscaler "keda"); it must scrape <hub>/services/gpulab/metrics.

        c.KubernetesServingSettings.prometheus_url = "http://prometheus-operated.monitoring.svc:9090"
        """,
    ).tag(config=True)

    @validate("autoscaler")
    def _valid_autoscaler(self, proposal):
        value = proposal["value"]
        if value not in AUTOSCALERS:
            raise TraitError(
                f"c.KubernetesServingSettings.autoscaler = {value!r}: use one of "
                f"{', '.join(repr(a) for a in AUTOSCALERS)}"
            )
        return value


#: The keys c.GpuLabService.kubernetes_deployments may hold.
KEYS = tuple(KubernetesServingSettings.class_trait_names(config=True))
REQUIRED = ("namespace", "models_pvc", "image")


def settings_from_dict(values: dict, parent=None) -> KubernetesServingSettings:
    """The settings of ``c.GpuLabService.kubernetes_deployments`` (over those of
    ``c.KubernetesServingSettings``, read from ``parent``'s config). ValueError for an
    unknown key or a value of the wrong type, naming it."""
    unknown = set(values or {}) - set(KEYS)
    if unknown:
        raise ValueError(
            f"c.GpuLabService.kubernetes_deployments: unknown key(s) "
            f"{', '.join(sorted(map(str, unknown)))}; known: {', '.join(KEYS)}"
        )
    settings = KubernetesServingSettings(parent=parent)
    for key, value in (values or {}).items():
        if key == "port" and isinstance(value, str) and value.isdigit():
            value = int(value)
        try:
            setattr(
                settings, key, value if value is not None else settings.traits()[key].default_value
            )
        except TraitError as e:
            raise ValueError(f"c.GpuLabService.kubernetes_deployments[{key!r}]: {e}") from None
    return settings


def kubernetes_serving(
    settings: KubernetesServingSettings,
    root: str,
    gpus,
    cls: type[KubernetesServing] = KubernetesServing,
) -> KubernetesServing:
    """The serving backend for ``settings``; ValueError naming what is missing or wrong."""
    for key in REQUIRED:
        if not getattr(settings, key):
            raise ValueError(
                f"Kubernetes serving needs {key!r}: set "
                f"c.KubernetesServingSettings.{key} (or that key of "
                f"c.GpuLabService.kubernetes_deployments)"
            )
    if settings.autoscaler == "keda" and not settings.prometheus_url:
        raise ValueError(
            "c.KubernetesServingSettings.autoscaler = 'keda' asks Prometheus for the calls "
            "in flight: set c.KubernetesServingSettings.prometheus_url (the Prometheus that "
            "scrapes <hub>/services/gpulab/metrics), or use autoscaler 'service'"
        )
    enforcement = settings.enforcement or "hami"
    options = check_backend(enforcement, settings.enforcement_options or None)
    by_uuid = {g.uuid: g for g in gpus}

    def pod_patch_for(dep: dict, rows: list[dict]):
        return slice_pod_patch(enforcement, options, dep["gpu_milli"], rows, by_uuid)

    queueing = class_patch(
        "deployment",
        queue=settings.queue or None,
        priority=settings.priority or None,
        priority_class=settings.priority_class or None,
        prefix=settings.priority_class_prefix,
    )
    return cls(
        root,
        namespace=settings.namespace,
        models_pvc=settings.models_pvc,
        image=settings.image,
        kubeconfig=settings.kubeconfig or None,
        pod_patch_for=pod_patch_for,
        labels=queueing["labels"],
        priority_class=queueing["priority_class_name"] or "",
        port=settings.port,
        autoscaler=settings.autoscaler,
        prometheus_url=settings.prometheus_url,
    )
