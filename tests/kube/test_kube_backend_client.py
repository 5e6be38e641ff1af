"""KubernetesBackend against a fake API server: what it sends, and what it makes of the answers.

Only the Kubernetes API server is faked (``fake_apiserver``: real HTTP, the
real ``kubernetes_asyncio`` client); the objects sent are the real builders'
output and the slice comes from the real enforcement backend. The Job's
conditions are set by the test, standing in for the Job controller.
"""

import json

import pytest

from gpulab.backend.kubernetes import JobOptions, job_objects, make_jobset
from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, pod_slice_patch

NS = "gpulab"
JOBS = "/apis/batch/v1/namespaces/gpulab/jobs"
SERVICES = "/api/v1/namespaces/gpulab/services"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/gpulab/jobsets"


def quarter_for(spec, allocations):
    patch = pod_slice_patch("hami", GpuSlice.of(spec.gpu_milli * spec.nproc_per_node, 81920))
    return lambda template: apply_to_pod(template, patch)


def make_spec(**kw) -> JobSpec:
    s = JobSpec(
        code="print(1)",
        nodes=2,
        gpu_milli=250,
        image="registry.example/gpulab:1",
        id="f00dfeed0001",
        user="ann",
        max_restarts=2,
        backend="kubernetes",
        **kw,
    )
    s.validate()
    return s


@pytest.fixture
def cluster(job_cluster):
    return lambda groups=("batch", "apps"): job_cluster(groups, pod_patch_for=quarter_for)


async def test_start_sends_the_builders_objects_in_order(cluster):
    server, backend = await cluster()
    spec = make_spec()
    await backend.start(spec, [])
    # The job's Secret and NetworkPolicy come first (tests/kube/test_kube_job_isolation.py).
    posts = [(p, b) for m, p, b in server.requests if m == "POST" and p in (SERVICES, JOBS)]
    expected = job_objects(
        spec,
        JobOptions(
            jobs_root=backend.jobs_root, jobs_pvc="gpulab-jobs", pod_patch=quarter_for(spec, [])
        ),
    )
    # The Service first, so index 0's name resolves by the time any pod starts.
    assert posts == [(SERVICES, expected[0]), (JOBS, expected[1])]
    limits = posts[1][1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1 and limits["nvidia.com/gpumem"] == 20480
    launch = json.load(open(backend.jobdir(spec.id).p("launch.json")))
    assert (launch["kind"], launch["name"], launch["namespace"]) == (
        "Job",
        "gpulab-f00dfeed0001",
        NS,
    )
    # Started twice (a service crash between create and launch.json): no error.
    await backend.start(spec, [])


async def test_poll_follows_the_job_conditions(cluster):
    server, backend = await cluster()
    spec = make_spec()
    await backend.start(spec, [])
    name = "gpulab-f00dfeed0001"
    assert (await backend.poll(spec)).state == "running"
    assert await backend.reattach(spec) is True

    server.set_status(JOBS, name, {"active": 2, "failed": 1})
    status = await backend.poll(spec)
    assert (status.state, status.restarts) == ("running", 1)

    server.set_status(
        JOBS, name, {"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]}
    )
    assert (await backend.poll(spec)).state == "succeeded"
    assert await backend.reattach(spec) is False
    # It reads the Job itself: the chart's Role grants jobs, not jobs/status.
    assert not any(path.endswith("/status") for _, path, _ in server.requests)


async def test_a_failed_job_names_the_rank_that_failed(cluster):
    server, backend = await cluster()
    spec = make_spec()
    jd = backend.jobdir(spec.id)
    jd.write_inputs(spec)  # as the service does at submit
    await backend.start(spec, [])
    server.set_status(
        JOBS,
        "gpulab-f00dfeed0001",
        {
            "failed": 3,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "FailedIndexes",
                    "message": "Job has failed indexes",
                }
            ],
        },
    )
    status = await backend.poll(spec)
    assert status.state == "failed" and "FailedIndexes" in status.message

    # What the ranks wrote on the job volume is the root cause.
    with open(jd.p("errors", "rank1.json"), "w") as f:
        json.dump(
            {
                "rank": 1,
                "type": "ValueError",
                "message": "bad batch shape",
                "traceback": "...",
                "time": 1.0,
                "restart": 0,
            },
            f,
        )
    status = await backend.poll(spec)
    assert status.message == "rank 1 failed: ValueError: bad batch shape"
    assert status.error["rank"] == 1


