"""A model endpoint as a Deployment and a Service (or a KServe InferenceService): pure functions.

Each replica runs gpulab's model server (``python -m gpulab.serving.server``,
Open Inference Protocol v2 with dynamic batching) on a model directory the
service exported to a PersistentVolumeClaim, mounted read-only. The service
proxies callers to the Service with the endpoint's token
(``GPULAB_SERVING_TOKEN`` from a Secret), so the server answers only it.

Readiness is the server's ``/v2/health/ready``. That route wants the token
when one is set, and a probe's HTTP headers are plain text in the pod spec,
so with a token the readiness probe is a command in the container (the
image has Python) that sends the token from the environment; liveness uses
``/v2/health/live``, which needs no token.

With ``tls_secret`` (a ``kubernetes.io/tls`` Secret: ``tls.crt``, ``tls.key``) the
server serves https: the Secret is mounted read-only at :data:`TLS_DIR`, the probes
use ``scheme: HTTPS`` (the kubelet does not verify a probe's certificate; the
command probe dials its own pod's loopback, which the certificate does not name, so
it does not verify either), and the Service's port is 443. Its certificate must
name the Service: ``*.<namespace>.svc`` covers every endpoint of the namespace.

A replica runs its owner's model, so its pod gets the job pods' security contexts
(:class:`.pod_security.PodSecurity`: a fixed non-root uid, no capabilities, no
privilege escalation), whatever the image says.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from ..spec import SpecError
from .pod_security import DEFAULT_POD_SECURITY, PodSecurity
from .pods import COMMON_LABELS, USER_ANNOTATION

ENDPOINT_LABEL = "gpulab.io/endpoint"
TOKEN_ENV = "GPULAB_SERVING_TOKEN"
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"
KSERVE_GROUP = "serving.kserve.io"
KSERVE_PLURAL = "inferenceservices"
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 40  # leaves room for the ReplicaSet's and pods' suffixes

#: Where a replica finds its certificate and key (``tls_secret``'s tls.crt and tls.key).
TLS_DIR = "/etc/gpulab/tls"

_READY_PROBE = (
    "import os, urllib.request as u; u.urlopen(u.Request("
    "'http://127.0.0.1:{port}/v2/health/ready', headers={{'Authorization': "
    "'Bearer ' + os.environ['" + TOKEN_ENV + "']}}), timeout=3)"
)
_READY_PROBE_TLS = (
    "import os, ssl, urllib.request as u; u.urlopen(u.Request("
    "'https://127.0.0.1:{port}/v2/health/ready', headers={{'Authorization': "
    "'Bearer ' + os.environ['" + TOKEN_ENV + "']}}), timeout=3, "
    "context=ssl._create_unverified_context())"
)


def endpoint_name(name: str) -> str:
    """The Kubernetes name of endpoint ``name``: ``gpulab-ep-<name>``."""
    full = f"gpulab-ep-{name}"
    if not isinstance(name, str) or not _NAME.match(name) or len(full) > MAX_NAME:
        raise SpecError(
            f"endpoint name {name!r}: use 1-{MAX_NAME - 10} lowercase letters, "
            "digits and '-', starting with a letter"
        )
    return full


def _check(
    model_dir: str,
    models_root: str,
    replicas: int,
    port: int,
    max_batch_size: int,
    max_latency_ms: float,
    max_queue: int,
) -> None:
    if not models_root.startswith("/") or not (model_dir.rstrip("/") + "/").startswith(
        models_root.rstrip("/") + "/"
    ):
        raise SpecError(
            f"model_dir {model_dir!r} must lie on the models volume, under "
            f"{models_root!r}: export the model there first"
        )
    for what, v, lo, hi in (
        ("replicas", replicas, 0, 100),
        ("port", port, 1, 65535),
        ("max_batch_size", max_batch_size, 1, 4096),
        ("max_queue", max_queue, 1, 10**6),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise SpecError(f"{what!r} must be an integer from {lo} to {hi}, got {v!r}")
    if (
        isinstance(max_latency_ms, bool)
        or not isinstance(max_latency_ms, (int, float))
        or max_latency_ms < 0
    ):
        raise SpecError(f"'max_latency_ms' must be milliseconds >= 0, got {max_latency_ms!r}")


def server_container(
    *,
    image: str,
    model_dir: str,
    port: int,
    max_batch_size: int,
    max_latency_ms: float,
    max_queue: int,
    token_secret: str,
    container_name: str = "server",
    tls_secret: str = "",
) -> dict:
    if not image:
        raise SpecError("'image' is required: a container image with gpulab and torch installed")
    command = [
        "python",
        "-m",
        "gpulab.serving.server",
        "--model-dir",
        model_dir,
        "--ip",
        "0.0.0.0",
        "--port",
        str(port),
        "--max-batch-size",
        str(max_batch_size),
        "--max-latency-ms",
        str(max_latency_ms),
        "--max-queue",
        str(max_queue),
    ]
    scheme = "HTTPS" if tls_secret else "HTTP"
    if tls_secret:
        command += [
            "--ssl-certfile",
            f"{TLS_DIR}/tls.crt",
            "--ssl-keyfile",
            f"{TLS_DIR}/tls.key",
        ]
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if token_secret:
        env.append(
            {
                "name": TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": token_secret, "key": "token"}},
            }
        )
        probe = _READY_PROBE_TLS if tls_secret else _READY_PROBE
        ready = {"exec": {"command": ["python", "-c", probe.format(port=port)]}}
    else:
        ready = {"httpGet": _http_get("/v2/health/ready", port, scheme)}
    container = {
        "name": container_name,
        "image": image,
        "command": [c.replace("$", "$$") for c in command],
        "env": env,
        "ports": [{"name": scheme.lower(), "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {**ready, "periodSeconds": 5, "timeoutSeconds": 4},
        # Loading a large model takes a while; until then only the startup probe runs.
        "startupProbe": {
            "httpGet": _http_get("/v2/health/live", port, scheme),
            "periodSeconds": 2,
            "failureThreshold": 300,
        },
        "livenessProbe": {
            "httpGet": _http_get("/v2/health/live", port, scheme),
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
    }
    return container


def _http_get(path: str, port: int, scheme: str) -> dict:
    # HTTP is the probes' default scheme: left out, so plain replicas' objects stay as they were.
    return {"path": path, "port": port, **({"scheme": scheme} if scheme != "HTTP" else {})}


def _pod(
    name,
    *,
    image,
    model_dir,
    models_root,
    models_pvc,
    port,
    max_batch_size,
    max_latency_ms,
    max_queue,
    token_secret,
    labels,
    priority_class,
    pod_patch,
    container_name="server",
    tls_secret="",
    security: PodSecurity = DEFAULT_POD_SECURITY,
) -> dict:
    container = server_container(
        image=image,
        model_dir=model_dir,
        port=port,
        max_batch_size=max_batch_size,
        max_latency_ms=max_latency_ms,
        max_queue=max_queue,
        token_secret=token_secret,
        container_name=container_name,
        tls_secret=tls_secret,
    )
    # Only this endpoint's model directory, at the path the service wrote it to:
    # the claim holds every endpoint's model (and the service's files), which a
    # replica running users' code has no business reading.
    container["volumeMounts"] = [
        {
            "name": "models",
            "mountPath": model_dir,
            "readOnly": True,
            "subPath": os.path.relpath(model_dir, models_root),
        }
    ]
    volumes = [
        {"name": "models", "persistentVolumeClaim": {"claimName": models_pvc, "readOnly": True}}
    ]
    if tls_secret:
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        # Read-only for every uid: the image picks the server's uid, and only it runs here.
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o444}})
    spec = {
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    security.apply(spec)  # a fixed non-root uid, no capabilities, whatever the image says
    # The user is named on the Deployment: enforcement drops gpulab.io/ annotations from pods.
    template = {"metadata": {"labels": labels}, "spec": spec}
    return pod_patch(template) if pod_patch is not None else template


def _labels(name: str, extra: dict | None) -> dict:
    return {
        **COMMON_LABELS,
        "app.kubernetes.io/component": "endpoint",
        ENDPOINT_LABEL: name,
        **(extra or {}),
    }


def _checked_pod(name: str, *, replicas: int, labels: dict | None, **pod) -> tuple:
    """``(full name, labels, pod template)`` of endpoint ``name``, its settings
    checked first: what a Deployment and an InferenceService share."""
    _check(
        pod["model_dir"],
        pod["models_root"],
        replicas,
        pod["port"],
        pod["max_batch_size"],
        pod["max_latency_ms"],
        pod["max_queue"],
    )
    if not pod["models_pvc"]:
        raise SpecError("models_pvc must name the PersistentVolumeClaim holding the model")
    lab = _labels(name, labels)
    return endpoint_name(name), lab, _pod(name, labels=lab, **pod)


def make_deployment(
    name: str,
    *,
    image: str,
    model_dir: str,
    models_pvc: str,
    models_root: str,
    user: str,
    replicas: int = 1,
    max_batch_size: int = 32,
    max_latency_ms: float = 5.0,
    max_queue: int = 256,
    port: int = 8080,
    token_secret: str = "",
    labels: dict | None = None,
    priority_class: str = "",
    pod_patch: Callable[[dict], dict] | None = None,
    tls_secret: str = "",
    security: PodSecurity = DEFAULT_POD_SECURITY,
) -> list[dict]:
    """``[Deployment, Service]`` of endpoint ``name`` (create in this order).

    ``models_pvc`` holds ``models_root``, under which ``model_dir`` lies;
    ``token_secret`` names a Secret whose ``token`` key the server demands;
    ``tls_secret`` a ``kubernetes.io/tls`` Secret: the server then serves https and
    the Service listens on 443 (:func:`service_port`); ``security`` who the replicas'
    code runs as.
    """
    full, lab, template = _checked_pod(
        name,
        replicas=replicas,
        labels=labels,
        image=image,
        model_dir=model_dir,
        models_root=models_root,
        models_pvc=models_pvc,
        port=port,
        max_batch_size=max_batch_size,
        max_latency_ms=max_latency_ms,
        max_queue=max_queue,
        token_secret=token_secret,
        priority_class=priority_class,
        pod_patch=pod_patch,
        tls_secret=tls_secret,
        security=security,
    )
    meta = {"name": full, "labels": lab, "annotations": {USER_ANNOTATION: user}}
    port_name = "https" if tls_secret else "http"
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {ENDPOINT_LABEL: name}},
            "template": template,
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": full, "labels": lab},
        "spec": {
            "selector": {ENDPOINT_LABEL: name},
            "ports": [
                {
                    "name": port_name,
                    "port": service_port(tls_secret),
                    "targetPort": port_name,
                    "protocol": "TCP",
                }
            ],
        },
    }
    return [deployment, service]


def service_port(tls: bool | str) -> int:
    """The port of an endpoint's Service: 443 when its replicas serve https, else 80."""
    return 443 if tls else 80


