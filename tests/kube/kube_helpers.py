"""Helpers for the Kubernetes tests: schema validation with kubernetes-validate."""

from __future__ import annotations

import kubernetes_validate
from kubernetes_validate.utils import all_versions, major_minor

# The two most recent Kubernetes versions this kubernetes-validate knows.
K8S_VERSIONS = sorted(
    {major_minor(v) for v in all_versions()}, key=lambda v: tuple(map(int, v.split(".")))
)[-2:]

#: Custom resources: no schema ships for them; their fields are checked by literal tests.
CRD_GROUPS = ("kueue.x-k8s.io/",)


def validate_strict(obj: dict) -> list[str]:
    """Validate ``obj`` with ``--strict`` for each of :data:`K8S_VERSIONS`; the versions used."""
    used = []
    for version in K8S_VERSIONS:
        try:
            used.append(kubernetes_validate.validate(obj, version, strict=True))
        except kubernetes_validate.ValidationError as e:
            name = (obj.get("metadata") or {}).get("name")
            raise AssertionError(
                f"{obj.get('kind')}/{name} is invalid for Kubernetes "
                f"{version}: {e.caught.message} at "
                f"{'.'.join(map(str, e.caught.absolute_path))}"
            ) from None
    return used


def endpoint_unit(**fields) -> dict:
    """A unit as the deployment manager hands it to a serving backend: endpoint
    "resnet" of ann, a quarter GPU per replica (``fields`` on top)."""
    return {
        "user": "ann",
        "name": "resnet",
        "gpu_milli": 250,
        "max_batch_size": 16,
        "max_latency_ms": 4.0,
        "max_queue": 128,
        "state": "starting",
        "message": "",
        "restarts": 0,
        **fields,
    }


def serving_on(server, tmp_path, **settings):
    """Kubernetes serving (namespace ``gpulab``, models on claim ``gpulab-models``, image
    ``registry.example/gpulab:1``) talking to the fake API ``server``."""
    from gpulab.backend.kubernetes.serving import KubernetesServing

    return KubernetesServing(
        str(tmp_path / "deployments"),
        namespace="gpulab",
        models_pvc="gpulab-models",
        image="registry.example/gpulab:1",
        kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"),
        **settings,
    )
