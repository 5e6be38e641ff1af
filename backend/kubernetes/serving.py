"""Model endpoints on Kubernetes: the cluster I/O of a deployment's replicas.

:class:`KubernetesServing` is the :class:`~gpulab.backend.serving_base.ServingBackend`
the service uses on a cluster (:class:`~gpulab.backend.local_serving.LocalServing`
elsewhere). The files are laid out the same way, on the
models claim (``models_pvc``), which the service and every model-server pod mount
at the same path (``root``)::

    <root>/<dep_id>/model/   model.pt2 + model.json (gpulab.serving.export)
    <root>/<dep_id>/token    the replicas' secret (0600); the pods get it from a Secret

A deployment becomes four objects, created in this order: a Secret
``gpulab-ep-d<id>-token`` (key ``token``), a NetworkPolicy ``gpulab-ep-d<id>`` (calls
to the replicas only from the router's pods, :mod:`.isolation`), then the Deployment
and the Service from
the pure builder :func:`~.deploy.make_deployment`, named ``gpulab-ep-d<id>``
(deployment ids are hex and may start with a digit; Kubernetes names may not).
Kubernetes restarts replicas (``restarts_replicas``), so :meth:`~KubernetesServing.check`
only asks how many are ready; calls go to the Service, which spreads them. A
replica's log is its pod's (the pods of the endpoint, by name: replica ``i`` is
the ``i``-th). ``kubernetes_asyncio`` is imported when the cluster is first
needed, never at import.

How many replicas run is the Deployment's ``spec.replicas``. With the service's own
autoscaler (``autoscaler="service"``, the default) :meth:`~KubernetesServing.scale`
patches it. With ``"hpa"`` or ``"keda"`` the cluster decides for a unit whose
``min_replicas`` and ``max_replicas`` differ: :meth:`~KubernetesServing.launch` also
makes a HorizontalPodAutoscaler or a KEDA ScaledObject of the Deployment's name
(:mod:`.autoscale`), :meth:`~KubernetesServing.check` reports the count it chose, and
:meth:`~KubernetesServing.stop` deletes it first.
"""

from __future__ import annotations

import asyncio
import base64
import time

from traitlets import Callable, Dict, default

from ..serving_base import Health, ServingBackend, follow_ready
from .apiclient import ApiClientHolder
from .autoscale import KEDA_GROUP, KEDA_PLURAL, KEDA_VERSION, make_hpa, make_scaled_object
from .deploy import ENDPOINT_LABEL, endpoint_name, make_deployment, service_port
from .dra_claims import create_claims, delete_claim
from .isolation import make_endpoint_network_policy
from .pods import COMMON_LABELS, USER_ANNOTATION
from .serving_settings import KubernetesServingSettings

#: How long ``stop`` waits for the cluster to remove an endpoint's pods.
STOP_WAIT_S = 120.0
#: The most log lines asked of a pod (the bytes are cut to what was asked after).
LOG_LINES = 5000
CONTAINER = "server"


