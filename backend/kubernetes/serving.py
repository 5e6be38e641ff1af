"""Model endpoints on Kubernetes: the cluster I/O of a deployment's replicas.

:class:`KubernetesServing` stands in for :class:`~gpulab.backend.local_serving.LocalServing`
when the service runs on a cluster. The files are laid out the same way, on the
models claim (``models_pvc``), which the service and every model-server pod mount
at the same path (``root``)::

    <root>/<dep_id>/model/   model.pt2 + model.json (gpulab.serving.export)
    <root>/<dep_id>/token    the replicas' secret (0600); the pods get it from a Secret

A deployment becomes three objects, created in this order: a Secret
``gpulab-ep-d<id>-token`` (key ``token``), then the Deployment and the Service from
the pure builder :func:`~.deploy.make_deployment`, named ``gpulab-ep-d<id>``
(deployment ids are hex and may start with a digit; Kubernetes names may not).
Kubernetes restarts replicas (``managed_restarts``), so the manager only asks how
many are ready. ``kubernetes_asyncio`` is imported when the cluster is first
needed, never at import.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Callable

from ..deployment_dir import DeploymentDirs
from .apiclient import ApiClientHolder
from .deploy import ENDPOINT_LABEL, endpoint_name, make_deployment
from .pods import COMMON_LABELS, USER_ANNOTATION

#: How long ``stop`` waits for the cluster to remove an endpoint's pods.
STOP_WAIT_S = 120.0


class KubernetesServing(DeploymentDirs, ApiClientHolder):
    """An endpoint's replicas as a Deployment behind a Service in one namespace.

    ``pod_patch_for(dep, rows)`` returns the pod patch holding the replicas'
    slice (the service builds it from ``gpulab.enforcement.kube`` and the
    ledger rows), or None for none; ``labels`` go on the Deployment, the Service
    and the pods (e.g. Kueue's queue label).
    """

    name = "kubernetes"
    managed_restarts = True  # Kubernetes restarts replicas; the manager does not

    def __init__(self, root: str, *, namespace: str, models_pvc: str, image: str,
                 kubeconfig: str | None = None,
                 pod_patch_for: Callable[[dict, list[dict]], Callable[[dict], dict] | None]
                 | None = None,
                 labels: dict | None = None, priority_class: str = "", port: int = 8080):
        super().__init__(root)
        self.namespace = namespace
        self.models_pvc = models_pvc
        self.image = image
        self.kubeconfig = kubeconfig
        self.pod_patch_for = pod_patch_for
        self.labels = dict(labels or {})
        self.priority_class = priority_class
        self.port = port

    # -- the directory (DeploymentDirs) ------------------------------------------------
    def log_tail(self, dep_id: str, replica: int, lines: int = 5) -> str:
        """Nothing: the replicas' logs are their pods' (``kubectl logs``)."""
        return ""

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
        """The base URL of the endpoint's Service, inside the cluster."""
        return f"http://{self.object_name(dep)}.{self.namespace}.svc:80"

    # -- the objects (pure) --------------------------------------------------------------
    def secret(self, dep: dict) -> dict:
        token = self.token(dep["id"])
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.secret_name(dep),
                         "labels": {**COMMON_LABELS, "app.kubernetes.io/component": "endpoint",
                                    ENDPOINT_LABEL: self.k8s_name(dep)},
                         "annotations": {USER_ANNOTATION: dep["user"]}},
            "type": "Opaque",
            "data": {"token": base64.b64encode(token.encode()).decode()},
        }

    def objects(self, dep: dict, rows: list[dict]) -> list[dict]:
        """``[Secret, Deployment, Service]``, in the order to create them."""
        patch = self.pod_patch_for(dep, rows) if self.pod_patch_for else None
        return [self.secret(dep), *make_deployment(
            self.k8s_name(dep), image=self.image, model_dir=self.model_dir(dep["id"]),
            models_pvc=self.models_pvc, models_root=self.root, user=dep["user"],
            replicas=dep["replicas"], max_batch_size=dep["max_batch_size"],
            max_latency_ms=dep["max_latency_ms"], max_queue=dep["max_queue"], port=self.port,
            token_secret=self.secret_name(dep), labels=self.labels or None,
            priority_class=self.priority_class, pod_patch=patch)]

    # -- cluster I/O ---------------------------------------------------------------------
    async def launch(self, dep: dict, rows: list[dict]) -> None:
        """Create the Secret, the Deployment and the Service.

        What is already there (a launch repeated after a restart of the service) is
        replaced: the Secret and the Deployment take the new token and spec; the
        Service, whose selector and ports follow from the name alone, is kept.
        """
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        objects = self.objects(dep, rows)
        api = await self.api()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        ns = self.namespace
        for obj in objects:
            name, kind = obj["metadata"]["name"], obj["kind"]
            create, replace = {
                "Secret": (core.create_namespaced_secret, core.replace_namespaced_secret),
                "Deployment": (apps.create_namespaced_deployment,
                               apps.replace_namespaced_deployment),
                "Service": (core.create_namespaced_service, None),
            }[kind]
            try:
                await create(ns, obj)
            except ApiException as e:
                if e.status != 409:
                    raise
                if replace is not None:
                    await replace(name, ns, obj)

    async def _read(self, dep: dict):
        """The Deployment, or None when it does not exist."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            # The object, not its /status subresource: the chart's Role grants deployments.
            return await client.AppsV1Api(await self.api()).read_namespaced_deployment(
                self.object_name(dep), self.namespace)
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

    async def stop(self, dep: dict, wait_s: float = STOP_WAIT_S) -> None:
        """Delete the Deployment (in the foreground: its pods go first), the Service and the
        Secret, then wait (up to ``wait_s``) until the Deployment is gone. What is already
        gone is fine."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.api()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        name, ns = self.object_name(dep), self.namespace
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        for delete in (lambda: apps.delete_namespaced_deployment(name, ns, body=body),
                       lambda: core.delete_namespaced_service(name, ns),
                       lambda: core.delete_namespaced_secret(self.secret_name(dep), ns)):
            try:
                await delete()
            except ApiException as e:
                if e.status != 404:  # already gone is what we want
                    raise
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await self._read(dep) is None:
                return
            await asyncio.sleep(1.0)
