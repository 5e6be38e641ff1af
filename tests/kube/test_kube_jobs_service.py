"""The service's Kubernetes job backend as ``c.GpuLabService.kubernetes_jobs`` builds it:
the ledger's slice reaches every node's pod through the chosen enforcement backend,
Kueue labels through the queue settings, and bad settings say what is wrong.
No cluster is contacted: ``objects()`` is the pure part of ``start()``.
"""

import pytest
from kube_helpers import validate_strict
from support.plugin_host import kubernetes_backend

from gpulab.backend.spec import JobSpec, SpecError
from gpulab.scheduler.inventory import Gpu
from gpulab.service.plugins import ConfigError

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
    with pytest.raises(ConfigError, match="need 'jobs_pvc'"):
        kubernetes_backend({"namespace": "ml"}, JOBS, GPUS)
    with pytest.raises(ConfigError, match="unknown key"):
        kubernetes_backend({"namespace": "ml", "jobs_pvc": "x", "colour": 1}, JOBS, GPUS)
    with pytest.raises(Exception, match="unknown enforcement backend"):
        kubernetes_backend({"namespace": "ml", "jobs_pvc": "x", "enforcement": "magic"}, JOBS, GPUS)


def job_of(backend, jobset=False, **kw):
    """The Job (or JobSet) of a job spec ``kw``, and its pod template."""
    s = spec(**kw)
    backend.check(s)
    objects = backend.objects(s, rows(s), jobset=jobset)
    if jobset:
        [obj] = objects
        return obj, obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    validate_strict(objects[-1])
    return objects[-1], objects[-1]["spec"]["template"]


KUEUE = {
    "namespace": "ml",
    "jobs_pvc": "gpulab-jobs",
    "queue": "research",
    "priority_class_prefix": "gpulab-",
}


@pytest.mark.parametrize("jobset", [False, True], ids=["job", "jobset"])
def test_a_job_gets_its_own_class(jobset):
    """--priority-class batch-high: the pods' PriorityClass and Kueue's class are its own."""
    backend = kubernetes_backend(KUEUE, JOBS, GPUS)
    job, pod = job_of(backend, jobset, priority_class="batch-high")
    assert pod["spec"]["priorityClassName"] == "gpulab-batch-high"
    # Kueue reads the Job's (JobSet's) labels; its pods carry none of Kueue's.
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "gpulab-batch-high"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert not [k for k in pod["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]
    # The next job, of the default class, is not touched by the first.
    job, pod = job_of(backend, jobset)
    assert pod["spec"]["priorityClassName"] == "gpulab-batch"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "gpulab-batch"


def test_fixed_classes_win_over_the_jobs_own():
    """priority_class / priority (the settings of before) name one class for every job."""
    backend = kubernetes_backend(
        {**KUEUE, "priority_class": "batch-low", "priority": "gpulab-low"}, JOBS, GPUS
    )
    job, pod = job_of(backend, priority_class="batch-high")
    assert pod["spec"]["priorityClassName"] == "batch-low"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "gpulab-low"
    # Only the PriorityClass fixed: Kueue still gets the job's own class.
    backend = kubernetes_backend({**KUEUE, "priority_class": "batch-low"}, JOBS, GPUS)
    job, pod = job_of(backend, priority_class="batch-high")
    assert pod["spec"]["priorityClassName"] == "batch-low"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "gpulab-batch-high"


def test_without_a_prefix_or_a_queue():
    """No prefix (the cluster has no gpulab-<class>): nothing named, as before."""
    backend = kubernetes_backend({"namespace": "ml", "jobs_pvc": "gpulab-jobs"}, JOBS, GPUS)
    job, pod = job_of(backend, priority_class="batch-high")
    assert "priorityClassName" not in pod["spec"]
    assert not [k for k in job["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]
    # A prefix without Kueue: the PriorityClass only (the kube-scheduler preempts by it).
    backend = kubernetes_backend({**KUEUE, "queue": ""}, JOBS, GPUS)
    job, pod = job_of(backend, priority_class="batch-high")
    assert pod["spec"]["priorityClassName"] == "gpulab-batch-high"
    assert not [k for k in job["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]


@pytest.mark.parametrize("preemptible,label", [(True, "preemptible"), (False, "non-preemptible")])
def test_kai_is_told_whether_a_job_may_be_preempted(preemptible, label):
    """KAI takes a PriorityClass value >= 100 as non-preemptible unless its label says."""
    backend = kubernetes_backend(
        {**KUEUE, "queue": "", "enforcement": "kai", "enforcement_options": {"queue": "research"}},
        JOBS,
        GPUS,
    )
    _, pod = job_of(backend, preemptible=preemptible)
    assert pod["metadata"]["labels"]["kai.scheduler/preemptibility"] == label
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "research"  # the slice's patch
    # Other backends: no KAI label.
    _, pod = job_of(kubernetes_backend(KUEUE, JOBS, GPUS), preemptible=False)
    assert "kai.scheduler/preemptibility" not in pod["metadata"]["labels"]


def test_pods_get_the_grace_to_checkpoint():
    """terminationGracePeriodSeconds: the grace between SIGTERM (a checkpoint at the next
    step) and SIGKILL, whoever stops the pods."""
    backend = kubernetes_backend({**KUEUE, "termination_grace_seconds": 90.5}, JOBS, GPUS)
    _, pod = job_of(backend)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 91
    _, pod = job_of(kubernetes_backend(KUEUE, JOBS, GPUS))
    assert "terminationGracePeriodSeconds" not in pod["spec"]  # Kubernetes' 30 s
    with pytest.raises(ConfigError, match="termination_grace_seconds"):
        kubernetes_backend({**KUEUE, "termination_grace_seconds": -1}, JOBS, GPUS)


def test_the_grace_is_the_services_preemption_grace():
    from traitlets.config import Config

    c = Config()
    c.Host.preemption_grace_seconds = 120.0
    backend = kubernetes_backend(KUEUE, JOBS, GPUS, config=c)
    assert backend.options.termination_grace_seconds == 120
    c.KubernetesJobsSettings.termination_grace_seconds = 10.0
    backend = kubernetes_backend(KUEUE, JOBS, GPUS, config=c)
    assert backend.options.termination_grace_seconds == 10


def test_a_setting_of_the_backend_reaches_the_pods():
    """c.KubernetesJobsSettings.service_account (declared beside the code that reads it)."""
    from traitlets.config import Config

    c = Config()
    c.KubernetesJobsSettings.service_account = "reads-datasets"
    _, pod = job_of(kubernetes_backend(KUEUE, JOBS, GPUS, config=c))
    assert pod["spec"]["serviceAccountName"] == "reads-datasets"
    _, pod = job_of(kubernetes_backend(KUEUE, JOBS, GPUS))
    assert "serviceAccountName" not in pod["spec"]
