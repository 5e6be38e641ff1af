"""KubernetesBackend against a fake API server: what it sends, and what it makes of the answers.

Only the Kubernetes API server is faked (``fake_apiserver``: real HTTP, the
real ``kubernetes_asyncio`` client); the objects sent are the real builders'
output and the slice comes from the real enforcement backend. The Job's
conditions are set by the test, standing in for the Job controller.
"""

import asyncio
import itertools
import json
import os

import pytest
from aiohttp import web
from fake_apiserver import FakeApiServer

from gpulab.backend.kubernetes import JobOptions, job_objects, make_jobset
from gpulab.backend.kubernetes import backend as backend_mod
from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.enforcement.kube import GpuSlice, apply_to_pod, pod_slice_patch

NS = "gpulab"
JOBS = "/apis/batch/v1/namespaces/gpulab/jobs"
SERVICES = "/api/v1/namespaces/gpulab/services"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/gpulab/jobsets"
SECRETS = "/api/v1/namespaces/gpulab/secrets"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/gpulab/networkpolicies"


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
    if os.geteuid() == 0:  # the pods write it as theirs (the folder was handed over)
        os.chown(jd.p("errors", "rank1.json"), backend.run_as_user, backend.run_as_group)
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


class CollectingApiServer(FakeApiServer):
    """Deletion as the API server and its garbage collector do it: each object created
    gets a uid of its own; a foreground delete marks the object (``deletionTimestamp``)
    and removes it ``linger`` seconds later, with the objects that name it as their
    owner; any other delete removes it at once, with them too."""

    linger = 0.0

    def __init__(self, groups):
        super().__init__(groups)
        self._uids = itertools.count(1)

    async def _objects(self, request):
        path = "/" + request.match_info["path"]
        if request.method == "POST":
            response = await super()._objects(request)
            if response.status != 201:
                return response
            obj = self.objects[f"{path}/{(await request.json())['metadata']['name']}"]
            obj["metadata"]["uid"] = f"uid-{next(self._uids)}"
            return web.json_response(obj, status=201)
        if request.method == "DELETE" and path in self.objects:
            body = await request.json() if request.can_read_body else None
            self.requests.append(("DELETE", path, body))
            obj = self.objects[path]
            if (body or {}).get("propagationPolicy") != "Foreground":
                self.collect(path)
            elif not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
                asyncio.get_running_loop().call_later(self.linger, self.collect, path)
            return web.json_response(obj)
        return await super()._objects(request)

    def collect(self, key: str) -> None:
        obj = self.objects.pop(key, None)
        if obj is None:
            return
        uid = obj["metadata"]["uid"]
        for other, o in list(self.objects.items()):
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or []):
                self.collect(other)


@pytest.fixture
def collecting(job_cluster):
    return lambda groups=("batch", "apps"): job_cluster(
        groups, CollectingApiServer, pod_patch_for=quarter_for
    )


def owner_uid(server, collection, name):
    return server.get(collection, name)["metadata"]["ownerReferences"][0]["uid"]


def assert_owned_by_the_new_run(server, collection, name, old_uid):
    """The run's Job (or JobSet) is a new one, and its Secret and NetworkPolicy (and a
    Job's Service) are there, owned by it."""
    new_uid = server.get(collection, name)["metadata"]["uid"]
    assert new_uid != old_uid
    assert "deletionTimestamp" not in server.get(collection, name)["metadata"]
    assert "status" not in server.get(collection, name)
    owned = [(SECRETS, "gpulab-f00dfeed0001-rdzv"), (POLICIES, name)]
    if collection == JOBS:
        owned.append((SERVICES, name))
    for where, what in owned:
        assert server.get(where, what) is not None, f"{where}/{what} is missing"
        assert owner_uid(server, where, what) == new_uid