class KubernetesServing(KubernetesServingSettings, ApiClientHolder, ServingBackend):
    """An endpoint's replicas as a Deployment behind a Service in one namespace; the
    settings are :class:`~.serving_settings.KubernetesServingSettings`.

    ``pod_patch_for(dep, rows)`` returns the pod patch holding the replicas' slice
    (by default the enforcement backend's for the card the ledger chose), or None
    for none. ``autoscaler`` is one of :data:`AUTOSCALERS`; ``"keda"`` needs
    ``prometheus_url`` (where KEDA asks for the calls in flight).
    """

    name = "kubernetes"
    restarts_replicas = True  # the Deployment controller does

    pod_patch_for = Callable(
        allow_none=True, help="(dep, rows) -> the pod patch of a replica's slice."
    )
    router_pod_labels = Dict(
        None, allow_none=True, help="The pods calls may come from (None: the chart's service pod)."
    )

    @default("pod_patch_for")
    def _settings_patch(self):
        return self.settings_pod_patch

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        self._ready: dict[str, int] = {}  # dep id -> ready replicas, as of the last check

    # -- names ---------------------------------------------------------------------------
    @staticmethod
    def k8s_name(dep: dict) -> str:
        """The endpoint's short name: ``d<id>`` (ids may start with a digit)."""
        return f"d{dep['id']}"

    def object_name(self, dep: dict) -> str:
        """The Deployment's and the Service's name: ``gpulab-ep-d<id>``."""
        return endpoint_name(self.k8s_name(dep))

    def secret_name(self, dep: dict) -> str:
        return f"{self.object_name(dep)}-token"

    def url(self, dep: dict) -> str:
        """The base URL of the endpoint's Service, inside the cluster: https (port 443)
        when the replicas serve TLS (``tls_secret``)."""
        scheme, port = ("https" if self.tls_secret else "http"), service_port(self.tls_secret)
        return f"{scheme}://{self.object_name(dep)}.{self.namespace}.svc:{port}"

    # -- the objects (pure) --------------------------------------------------------------
    def secret(self, dep: dict) -> dict:
        token = self.token(dep["id"])
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.secret_name(dep),
                "labels": {
                    **COMMON_LABELS,
                    "app.kubernetes.io/component": "endpoint",
                    ENDPOINT_LABEL: self.k8s_name(dep),
                },
                "annotations": {USER_ANNOTATION: dep["user"]},
            },
            "type": "Opaque",
            "data": {"token": base64.b64encode(token.encode()).decode()},
        }

    def network_policy(self, dep: dict) -> dict:
        """Calls to the replicas only from the router's pods; out only to DNS (and
        ``egress_cidrs``)."""
        return make_endpoint_network_policy(
            self.k8s_name(dep),
            port=self.port,
            router_pod_labels=self.router_pod_labels,
            egress_cidrs=self.egress_cidrs,
            labels={
                **COMMON_LABELS,
                "app.kubernetes.io/component": "endpoint",
                ENDPOINT_LABEL: self.k8s_name(dep),
            },
        )

    def objects(self, dep: dict, rows: list[dict]) -> list[dict]:
        """``[Secret, NetworkPolicy, Deployment, Service]``, in the order to create them."""
        patch = self.pod_patch_for(dep, rows) if self.pod_patch_for else None
        queueing = self.queueing()
        return [
            self.secret(dep),
            self.network_policy(dep),
            *make_deployment(
                self.k8s_name(dep),
                image=self.image,
                model_dir=self.model_dir(dep["id"]),
                models_pvc=self.models_pvc,
                models_root=self.root,
                user=dep["user"],
                replicas=dep["replicas"],
                max_batch_size=dep["max_batch_size"],
                max_latency_ms=dep["max_latency_ms"],
                max_queue=dep["max_queue"],
                port=self.port,
                token_secret=self.secret_name(dep),
                labels=queueing["labels"] or None,
                priority_class=queueing["priority_class_name"] or "",
                pod_patch=patch,
                tls_secret=self.tls_secret,
                security=self.pod_security(),
            ),
        ]

    def cluster_autoscales(self, dep: dict) -> bool:
        """True where a HorizontalPodAutoscaler or KEDA decides the count: ``autoscaler``
        is ``"hpa"`` or ``"keda"`` and the unit's count may move."""
        low = dep.get("min_replicas", dep["replicas"])
        return self.autoscaler in ("hpa", "keda") and low != dep.get("max_replicas", low)

    def autoscaler_object(self, dep: dict) -> dict | None:
        """The unit's HorizontalPodAutoscaler or ScaledObject; None where the service scales."""
        if not self.cluster_autoscales(dep):
            return None
        name = self.object_name(dep)
        if self.autoscaler == "hpa":
            return make_hpa(name, dep)
        return make_scaled_object(name, dep, prometheus_url=self.prometheus_url)

    # -- cluster I/O ---------------------------------------------------------------------
    async def launch(self, dep: dict, rows: list[dict]) -> None:
        """Create the Secret, the Deployment and the Service, then the autoscaler (if any).

        What is already there (a launch repeated after a restart of the service) is
        replaced: the Secret, the Deployment and the autoscaler take the new token and
        spec; the Service, whose selector follows from the name alone, is kept, its
        ports set again (http on 80, or https on 443 once ``tls_secret`` is set: a
        service restarted with TLS on moves running endpoints to it). Where the
        cluster decides the count, a replaced Deployment keeps the count it runs. An
        autoscaler left from an earlier launch of a unit that no longer autoscales is
        deleted.
        """
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        objects = self.objects(dep, rows)
        scaler = self.autoscaler_object(dep)  # built first: bad settings send nothing
        claims = self.settings_claim_objects(dep, rows)
        api = await self.api()
        # Under dra the replicas' devices come from a claim template: there before them.
        await create_claims(api, self.namespace, claims)
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        net = client.NetworkingV1Api(api)
        ns = self.namespace
        autoscales = scaler is not None
        for obj in objects:
            if obj["kind"] == "Deployment" and autoscales and self.autoscaler == "hpa":
                # An HPA does nothing to a Deployment at zero replicas: start it at one.
                obj["spec"]["replicas"] = max(1, obj["spec"]["replicas"])
            name, kind = obj["metadata"]["name"], obj["kind"]
            create, replace = {
                "Secret": (core.create_namespaced_secret, core.replace_namespaced_secret),
                "NetworkPolicy": (
                    net.create_namespaced_network_policy,
                    net.replace_namespaced_network_policy,
                ),
                "Deployment": (
                    apps.create_namespaced_deployment,
                    apps.replace_namespaced_deployment,
                ),
                "Service": (core.create_namespaced_service, None),
            }[kind]
            try:
                await create(ns, obj)
            except ApiException as e:
                if e.status != 409:
                    raise
                if kind == "Service":
                    # Merge patch: the ports list is replaced whole, clusterIP is kept.
                    await core.patch_namespaced_service(
                        name,
                        ns,
                        {"spec": {"ports": obj["spec"]["ports"]}},
                        _content_type="application/merge-patch+json",
                    )
                    continue
                if replace is None:
                    continue
                if kind == "Deployment" and autoscales:
                    # The autoscaler's count, not the one the unit was launched with.
                    found = await self._read(dep)
                    if found is not None and found.spec is not None:
                        kept = int(found.spec.replicas or 0)
                        floor = 1 if self.autoscaler == "hpa" else 0
                        obj["spec"]["replicas"] = max(floor, kept)
                await replace(name, ns, obj)
        if scaler is not None:
            await self._put_autoscaler(scaler)
        elif self.autoscaler in ("hpa", "keda"):
            await self._delete_autoscaler(dep)

    async def _put_autoscaler(self, obj: dict) -> None:
        """Create ``obj`` (an HPA or a ScaledObject), or replace the one of its name."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api, ns, name = await self.api(), self.namespace, obj["metadata"]["name"]
        if obj["kind"] == "HorizontalPodAutoscaler":
            hpa = client.AutoscalingV2Api(api)
            try:
                await hpa.create_namespaced_horizontal_pod_autoscaler(ns, obj)
            except ApiException as e:
                if e.status != 409:
                    raise
                await hpa.replace_namespaced_horizontal_pod_autoscaler(name, ns, obj)
            return
        custom = client.CustomObjectsApi(api)
        where = (KEDA_GROUP, KEDA_VERSION, ns, KEDA_PLURAL)
        try:
            await custom.create_namespaced_custom_object(*where, obj)
        except ApiException as e:
            if e.status != 409:
                raise
            # A custom resource is replaced only at the version read: no unconditional update.
            found = await custom.get_namespaced_custom_object(*where, name)
            version = (found.get("metadata") or {}).get("resourceVersion")
            meta = {**obj["metadata"], **({"resourceVersion": version} if version else {})}
            await custom.replace_namespaced_custom_object(*where, name, {**obj, "metadata": meta})

    async def _delete_autoscaler(self, dep: dict) -> None:
        """Delete the unit's HPA or ScaledObject (whichever ``autoscaler`` makes); gone is fine."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api, ns, name = await self.api(), self.namespace, self.object_name(dep)
        try:
            if self.autoscaler == "hpa":
                await client.AutoscalingV2Api(api).delete_namespaced_horizontal_pod_autoscaler(
                    name, ns
                )
            elif self.autoscaler == "keda":
                await client.CustomObjectsApi(api).delete_namespaced_custom_object(
                    KEDA_GROUP, KEDA_VERSION, ns, KEDA_PLURAL, name
                )
        except ApiException as e:
            if e.status != 404:
                raise

    async def scale(self, dep: dict, replicas: int, rows: list[dict]) -> None:
        """Set the Deployment's ``spec.replicas`` (a merge patch); the Deployment controller
        starts or stops pods. Every replica's pod has the same template, so ``rows`` (the
        new replicas' slices) change nothing here."""
        from kubernetes_asyncio import client

        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be an integer >= 0, got {replicas!r}")
        await client.AppsV1Api(await self.api()).patch_namespaced_deployment(
            self.object_name(dep),
            self.namespace,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
        )

    async def adopt(self, dep: dict, rows: list[dict]) -> None:
        await self.launch(dep, rows)

    async def _read(self, dep: dict):
        """The Deployment, or None when it does not exist."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            # The object, not its /status subresource: the chart's Role grants deployments.
            return await client.AppsV1Api(await self.api()).read_namespaced_deployment(
                self.object_name(dep), self.namespace
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def ready(self, dep: dict) -> int:
        """How many replicas are ready (the Deployment's ``status.readyReplicas``); 0 if none."""
        found = await self._read(dep)
        if found is None or found.status is None:
            return 0
        return int(found.status.ready_replicas or 0)

    async def check(self, dep: dict) -> Health:
        """How many replicas are ready; where the cluster decides the count, also that count
        (the Deployment's ``spec.replicas``), against which "running" is judged."""
        if not self.cluster_autoscales(dep):
            ready = self._ready[dep["id"]] = await self.ready(dep)
            return follow_ready(dep, ready)
        found = await self._read(dep)
        ready = int((found.status.ready_replicas or 0) if found and found.status else 0)
        self._ready[dep["id"]] = ready
        running = found.spec.replicas if found and found.spec else None
        replicas = dep["replicas"] if running is None else int(running)
        health = follow_ready({**dep, "replicas": replicas}, ready)
        health.replicas = replicas
        return health

    def ready_replicas(self, dep: dict) -> list[tuple[int, str]]:
        """The Service, as replica 0, once a replica behind it is ready: it spreads the calls."""
        return [(0, self.url(dep))] if self._ready.get(dep["id"]) else []

    def forget(self, dep_id: str) -> None:
        self._ready.pop(dep_id, None)

    async def replica_pods(self, dep: dict) -> list:
        """The endpoint's pods, by name (the order ``logs`` numbers them in)."""
        from kubernetes_asyncio import client

        found = await client.CoreV1Api(await self.api()).list_namespaced_pod(
            self.namespace, label_selector=f"{ENDPOINT_LABEL}={self.k8s_name(dep)}"
        )
        return sorted(found.items or [], key=lambda pod: pod.metadata.name)

    async def logs(self, dep: dict, replica: int, max_bytes: int = 256 * 1024) -> str:
        """The end of the ``replica``-th pod's log; "" while there is no such pod or its
        container has not started."""
        from kubernetes_asyncio import client

        pods = await self.replica_pods(dep)
        if not 0 <= replica < len(pods):
            return ""
        # The raw answer: parsed, a log line that happens to be JSON would be mangled.
        resp = await client.CoreV1Api(await self.api()).read_namespaced_pod_log(
            pods[replica].metadata.name,
            self.namespace,
            container=CONTAINER,
            tail_lines=LOG_LINES,
            _preload_content=False,
        )
        try:
            if resp.status in (400, 404):  # not started yet, or just gone
                return ""
            data = await resp.read()
            if not 200 <= resp.status <= 299:
                raise RuntimeError(
                    f"reading the log of pod {pods[replica].metadata.name}: "
                    f"HTTP {resp.status}: {data[:200]!r}"
                )
        finally:
            resp.release()
        return data[-max_bytes:].decode(errors="replace")

    async def stop(self, dep: dict, wait_s: float = STOP_WAIT_S) -> None:
        """Delete the autoscaler (so that it scales nothing back up), the Deployment (in the
        foreground: its pods go first), the Service and the Secret, then wait (up to
        ``wait_s``) until the Deployment is gone. What is already gone is fine."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        await self._delete_autoscaler(dep)
        api = await self.api()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        name, ns = self.object_name(dep), self.namespace
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        for delete in (
            lambda: apps.delete_namespaced_deployment(name, ns, body=body),
            lambda: core.delete_namespaced_service(name, ns),
            lambda: core.delete_namespaced_secret(self.secret_name(dep), ns),
            lambda: client.NetworkingV1Api(api).delete_namespaced_network_policy(name, ns),
        ):
            try:
                await delete()
            except ApiException as e:
                if e.status != 404:  # already gone is what we want
                    raise
        if (self.enforcement or "hami") == "dra":
            # After the Deployment: a template is read only when a pod is made.
            await delete_claim(api, ns, self.claim_template_name(dep), template=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await self._read(dep) is None:
                break
            await asyncio.sleep(1.0)
        self.forget(dep["id"])
