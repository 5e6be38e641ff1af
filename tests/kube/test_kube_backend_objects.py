"""The Kubernetes backend's objects: what a platform engineer would check, offline.

Every object validates with ``kubernetes-validate --strict`` for the two most
recent Kubernetes versions it knows. JobSet and KServe's InferenceService are
custom resources kubernetes-validate has no schema for: their own fields are
checked against ``crd_schemas`` (written from the CRDs' documentation), and the
Job and pod templates inside them with kubernetes-validate, wrapped in a Job
or a Pod. The slices come from the real enforcement backends
(``gpulab.enforcement.kube``), composed here as the service composes them.
"""

import ast
import copy
import glob
import os
import subprocess

import jsonschema
import pytest
from crd_schemas import INFERENCE_SERVICE, JOBSET, KSERVE_COMPONENT_FIELDS
from kube_helpers import (
    JOBS_ROOT,
    K8S_VERSIONS,
    container,
    options,
    pod_view,
    quarter,
    spec,
    validate_strict,
)

import gpulab.backend.kubernetes as kube
from gpulab.backend.kubernetes import (
    JobOptions,
    job_objects,
    make_deployment,
    make_inference_service,
    make_job,
    make_jobset,
)
from gpulab.backend.kubernetes.job import rdzv_host
from gpulab.backend.kubernetes.jobset import jobset_rdzv_host
from gpulab.backend.kubernetes.pods import INDEX_ANNOTATION, NODE_WRAPPER
from gpulab.backend.spec import SpecError
from gpulab.enforcement.kube.kueue import queue_patch


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# -- schemas -------------------------------------------------------------------------
CASES = {
    "cpu": (spec(), options()),
    "quarter-hami-kueue": (
        spec(gpu_milli=250, timeout=3600),
        options(
            pod_patch=quarter("hami"),
            priority_class="gpulab-jobs",
            labels=queue_patch("job", "team-a", "low")["labels"],
        ),
    ),
    "quarter-mig-ckpt-pvc": (
        spec(gpu_milli=250, checkpoint_dir="/ckpt/a1b2c3d4e5f6"),
        options(pod_patch=quarter("mig"), checkpoint_pvc="gpulab-ckpt"),
    ),
    "whole-gpus": (
        spec(gpu_milli=2000, nproc_per_node=2, nodes=4),
        options(ttl_seconds_after_finished=None),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_job_objects_validate_strict(case):
    for obj in job_objects(*CASES[case]):
        assert validate_strict(obj) == K8S_VERSIONS


@pytest.mark.parametrize("case", CASES)
def test_jobset_validates_against_its_crd_and_core_schemas(case):
    js = make_jobset(*CASES[case])
    jsonschema.validate(js, JOBSET)
    for rjob in js["spec"]["replicatedJobs"]:
        as_job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": js["metadata"]["name"], **rjob["template"]["metadata"]},
            "spec": rjob["template"]["spec"],
        }
        assert validate_strict(as_job) == K8S_VERSIONS


ENDPOINT = dict(
    image="registry.example/gpulab:1",
    model_dir="/models/ann/mnist",
    models_pvc="gpulab-models",
    models_root="/models",
    user="ann@example.org",
    replicas=2,
    max_batch_size=16,
    max_latency_ms=2.5,
    max_queue=64,
)


@pytest.mark.parametrize("token_secret", ["", "gpulab-ep-mnist-token"])
@pytest.mark.parametrize("backend", [None, "hami", "mig"])
def test_endpoint_objects_validate_strict(token_secret, backend):
    patch = quarter(backend) if backend else None
    for obj in make_deployment("mnist", token_secret=token_secret, pod_patch=patch, **ENDPOINT):
        assert validate_strict(obj) == K8S_VERSIONS
    isvc = make_inference_service("mnist", token_secret=token_secret, pod_patch=patch, **ENDPOINT)
    jsonschema.validate(isvc, INFERENCE_SERVICE)
    pred = isvc["spec"]["predictor"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "predictor"},
        "spec": {k: v for k, v in pred.items() if k not in KSERVE_COMPONENT_FIELDS},
    }
    assert validate_strict(pod) == K8S_VERSIONS