@pytest.mark.parametrize(
    "groups, collection, finished",
    [
        (("batch", "apps"), JOBS, "Failed"),
        (("batch", "apps"), JOBS, "Complete"),
        (("batch", "apps", "jobset.x-k8s.io"), JOBSETS, "Failed"),
        (("batch", "apps", "jobset.x-k8s.io"), JOBSETS, "Completed"),
    ],
)
async def test_a_start_again_replaces_the_finished_run(collecting, groups, collection, finished):
    """An elastic job relaunched (a node failed, or it was resized) starts again under
    the same name while the earlier run's Job is still there, finished: the old one is
    deleted in the foreground and a new one made; with a 409 taken as "already there"
    the next poll saw the same failed Job, and each restart was burnt on it."""
    server, backend = await collecting(groups)
    spec = make_spec()
    await backend.start(spec, [])
    name = "gpulab-f00dfeed0001"
    assert server.get(SECRETS, "gpulab-f00dfeed0001-rdzv") is not None
    old_uid = server.get(collection, name)["metadata"]["uid"]
    server.set_status(collection, name, {"conditions": [{"type": finished, "status": "True"}]})
    backend.jobdir(spec.id).reset_run()  # as the relaunch does
    seen = len(server.requests)
    await backend.start(spec, [])
    after = [(m, p, b) for m, p, b in server.requests[seen:] if p.startswith(collection)]
    deleted = [
        i for i, (m, p, _) in enumerate(after) if m == "DELETE" and p == f"{collection}/{name}"
    ]
    created = [i for i, (m, p, _) in enumerate(after) if m == "POST" and p == collection]
    assert deleted and created and deleted[0] < created[0]
    assert after[deleted[0]][2]["propagationPolicy"] == "Foreground"
    assert_owned_by_the_new_run(server, collection, name, old_uid)
    assert (await backend.poll(spec)).state == "running"


async def test_a_start_after_a_cancel_still_deleting_waits_for_it(collecting):
    """A cancel whose foreground delete outlasted its wait, then a start: the old Job
    is waited for, then everything made again (not taken as there, then read as gone;
    nor a Secret made for the new run and collected with the old Job)."""
    server, backend = await collecting()
    server.linger = 0.5
    spec = make_spec()
    await backend.start(spec, [])
    name = "gpulab-f00dfeed0001"
    old_uid = server.get(JOBS, name)["metadata"]["uid"]
    await backend.cancel(spec, grace_s=0)
    assert server.get(JOBS, name)["metadata"].get("deletionTimestamp")
    backend.jobdir(spec.id).reset_run()
    await backend.start(spec, [])
    assert_owned_by_the_new_run(server, JOBS, name, old_uid)
    await asyncio.sleep(0.6)  # whatever the collector had left to do
    assert_owned_by_the_new_run(server, JOBS, name, old_uid)
    assert (await backend.poll(spec)).state == "running"


async def test_a_start_again_fails_clearly_when_the_old_run_stays(collecting, monkeypatch):
    server, backend = await collecting()
    server.linger = 30.0
    monkeypatch.setattr(backend_mod, "STALE_WAIT_S", 0.3)
    monkeypatch.setattr(backend_mod, "STALE_POLL_S", 0.05)
    spec = make_spec()
    await backend.start(spec, [])
    name = "gpulab-f00dfeed0001"
    server.set_status(JOBS, name, {"conditions": [{"type": "Failed", "status": "True"}]})
    with pytest.raises(RuntimeError, match="earlier run is still being deleted"):
        await backend.start(spec, [])


@pytest.mark.parametrize(
    "groups, collection",
    [(("batch", "apps"), JOBS), (("batch", "apps", "jobset.x-k8s.io"), JOBSETS)],
)
async def test_a_start_repeated_while_the_run_runs_keeps_it(collecting, groups, collection):
    """The service crashed between creating the Job and writing launch.json: started
    again, the running Job is this run, and stays."""
    server, backend = await collecting(groups)
    spec = make_spec()
    await backend.start(spec, [])
    name = "gpulab-f00dfeed0001"
    uid = server.get(collection, name)["metadata"]["uid"]
    server.set_status(collection, name, {"active": 2})
    backend.jobdir(spec.id).reset_run()
    seen = len(server.requests)
    await backend.start(spec, [])
    assert not [r for r in server.requests[seen:] if r[0] == "DELETE"]
    assert server.get(collection, name)["metadata"]["uid"] == uid
    assert owner_uid(server, SECRETS, "gpulab-f00dfeed0001-rdzv") == uid
    assert (await backend.poll(spec)).state == "running"


@pytest.mark.skipif(os.geteuid() != 0, reason="a service on a box runs as root")
async def test_a_root_service_hands_the_job_folder_to_the_pods_uid(cluster):
    """A service run as root (gpulab up on a box) writes the inputs 0600 as root; the
    pods, never root, read them once handed over, and write their own folders."""
    server, backend = await cluster()
    spec = make_spec()
    jd = backend.jobdir(spec.id)
    jd.write_inputs(spec)
    await backend.start(spec, [])
    uid, gid = backend.run_as_user, backend.run_as_group
    for sub in ("logs", "errors", "checkpoints"):
        st = os.lstat(jd.p(sub))
        assert (st.st_uid, st.st_gid) == (uid, gid), sub
    st = os.lstat(jd.p("cell.py"))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, gid, 0o640)
    st = os.lstat(jd.path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, gid, 0o750)
