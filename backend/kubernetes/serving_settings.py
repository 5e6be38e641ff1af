"""The settings of model endpoints on Kubernetes, and what each becomes in their objects.

``c.GpuLabService.serving_backend_class = "kubernetes"`` turns it on; these say where::

    c.KubernetesServingSettings.namespace = "gpulab"
    c.KubernetesServingSettings.models_pvc = "gpulab-models"  # RWX; holds <data-dir>/deployments
    c.KubernetesServingSettings.image = "quay.io/example/gpulab-singleuser:1"  # gpulab + torch

The claim must be mounted in the service's pod at ``<data-dir>/deployments``
(the Helm chart does it); model-server pods mount it at the same path.
Kubernetes restarts replicas that die; the ledger still holds one slice per
replica, so quotas and the cluster's free slices count them. A setting is a trait
here and what it does is a line below: adding one touches this file only.
"""

from __future__ import annotations

from traitlets import Dict, Integer, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from gpulab.enforcement.kube import check_backend
from gpulab.enforcement.kube.kueue import class_patch

from .deploy import ENDPOINT_LABEL, endpoint_name
from .egress import ipv4_networks
from .pod_security import PodSecurity
from .pod_slice import slice_claim_objects, slice_pod_patch
from .pods import COMMON_LABELS

#: Who decides how many replicas an endpoint runs (``KubernetesServingSettings.autoscaler``).
AUTOSCALERS = ("service", "hpa", "keda")
#: What an endpoint cannot run without.
REQUIRED = ("namespace", "models_pvc", "image")


class KubernetesServingSettings(Configurable):
    """Where and how model endpoints run on Kubernetes: the settings of
    :class:`~.serving.KubernetesServing` (``c.KubernetesServingSettings.*``, or
    ``c.KubernetesServing.*``), and what each becomes in an endpoint's objects. Its
    trait names are the keys of the older c.GpuLabService.kubernetes_deployments dict."""

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

    tls_secret = Unicode(
        "",
        help="""A kubernetes.io/tls Secret of the namespace (tls.crt, tls.key)
        whose certificate names *.<namespace>.svc: every replica serves https
        with it, and the service calls https://gpulab-ep-<id>.<namespace>.svc:443,
        verifying it against the system's CAs and GPULAB_CA_FILE (set that in the
        service's environment to the CA that signed it). Empty: plain HTTP inside
        the cluster. The Helm chart sets it with tls.internal.enabled. See
        docs/howto/kubernetes-tls.md.

        c.KubernetesServingSettings.tls_secret = "gpulab-replicas-tls"
        """,
    ).tag(config=True)

    run_as_user = Integer(
        1000,
        allow_none=True,
        help="""The uid the replicas' model server runs as, whatever the image says (the
        pods are runAsNonRoot, with no capabilities and no privilege escalation). It
        must read what the service wrote to the models claim (the chart's service pod
        runs as 1000). None: the image's own user, a numeric uid other than 0.

        c.KubernetesServingSettings.run_as_user = 1000
        """,
    ).tag(config=True)

    run_as_group = Integer(
        100,
        allow_none=True,
        help="""The replicas' primary gid (100: the Jupyter images' users group). None:
        the image's own.

        c.KubernetesServingSettings.run_as_group = 100
        """,
    ).tag(config=True)

    fs_group = Integer(
        1000,
        allow_none=True,
        help="""The replicas' fsGroup (1000: the chart's service pod's). None: none.

        c.KubernetesServingSettings.fs_group = 1000
        """,
    ).tag(config=True)

    egress_cidrs = List(
        Unicode(),
        help="""IPv4 ranges the replicas may connect to besides DNS (their
        NetworkPolicy's egress). A model server loads its model from its volume and
        answers the router; it calls nothing, so the default is none.

        c.KubernetesServingSettings.egress_cidrs = ["10.20.0.0/16"]
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

    # -- what the settings become -------------------------------------------------------
    # The backend (a Plugin) gives root (the deployments directory) and gpus.
    def check_settings(self) -> None:
        for key in REQUIRED:
            if not getattr(self, key):
                raise ValueError(
                    f"Kubernetes serving needs {key!r}: set "
                    f"c.KubernetesServingSettings.{key} (or that key of "
                    f"c.GpuLabService.kubernetes_deployments)"
                )
        if self.autoscaler == "keda" and not self.prometheus_url:
            raise ValueError(
                "c.KubernetesServingSettings.autoscaler = 'keda' asks Prometheus for the "
                "calls in flight: set c.KubernetesServingSettings.prometheus_url (the "
                "Prometheus that scrapes <hub>/services/gpulab/metrics), or use autoscaler "
                "'service'"
            )
        check_backend(self.enforcement or "hami", self.enforcement_options or None)
        self.pod_security()  # its own checks (no uid 0)
        ipv4_networks(self.egress_cidrs, "c.KubernetesServingSettings.egress_cidrs")

    def pod_security(self) -> PodSecurity:
        """Who the replicas' code runs as (``run_as_user``, ``run_as_group``, ``fs_group``)."""
        return PodSecurity(self.run_as_user, self.run_as_group, self.fs_group)

    def queueing(self) -> dict:
        """The replicas' Kueue labels and PriorityClass (``class_patch``'s answer)."""
        return class_patch(
            "deployment",
            queue=self.queue or None,
            priority=self.priority or None,
            priority_class=self.priority_class or None,
            prefix=self.priority_class_prefix,
        )

    def settings_pod_patch(self, dep: dict, rows: list[dict]):
        """The pod patch holding one replica's slice on the card the ledger chose."""
        enforcement = self.enforcement or "hami"
        options = check_backend(enforcement, self.enforcement_options or None)
        by_uuid = {g.uuid: g for g in self.gpus}
        return slice_pod_patch(
            enforcement,
            options,
            dep["gpu_milli"],
            rows,
            by_uuid,
            claim_name=self.claim_template_name(dep),
        )

    def claim_template_name(self, dep: dict) -> str:
        """The version's ResourceClaimTemplate under ``dra``: ``gpulab-ep-d<id>-gpu``."""
        return endpoint_name("d" + str(dep["id"])) + "-gpu"

    def settings_claim_objects(self, dep: dict, rows: list[dict]) -> list[dict]:
        """Under ``dra``: the replicas' ResourceClaimTemplate (or their card's shared
        claim), made before the Deployment; none for other backends."""
        enforcement = self.enforcement or "hami"
        return slice_claim_objects(
            enforcement,
            check_backend(enforcement, self.enforcement_options or None),
            dep["gpu_milli"],
            rows,
            {g.uuid: g for g in self.gpus},
            self.claim_template_name(dep),
            labels={
                **COMMON_LABELS,
                "app.kubernetes.io/component": "endpoint",
                ENDPOINT_LABEL: f"d{dep['id']}",
            },
        )