# -- the Indexed Job -----------------------------------------------------------------
def test_indexed_job_shape_and_restarts():
    s = spec(nodes=3, max_restarts=4, timeout=600)
    service, job = job_objects(s, options())
    js = job["spec"]
    assert (js["completionMode"], js["completions"], js["parallelism"]) == ("Indexed", 3, 3)
    assert js["backoffLimitPerIndex"] == s.max_restarts == 4
    assert js["maxFailedIndexes"] == 0  # one index out of retries fails the job
    assert js["activeDeadlineSeconds"] == 600
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False  # user code gets no credentials
    assert job["metadata"]["annotations"]["gpulab.io/user"] == s.user
    # The headless Service gives every pod `<job>-<i>.<service>`, ready or not.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"]
    labels = js["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["port"] == 29400
    assert container(job)["ports"][0]["containerPort"] == 29400


def test_index_1_rendezvous_at_index_0s_hostname():
    s = spec()
    job = make_job(s, options())
    name = job["metadata"]["name"]
    assert rdzv_host(s) == f"{name}-0.{name}"
    views = {i: pod_view(job, i, pod_ip=f"10.0.0.{i + 10}") for i in (0, 1)}
    for i, (env, argv) in views.items():
        assert f"--rdzv-endpoint={name}-0.{name}:29400" in argv
        assert env["PET_RDZV_ENDPOINT"] == f"{name}-0.{name}:29400"
        assert env["PET_MASTER_ADDR"] == f"{name}-0.{name}"
        assert env["PET_NODE_RANK"] == str(i)
        assert f"--local-addr=10.0.0.{i + 10}" in argv
        assert f"--log-dir={JOBS_ROOT}/{s.id}/torchrun/node{i}" in argv
        assert argv[:3] == ["python", "-m", "gpulab.training.launch"] and argv[-3:] == [
            "--module",
            "gpulab.training.runner",
            f"{JOBS_ROOT}/{s.id}",
        ]
    # Only index 0 hosts the c10d store.
    assert "--rdzv-conf=is_host=1,timeout=120" in views[0][1]
    assert "--rdzv-conf=is_host=0,timeout=120" in views[1][1]
    assert views[0][1][1:] != views[1][1][1:]


def test_pod_template_names_no_node():
    c = container(make_job(spec(), options()))
    text = repr(c)
    assert "node0" not in text and "is_host=0" not in text
    assert "--log-dir=" + f"{JOBS_ROOT}/a1b2c3d4e5f6/torchrun/node$(PET_NODE_RANK)" in c["args"]


def test_node_wrapper_refuses_a_pod_without_an_index():
    r = subprocess.run(
        ["/bin/sh", "-c", NODE_WRAPPER, "gpulab-node", "true"],
        env={"PET_NODE_RANK": ""},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "Indexed Job" in r.stderr


def test_pet_variables_present():
    s = spec(nodes=2, nproc_per_node=4, max_restarts=2)
    env = env_of(container(make_job(s, options())))
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "4"
    assert env["PET_RDZV_BACKEND"] == "gpulab" and env["PET_RDZV_ID"] == s.id
    assert env["PET_MAX_RESTARTS"] == "2" and env["PET_MASTER_PORT"] == "29400"
    assert env["PET_NODE_RANK"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}
    }
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_user_env_is_literal_after_the_kubelet():
    job = make_job(spec(env={"GREETING": "cost $(HOME) and $5"}), options())
    env, _ = pod_view(job, 0)
    assert env["GREETING"] == "cost $(HOME) and $5"


def test_job_volume_and_checkpoints():
    s = spec()
    pod = make_job(s, options())["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "jobs", "persistentVolumeClaim": {"claimName": "gpulab-jobs"}}
    ]
    c = pod["containers"][0]
    # The job's own folder only: no other job's spec, checkpoints or outputs.
    assert c["volumeMounts"] == [
        {"name": "jobs", "mountPath": f"{JOBS_ROOT}/{s.id}", "subPath": s.id}
    ]
    assert env_of(c)["GPULAB_CHECKPOINT_DIR"] == f"{JOBS_ROOT}/{s.id}/checkpoints"
    assert c["workingDir"] == f"{JOBS_ROOT}/{s.id}"

    s = spec(checkpoint_dir="/ckpt/run1")
    c = container(make_job(s, options(checkpoint_pvc="gpulab-ckpt")))
    assert {"name": "checkpoints", "mountPath": "/ckpt/run1", "subPath": s.id} in c["volumeMounts"]
    assert env_of(c)["GPULAB_CHECKPOINT_DIR"] == "/ckpt/run1"
    with pytest.raises(SpecError, match="checkpoint_pvc"):
        make_job(s, options())


def test_each_job_mounts_only_its_own_folder_of_the_checkpoint_claim():
    """The whole checkpoint claim was mounted at every job's checkpoint dir: any job
    read and replaced the others' checkpoints (a checkpoint's metadata is a pickle)."""
    o = options(checkpoint_pvc="gpulab-ckpt")
    for job_id in ("a1b2c3d4e5f6", "0badc0ffee01"):
        s = spec(id=job_id)
        for obj in (make_job(s, o), make_jobset(s, o)["spec"]["replicatedJobs"][0]["template"]):
            [m] = [m for m in container(obj)["volumeMounts"] if m["name"] == "checkpoints"]
            assert m == {
                "name": "checkpoints",
                "mountPath": f"{JOBS_ROOT}/{job_id}/checkpoints",
                "subPath": job_id,
            }


@pytest.mark.parametrize(
    "backend, limits",
    [
        ("hami", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 25}),
        ("mig", {"nvidia.com/mig-2g.20gb": 1}),
    ],
)
def test_quarter_slice_on_every_rank(backend, limits):
    s = spec(nodes=3, gpu_milli=250)
    for obj in (
        make_job(s, options(pod_patch=quarter(backend))),
        make_jobset(s, options(pod_patch=quarter(backend)))["spec"]["replicatedJobs"][0][
            "template"
        ],
    ):
        # One template, so every index (every rank) carries the same slice.
        c = container(obj)
        assert c["resources"]["limits"] == limits
        env = env_of(c)
        assert env["GPULAB_GPU_MILLI"] == "250" and env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env["GPULAB_NODE_GPUS"] == "0"
        tolerations = obj["spec"]["template"]["spec"]["tolerations"]
        assert {
            "key": "nvidia.com/gpu",
            "operator": "Exists",
            "effect": "NoSchedule",
        } in tolerations
    if backend == "hami":
        assert (
            make_job(s, options(pod_patch=quarter(backend)))["spec"]["template"]["spec"][
                "schedulerName"
            ]
            == "hami-scheduler"
        )