def make_inference_service(
    name: str,
    *,
    image: str,
    model_dir: str,
    models_pvc: str,
    models_root: str,
    user: str,
    replicas: int = 1,
    max_replicas: int | None = None,
    max_batch_size: int = 32,
    max_latency_ms: float = 5.0,
    max_queue: int = 256,
    port: int = 8080,
    token_secret: str = "",
    labels: dict | None = None,
    priority_class: str = "",
    pod_patch: Callable[[dict], dict] | None = None,
    security: PodSecurity = DEFAULT_POD_SECURITY,
) -> dict:
    """A KServe InferenceService whose predictor is a custom container running our server.

    KServe's predictor is a pod spec with a few fields of its own
    (``minReplicas``, ``maxReplicas``, ``labels``, ``annotations`` for its pods);
    ``pod_patch`` works on a pod template made from it and is folded back.
    """
    full, lab, template = _checked_pod(
        name,
        replicas=replicas,
        labels=labels,
        image=image,
        model_dir=model_dir,
        models_root=models_root,
        models_pvc=models_pvc,
        port=port,
        max_batch_size=max_batch_size,
        max_latency_ms=max_latency_ms,
        max_queue=max_queue,
        token_secret=token_secret,
        priority_class=priority_class,
        pod_patch=pod_patch,
        container_name="kserve-container",
        security=security,
    )
    top = max_replicas if max_replicas is not None else replicas
    if isinstance(top, bool) or not isinstance(top, int) or top < replicas:
        raise SpecError(f"'max_replicas' must be an integer >= replicas ({replicas}), got {top!r}")
    # KServe routes to the one container port; it must not carry a name other than h2c/http1.
    template["spec"]["containers"][0]["ports"] = [{"containerPort": port, "protocol": "TCP"}]
    predictor = {
        "minReplicas": replicas,
        "maxReplicas": top,
        **{k: v for k, v in template["metadata"].items() if k in ("labels", "annotations") and v},
        **template["spec"],
    }
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": {"name": full, "labels": lab, "annotations": {USER_ANNOTATION: user}},
        "spec": {"predictor": predictor},
    }
