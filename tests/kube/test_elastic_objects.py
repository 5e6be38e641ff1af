"""Elastic jobs (``--nodes MIN:MAX``) on Kubernetes: their objects, and the backend's resize.

No Kubernetes API server runs here, so none is contacted: the objects are checked
offline, as in ``test_kube_backend_objects`` (``kubernetes-validate --strict`` for
the Job, the JobSet's own fields against ``crd_schemas``), and ``resize`` talks to
the fake API server (``fake_apiserver``: real HTTP and the real
``kubernetes_asyncio`` client, but no controllers, admission webhooks or
validation). What those would do is played by the tests where it matters: Kueue's
webhook adding its scheduling gate, JobSet's webhook refusing a change when its
ElasticJobSet gate is off.
"""

import functools
import json
import os

import jsonschema
import pytest
from crd_schemas import JOBSET
from fake_apiserver import FakeApiServer, status_response
from kube_helpers import (
    JOBS_ROOT,
    K8S_VERSIONS,
    container,
    options,
    pod_view,
    quarter,
    validate_strict,
)
from kube_helpers import spec as base_spec

from gpulab.backend.kubernetes import job_objects, make_job, make_jobset
from gpulab.backend.kubernetes.job import (
    ELASTIC_RDZV_CONF,
    KUEUE_ELASTIC_ANNOTATION,
    KUEUE_ELASTIC_GATE,
)
from gpulab.backend.spec import JobSpec, SpecError
from gpulab.enforcement.kube.kueue import queue_patch

NS = "gpulab"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
JOBSETS = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NS}/jobsets"
NAME = "gpulab-e1a5e1a5e1a5"
CONF = ",".join(f"{k}={v}" for k, v in ELASTIC_RDZV_CONF.items())


def spec(**kw) -> JobSpec:
    """Elastic 1:4, running on 2 nodes now (unless ``kw`` says otherwise)."""
    elastic = dict(min_nodes=1, max_nodes=4, id="e1a5e1a5e1a5", user="ann", backend="kubernetes")
    return base_spec(**{**elastic, **kw})


def as_job(js: dict) -> dict:
    """The JobSet's replicated Job as a Job, for kubernetes-validate."""
    [rjob] = js["spec"]["replicatedJobs"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": js["metadata"]["name"], **rjob["template"]["metadata"]},
        "spec": rjob["template"]["spec"],
    }


