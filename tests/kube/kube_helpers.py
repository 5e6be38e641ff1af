"""Helpers for the Kubernetes tests: schema validation with kubernetes-validate, the
jobs the object tests build, and what their pods run."""

from __future__ import annotations

import subprocess

import kubernetes_validate
from kubernetes_validate.utils import all_versions, major_minor

from gpulab.backend.kubernetes import JobOptions
from gpulab.backend.kubernetes.pods import INDEX_ANNOTATION, NODE_WRAPPER
from gpulab.backend.spec import JobSpec
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, pod_slice_patch

# The two most recent Kubernetes versions this kubernetes-validate knows.
K8S_VERSIONS = sorted(
    {major_minor(v) for v in all_versions()}, key=lambda v: tuple(map(int, v.split(".")))
)[-2:]

#: Custom resources: no schema ships for them; their fields are checked by literal tests.
CRD_GROUPS = ("kueue.x-k8s.io/",)

#: Where the job builders are told the jobs' folders are (on claim ``gpulab-jobs``).
JOBS_ROOT = "/srv/gpulab/jobs"


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
                f"{version}: {e.message} at {'.'.join(map(str, e.absolute_path))}"
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


def spec(**kw) -> JobSpec:
    """A validated job: ``print('hi')`` on 2 nodes of 1 process, image
    ``registry.example/gpulab:1``, id a1b2c3d4e5f6 of ann@example.org, up to 3 restarts
    (``kw`` on top)."""
    fields = dict(
        code="print('hi')",
        nodes=2,
        nproc_per_node=1,
        image="registry.example/gpulab:1",
        id="a1b2c3d4e5f6",
        user="ann@example.org",
        max_restarts=3,
    )
    fields.update(kw)
    s = JobSpec(**fields)
    s.validate()
    return s


def options(**kw) -> JobOptions:
    """The job builders' options: jobs under :data:`JOBS_ROOT` on claim ``gpulab-jobs``."""
    return JobOptions(jobs_root=JOBS_ROOT, jobs_pvc="gpulab-jobs", **kw)


def quarter(backend: str = "hami"):
    """The caller's pod patch: a 1/4 H100 per pod, as the service builds it from the ledger."""
    patch = pod_slice_patch(backend, GpuSlice.of(250, 81920, "H100-80GB"))
    return lambda template: apply_to_pod(template, patch)


def container(obj: dict) -> dict:
    """The first container of a Job's (or Deployment's) pod template."""
    return obj["spec"]["template"]["spec"]["containers"][0]


def pod_view(job: dict, index: int, pod_ip: str = "10.0.0.9") -> tuple[dict, list[str]]:
    """(env, torchrun's argv) of the pod of completion index ``index``, after the
    kubelet's expansion and the node wrapper (run here for real)."""
    from kubelet_sim import container_argv, container_env

    c = container(job)
    # The Secrets the pod names (the job's, ``make_job_secret``), as the kubelet reads them.
    refs = [
        e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})
    ]
    secrets = {r["name"]: {r["key"]: "f" * 64} for r in refs}
    env = container_env(
        c, annotations={INDEX_ANNOTATION: str(index)}, pod_ip=pod_ip, secrets=secrets
    )
    argv = container_argv(c, env)
    assert argv[:4] == ["/bin/sh", "-c", NODE_WRAPPER, "gpulab-node"]
    out = subprocess.run(
        ["/bin/sh", "-c", NODE_WRAPPER, "gpulab-node", "printf", "%s\\n", *argv[4:]],
        env={"PET_NODE_RANK": env["PET_NODE_RANK"]},
        capture_output=True,
        text=True,
        check=True,
    )
    return env, out.stdout.splitlines()
