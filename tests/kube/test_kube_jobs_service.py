"""The service's Kubernetes job backend as ``c.GpuLabService.kubernetes_jobs`` builds it:
the ledger's slice reaches every node's pod through the chosen enforcement backend,
Kueue labels through the queue settings, and bad settings say what is wrong.
No cluster is contacted: ``objects()`` is the pure part of ``start()``.
"""

import pytest
from kube_helpers import validate_strict

from gpulab.backend.spec import JobSpec, SpecError
from gpulab.scheduler.inventory import Gpu
from gpulab.service.kube_jobs import kubernetes_backend

JOBS = "/srv/gpulab/jobs"
GPUS = [
    Gpu(uuid=f"GPU-{i}", index=i, model="H100-80GB", memory_mib=81920, node="gpu-1")
    for i in range(2)
]


def spec(**kw) -> JobSpec:
    fields = dict(
        code="print('hi')",
        nodes=2,
        nproc_per_node=1,
        gpu_milli=250,
        image="registry.example/gpulab:1",
        id="f00dfeedbeef",
        user="ann",
        backend="kubernetes",
    )
    fields.update(kw)
    s = JobSpec(**fields)
    s.validate()
    return s


def rows(s: JobSpec):
    return [
        {"owner": f"{s.id}/{r}", "gpu_uuid": "GPU-0", "memory_mib": 20480}
        for r in range(s.world_size)
    ]


@pytest.mark.parametrize(
    "enforcement,resource", [("hami", "nvidia.com/gpumem"), ("mig", "nvidia.com/mig-2g.20gb")]
)
def test_every_node_pod_holds_the_ledgers_slice(enforcement, resource):
    backend = kubernetes_backend(
        {
            "namespace": "ml",
            "jobs_pvc": "gpulab-jobs",
            "enforcement": enforcement,
            "queue": "research",
        },
        JOBS,
        GPUS,
    )
    s = spec()
    backend.check(s)
    service, job = backend.objects(s, rows(s), jobset=False)
    validate_strict(service)
    validate_strict(job)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert resource in limits, limits
    assert job["spec"]["completions"] == 2 and job["spec"]["completionMode"] == "Indexed"


def test_whole_gpus_per_node_and_refusals():
    backend = kubernetes_backend({"namespace": "ml", "jobs_pvc": "gpulab-jobs"}, JOBS, GPUS)
    s = spec(gpu_milli=1000, nproc_per_node=2, nodes=1)
    backend.check(s)
    [_, job] = backend.objects(s, rows(s), jobset=False)
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert str(limits["nvidia.com/gpu"]) == "2"  # both ranks' GPUs on the node's pod
    with pytest.raises(SpecError, match="--nproc-per-node 1"):
        backend.check(spec(gpu_milli=250, nproc_per_node=2))
    with pytest.raises(SpecError, match="needs 'jobs_pvc'"):
        kubernetes_backend({"namespace": "ml"}, JOBS, GPUS)
    with pytest.raises(SpecError, match="unknown key"):
        kubernetes_backend({"namespace": "ml", "jobs_pvc": "x", "colour": 1}, JOBS, GPUS)
    with pytest.raises(Exception, match="unknown enforcement backend"):
        kubernetes_backend({"namespace": "ml", "jobs_pvc": "x", "enforcement": "magic"}, JOBS, GPUS)