# -- the objects ---------------------------------------------------------------------
CASES = {
    "cpu": (spec(), options()),
    "quarter-hami-kueue-grace": (
        spec(gpu_milli=250, timeout=3600),
        options(
            pod_patch=quarter("hami"),
            labels=queue_patch("job", "team-a", "gpulab-batch")["labels"],
            termination_grace_seconds=120,
        ),
    ),
    "whole-gpus-at-max": (
        spec(gpu_milli=1000, nproc_per_node=2, nodes=4),
        options(ttl_seconds_after_finished=None),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_elastic_objects_validate_strict(case):
    s, o = CASES[case]
    for obj in job_objects(s, o):
        assert validate_strict(obj) == K8S_VERSIONS
    js = make_jobset(s, o)
    jsonschema.validate(js, JOBSET)
    assert validate_strict(as_job(js)) == K8S_VERSIONS


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_the_size_now_is_completions_and_parallelism(nodes):
    s = spec(nodes=nodes)
    job = make_job(s, options())["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"]) == (
        "Indexed",
        nodes,
        nodes,
    )
    [rjob] = make_jobset(s, options())["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 1
    assert rjob["template"]["spec"]["completions"] == nodes
    assert rjob["template"]["spec"]["parallelism"] == nodes


def test_every_pod_runs_torchrun_on_the_range():
    """Index 0 (hosting the store) and an index a growth adds (3, above the size now)
    both take 1:4 nodes, at index 0's rendezvous, with the quick rounds."""
    s = spec()
    job = make_job(s, options())
    for index in (0, 1, 3):
        env, argv = pod_view(job, index, pod_ip="10.0.0.7")
        assert "--nnodes=1:4" in argv and not any(a == "--nnodes=2" for a in argv)
        assert f"--rdzv-conf=is_host={int(index == 0)},timeout=120,{CONF}" in argv
        assert "--rdzv-backend=gpulab" in argv
        assert f"--rdzv-endpoint={NAME}-0.{NAME}:29400" in argv
        assert f"--log-dir={JOBS_ROOT}/{s.id}/torchrun/node{index}" in argv
        assert env["PET_NNODES"] == "1:4" and env["PET_NODE_RANK"] == str(index)
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    js = make_jobset(s, options())
    _, argv = pod_view(as_job(js), 2, pod_ip="10.0.0.7")
    assert "--nnodes=1:4" in argv and f"--rdzv-conf=is_host=0,timeout=120,{CONF}" in argv
    assert f"--rdzv-endpoint={NAME}-node-0-0.{NAME}:29400" in argv


def test_a_leaving_node_gets_the_grace_to_checkpoint():
    """The pods' grace, and torchrun's own wait after it passes SIGTERM on."""
    job = make_job(spec(), options(termination_grace_seconds=120))
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "120"
    # No grace set: Kubernetes' 30 s and torch's 30 s agree; nothing added.
    env = {e["name"] for e in container(make_job(spec(), options()))["env"]}
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in env


def test_kueue_takes_the_job_as_elastic_but_never_the_jobset():
    labels = queue_patch("job", "team-a")["labels"]
    job = make_job(spec(), options(labels=labels))
    assert job["metadata"]["annotations"][KUEUE_ELASTIC_ANNOTATION] == "true"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    # Partial admission and elastic jobs exclude each other in Kueue: never both.
    assert "kueue.x-k8s.io/job-min-parallelism" not in job["metadata"]["annotations"]
    js = make_jobset(spec(), options(labels=labels))
    assert KUEUE_ELASTIC_ANNOTATION not in js["metadata"]["annotations"]
    fixed = make_job(spec(min_nodes=0, max_nodes=0), options(labels=labels))
    assert KUEUE_ELASTIC_ANNOTATION not in fixed["metadata"]["annotations"]


@pytest.mark.parametrize("kw", [{}, {"gpu_milli": 250, "timeout": 600}])
def test_a_fixed_job_renders_as_before(kw):
    """No regression: the golden Job was rendered by the builders before elastic jobs
    (and rendered again when every job pod got its security contexts: a non-root
    uid, no capabilities); a range of one size (2:2) is a fixed job too."""
    with open(os.path.join(os.path.dirname(__file__), "golden", "job-fixed.json")) as f:
        golden = json.load(f)
    o = options(pod_patch=quarter("hami"), termination_grace_seconds=120)
    fixed = spec(min_nodes=0, max_nodes=0, **kw)
    key = "gpu" if kw else "cpu"
    assert make_job(fixed, o) == golden[key]["job"]
    assert make_jobset(fixed, o) == golden[key]["jobset"]
    pinned = spec(min_nodes=2, max_nodes=2, **kw)
    assert not pinned.elastic
    assert make_job(pinned, o) == golden[key]["job"]
    assert "--nnodes=2" in container(golden[key]["job"])["args"]


def test_the_builders_do_not_change_their_input():
    s = spec(gpu_milli=250)
    before = s.to_dict()
    o = options(pod_patch=quarter("mig"), termination_grace_seconds=60)
    assert make_job(s, o) == make_job(s, o)
    assert make_jobset(s, o) == make_jobset(s, o)
    assert s.to_dict() == before


# -- resize, against the fake API server -----------------------------------------------
class RefusingApiServer(FakeApiServer):
    """The fake API server, plus what it leaves out: a refusal of every PATCH under
    ``refuse`` (a collection path), as JobSet's webhook refuses one when its
    ElasticJobSet gate is off (or Kubernetes before 1.27 a Job's completions), and
    ``conflicts`` answers 409 (the object changed since it was read) before PATCHes
    go through."""

    refuse: str | None = None
    conflicts = 0

    async def _objects(self, request):
        path = "/" + request.match_info["path"]
        if request.method == "PATCH" and self.refuse and path.startswith(self.refuse):
            self.requests.append(("PATCH", path, await request.json()))
            return status_response(422, "Invalid", "spec.replicatedJobs: field is immutable")
        if request.method == "PATCH" and self.conflicts:
            self.conflicts -= 1
            self.requests.append(("PATCH", path, await request.json()))
            return status_response(409, "Conflict", "the object has been modified")
        return await super()._objects(request)


@pytest.fixture
def elastic_cluster(job_cluster):
    """``await make(groups, **settings)``: conftest's ``job_cluster``, on a
    :class:`RefusingApiServer`."""
    return functools.partial(job_cluster, server_class=RefusingApiServer)


def patches(server, collection):
    return [(p, b) for m, p, b in server.requests if m == "PATCH" and p.startswith(collection)]


async def test_resize_grows_the_job_with_one_merge_patch(elastic_cluster):
    """The API server is faked (none runs here): the test checks what is sent."""
    server, backend = await elastic_cluster()
    s = spec()
    await backend.start(s, [])
    before = server.get(JOBS, NAME)
    assert await backend.resize(s, 4, []) is True
    assert patches(server, JOBS) == [
        (f"{JOBS}/{NAME}", {"spec": {"completions": 4, "parallelism": 4}})
    ]
    after = server.get(JOBS, NAME)
    assert (after["spec"]["completions"], after["spec"]["parallelism"]) == (4, 4)
    # Nothing else changes: the pod template (immutable once running) stays as it was.
    assert after["spec"]["template"] == before["spec"]["template"]
    assert {**after["spec"], "completions": 2, "parallelism": 2} == before["spec"]
    # Asked again for the size it has: nothing to send.
    assert await backend.resize(s, 4, []) is True
    assert len(patches(server, JOBS)) == 1


async def test_a_shrink_is_a_relaunch_unless_turned_on(elastic_cluster):
    """The API server is faked (none runs here). A shrink in place would let the pods
    that stay complete the Job (their ranks stop with the leaving node's), so False."""
    server, backend = await elastic_cluster()
    s = spec(nodes=3)
    await backend.start(s, [])
    assert await backend.resize(s, 1, []) is False
    assert patches(server, JOBS) == []
    backend.shrink_in_place = True
    assert await backend.resize(s, 1, []) is True
    assert patches(server, JOBS) == [
        (f"{JOBS}/{NAME}", {"spec": {"completions": 1, "parallelism": 1}})
    ]


async def test_under_kueue_only_when_kueue_took_it_as_elastic(elastic_cluster):
    """The API server is faked (none runs here), and so is Kueue's webhook, which adds
    its scheduling gate to an elastic Job's template when ElasticJobsViaWorkloadSlices
    is on. Without the gate Kueue would evict the Job for its changed pod count."""
    server, backend = await elastic_cluster(queue="team-a")
    s = spec()
    await backend.start(s, [])
    job = server.get(JOBS, NAME)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["metadata"]["annotations"][KUEUE_ELASTIC_ANNOTATION] == "true"
    assert await backend.resize(s, 3, []) is False
    assert patches(server, JOBS) == []
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": KUEUE_ELASTIC_GATE}]
    assert await backend.resize(s, 3, []) is True
    assert patches(server, JOBS) == [
        (f"{JOBS}/{NAME}", {"spec": {"completions": 3, "parallelism": 3}})
    ]


async def test_resize_grows_a_jobsets_replicated_job(elastic_cluster):
    """The API server is faked (none runs here): the JobSet controller, which would
    pass the change on to its Job, is not; the test checks what is sent."""
    server, backend = await elastic_cluster(groups=("batch", "apps", "jobset.x-k8s.io"))
    s = spec()
    await backend.start(s, [])
    before = server.get(JOBSETS, NAME)
    assert await backend.resize(s, 3, []) is True
    [(path, body)] = patches(server, JOBSETS)
    assert path == f"{JOBSETS}/{NAME}"
    [rjob] = body["spec"]["replicatedJobs"]
    assert rjob["template"]["spec"]["completions"] == rjob["template"]["spec"]["parallelism"] == 3
    after = server.get(JOBSETS, NAME)
    want = json.loads(json.dumps(before["spec"]))
    want["replicatedJobs"][0]["template"]["spec"].update(completions=3, parallelism=3)
    assert after["spec"] == want  # the rest of the list sent back as it was
    jsonschema.validate({k: v for k, v in after.items() if k != "status"}, {**JOBSET})


async def test_a_jobset_that_cannot_resize_is_relaunched(elastic_cluster):
    """The API server is faked (none runs here), with JobSet's webhook refusing the
    change as it does without its ElasticJobSet gate (or before v0.12)."""
    server, backend = await elastic_cluster(groups=("batch", "apps", "jobset.x-k8s.io"))
    server.refuse = JOBSETS
    s = spec()
    await backend.start(s, [])
    assert await backend.resize(s, 3, []) is False
    assert len(patches(server, JOBSETS)) == 1
    assert (
        server.get(JOBSETS, NAME)["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
        == 2
    )


async def test_a_jobset_changed_meanwhile_is_read_again(elastic_cluster):
    """The API server is faked (none runs here): one 409, then the patch goes through;
    409s every time: relaunch."""
    server, backend = await elastic_cluster(groups=("batch", "apps", "jobset.x-k8s.io"))
    s = spec()
    await backend.start(s, [])
    server.conflicts = 1
    assert await backend.resize(s, 3, []) is True
    assert len(patches(server, JOBSETS)) == 2
    assert sum(1 for m, p, _ in server.requests if m == "GET" and p.startswith(JOBSETS)) >= 2
    server.conflicts = 3
    assert await backend.resize(s, 4, []) is False
    assert (
        server.get(JOBSETS, NAME)["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"]
        == 3
    )


async def test_a_cluster_that_refuses_the_change_relaunches(elastic_cluster):
    """The API server is faked (none runs here), refusing the Job's new completions as
    Kubernetes before 1.27 does."""
    server, backend = await elastic_cluster()
    server.refuse = JOBS
    s = spec()
    await backend.start(s, [])
    assert await backend.resize(s, 3, []) is False
    assert server.get(JOBS, NAME)["spec"]["completions"] == 2


async def test_a_jobset_in_a_kueue_queue_is_relaunched(elastic_cluster):
    """The API server is faked (none runs here). Kueue has no elastic JobSets."""
    server, backend = await elastic_cluster(
        groups=("batch", "apps", "jobset.x-k8s.io"), queue="team-a"
    )
    s = spec()
    await backend.start(s, [])
    assert await backend.resize(s, 3, []) is False
    assert patches(server, JOBSETS) == []


async def test_resize_refuses_a_size_outside_the_range(elastic_cluster):
    """The API server is faked (none runs here); nothing is sent."""
    server, backend = await elastic_cluster()
    s = spec()
    await backend.start(s, [])
    with pytest.raises(SpecError, match="range is 1:4"):
        await backend.resize(s, 5, [])
    fixed = spec(id="f1xedf1xed01", min_nodes=0, max_nodes=0)
    await backend.start(fixed, [])
    with pytest.raises(SpecError, match="range is 2:2"):
        await backend.resize(fixed, 3, [])
    assert patches(server, JOBS) == []