async def test_cancel_deletes_in_the_foreground_and_waits(cluster):
    server, backend = await cluster()
    spec = make_spec()
    await backend.start(spec, [])
    await backend.cancel(spec)
    deletes = {path: body for method, path, body in server.requests if method == "DELETE"}
    assert deletes[f"{JOBS}/gpulab-f00dfeed0001"]["propagationPolicy"] == "Foreground"
    assert f"{SERVICES}/gpulab-f00dfeed0001" in deletes
    assert server.get(JOBS, "gpulab-f00dfeed0001") is None
    status = await backend.poll(spec)
    assert status.state == "failed" and "is gone" in status.message
    await backend.cancel(spec)  # cancelling what is gone is fine


async def test_jobset_when_the_crd_is_installed(cluster):
    server, backend = await cluster(groups=("batch", "apps", "jobset.x-k8s.io"))
    spec = make_spec()
    await backend.start(spec, [])
    posts = [(p, b) for m, p, b in server.requests if m == "POST" and p == JOBSETS]
    expected = make_jobset(
        spec,
        JobOptions(
            jobs_root=backend.jobs_root, jobs_pvc="gpulab-jobs", pod_patch=quarter_for(spec, [])
        ),
    )
    assert posts == [(JOBSETS, expected)]
    name = "gpulab-f00dfeed0001"
    assert (await backend.poll(spec)).state == "running"
    server.set_status(
        JOBSETS, name, {"restarts": 1, "conditions": [{"type": "Completed", "status": "True"}]}
    )
    status = await backend.poll(spec)
    assert (status.state, status.restarts) == ("succeeded", 1)
    await backend.cancel(spec)
    deletes = {path: body for method, path, body in server.requests if method == "DELETE"}
    assert deletes[f"{JOBSETS}/{name}"]["propagationPolicy"] == "Foreground"


@pytest.mark.parametrize(
    "groups, collection, lie",
    [(("batch", "apps"), JOBS, "JobSet"), (("batch", "apps", "jobset.x-k8s.io"), JOBSETS, "Job")],
)
async def test_a_kind_rewritten_in_launch_json_is_not_believed(cluster, groups, collection, lie):
    """launch.json is in the folder the job's pods write: a pod that wrote another
    kind there made poll look for that kind, find none and call the job gone (its
    GPUs given back while it ran on), and made cancel delete nothing."""
    server, backend = await cluster(groups=groups)
    spec = make_spec()
    await backend.start(spec, [])
    name = "gpulab-f00dfeed0001"
    assert server.get(collection, name) is not None
    backend.jobdir(spec.id).write_json("launch.json", {"kind": lie})  # as a pod may
    status = await backend.poll(spec)
    assert status.state == "running" and status.details["kind"] != lie
    await backend.cancel(spec)
    assert server.get(collection, name) is None
    status = await backend.poll(spec)
    assert status.state == "failed" and "is gone" in status.message


async def test_check_refuses_what_the_cluster_cannot_run(cluster):
    _, backend = await cluster()
    with pytest.raises(SpecError, match="'image' is required"):
        backend.check(JobSpec(code="x", id="abc", backend="kubernetes"))
    with pytest.raises(SpecError, match="bf16 needs NCCL"):
        backend.check(JobSpec(code="x", id="abc", image="i", comm_hook="bf16"))
    with pytest.raises(SpecError, match="same path"):
        KubernetesBackend("/a", namespace=NS, options=JobOptions(jobs_root="/b", jobs_pvc="p"))