def test_kueue_labels_and_priority():
    labels = queue_patch("job", "team-a", "low")["labels"]
    job = make_job(spec(), options(labels=labels, priority_class="gpulab-jobs"))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "low"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "gpulab-jobs"
    # Kueue admits the Job; pods with a queue name would become workloads of their own.
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    js = make_jobset(spec(), options(labels=labels))
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    child = js["spec"]["replicatedJobs"][0]["template"]
    assert "kueue.x-k8s.io/queue-name" not in child["metadata"]["labels"]
    # The caller's labels cannot take the job's own: the Service selects by them.
    job = make_job(spec(), options(labels={"gpulab.io/job-id": "other"}))
    assert job["metadata"]["labels"]["gpulab.io/job-id"] == "a1b2c3d4e5f6"


@pytest.mark.parametrize(
    "kw, opts, message",
    [
        ({"image": ""}, {}, "'image' is required"),
        ({"id": ""}, {}, "no id yet"),
        ({"id": "Has_Underscore"}, {}, "cannot name a Kubernetes Job"),
        ({"id": "x" * 40}, {}, "cannot name a Kubernetes Job"),
    ],
)
def test_bad_job_input_says_what_to_do(kw, opts, message):
    with pytest.raises(SpecError, match=message):
        make_job(spec(**kw), options(**opts))


def test_bad_options_say_what_to_do():
    with pytest.raises(SpecError, match="absolute path"):
        JobOptions(jobs_root="jobs", jobs_pvc="x")
    with pytest.raises(SpecError, match="PersistentVolumeClaim"):
        JobOptions(jobs_root="/jobs", jobs_pvc="")


# -- JobSet ----------------------------------------------------------------------------
def test_jobset_restarts_the_group_and_names_its_pods():
    s = spec(nodes=2, max_restarts=5)
    js = make_jobset(s, options())
    name = js["metadata"]["name"]
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 5}
    assert js["spec"]["network"] == {
        "enableDNSHostnames": True,
        "subdomain": name,
        "publishNotReadyAddresses": True,
    }
    [rjob] = js["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 1
    job = rjob["template"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["completions"] == 2
    assert "subdomain" not in job["spec"]["template"]["spec"]  # JobSet sets it
    host = jobset_rdzv_host(s)
    assert host == f"{name}-node-0-0.{name}"
    _, argv = pod_view(job, 1)
    assert f"--rdzv-endpoint={host}:29400" in argv and "--rdzv-conf=is_host=0,timeout=120" in argv


# -- endpoints -------------------------------------------------------------------------
def test_deployment_runs_the_model_server():
    deployment, service = make_deployment("mnist", token_secret="ep-token", **ENDPOINT)
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "gpulab-ep-mnist"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"].items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels
    assert service["spec"]["selector"].items() <= labels
    c = pod["spec"]["containers"][0]
    assert c["command"] == [
        "python",
        "-m",
        "gpulab.serving.server",
        "--model-dir",
        "/models/ann/mnist",
        "--ip",
        "0.0.0.0",
        "--port",
        "8080",
        "--max-batch-size",
        "16",
        "--max-latency-ms",
        "2.5",
        "--max-queue",
        "64",
    ]
    # Only this endpoint's directory of the models claim, at the same path.
    assert c["volumeMounts"] == [
        {
            "name": "models",
            "mountPath": "/models/ann/mnist",
            "subPath": "ann/mnist",
            "readOnly": True,
        }
    ]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "gpulab-models",
        "readOnly": True,
    }
    assert env_of(c)["GPULAB_SERVING_TOKEN"] == {
        "secretKeyRef": {"name": "ep-token", "key": "token"}
    }
    # The ready route wants the token: the probe sends it from the container's environment.
    probe = " ".join(c["readinessProbe"]["exec"]["command"])
    assert "/v2/health/ready" in probe and "GPULAB_SERVING_TOKEN" in probe
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]

    deployment, _ = make_deployment("mnist", **ENDPOINT)
    c = container(deployment)
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert "GPULAB_SERVING_TOKEN" not in env_of(c)


def test_deployment_with_a_quarter_slice():
    deployment, _ = make_deployment("mnist", pod_patch=quarter("hami"), **ENDPOINT)
    c = container(deployment)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["resources"]["limits"]["nvidia.com/gpumem"] == 20480
    assert env_of(c)["GPULAB_GPU_MILLI"] == "250"


def test_inference_service_predictor():
    isvc = make_inference_service("mnist", max_replicas=4, pod_patch=quarter("mig"), **ENDPOINT)
    pred = isvc["spec"]["predictor"]
    assert (pred["minReplicas"], pred["maxReplicas"]) == (2, 4)
    [c] = pred["containers"]
    assert c["name"] == "kserve-container"
    assert c["command"][:3] == ["python", "-m", "gpulab.serving.server"]
    assert c["resources"]["limits"] == {"nvidia.com/mig-2g.20gb": 1}
    assert pred["labels"]["gpulab.io/endpoint"] == "mnist"
    assert pred["volumes"][0]["persistentVolumeClaim"]["claimName"] == "gpulab-models"


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"model_dir": "/elsewhere/m"}, "models volume"),
        ({"image": ""}, "'image' is required"),
        ({"replicas": -1}, "'replicas'"),
        ({"max_batch_size": 0}, "'max_batch_size'"),
        ({"max_latency_ms": -1}, "'max_latency_ms'"),
        ({"models_pvc": ""}, "models_pvc"),
    ],
)
def test_bad_endpoint_input_says_what_to_do(kw, message):
    args = {**ENDPOINT, **kw}
    with pytest.raises(SpecError, match=message):
        make_deployment("mnist", **args)
    with pytest.raises(SpecError, match=message):
        make_inference_service("mnist", **args)


@pytest.mark.parametrize("name", ["MNIST", "1abc", "a_b", "x" * 40])
def test_bad_endpoint_name(name):
    with pytest.raises(SpecError, match="endpoint name"):
        make_deployment(name, **ENDPOINT)


# -- house rules -----------------------------------------------------------------------
def test_builders_are_pure_and_do_not_mutate_their_input():
    s = spec(gpu_milli=250)
    before = copy.deepcopy(s.to_dict())
    assert make_job(s, options()) == make_job(s, options())
    assert s.to_dict() == before


def test_backend_does_not_import_the_spawner_or_load_a_kubeconfig_at_import():
    folder = os.path.dirname(kube.__file__)
    for path in glob.glob(os.path.join(folder, "*.py")):
        tree = ast.parse(open(path).read())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("gpulab.spawner"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("gpulab.spawner") for a in node.names), path
        # kubernetes_asyncio only inside functions: importing gpulab.backend needs no client.
        for node in top:
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
            )
            assert not any(n.startswith("kubernetes_asyncio") for n in names), path
