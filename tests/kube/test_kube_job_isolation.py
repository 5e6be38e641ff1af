"""A job's network is its owner's on a cluster: its Secret and NetworkPolicy (issue 24).

The builders are checked against literal objects and ``kubernetes-validate
--strict``; the backend against the fake API server (the one part faked): the
Secret and the NetworkPolicy are created before any pod could start, made owned
by the Job (so the garbage collector removes them with it), and deleted on cancel.
"""

import pytest
from kube_helpers import K8S_VERSIONS, validate_strict

from gpulab.backend.kubernetes import (
    JobOptions,
    make_job,
    make_job_network_policy,
    make_job_secret,
    make_jobset,
)
from gpulab.backend.spec import JobSpec, SpecError

JOBS_ROOT = "/srv/gpulab/jobs"
NS = "gpulab"
SECRETS = "/api/v1/namespaces/gpulab/secrets"
POLICIES = "/apis/networking.k8s.io/v1/namespaces/gpulab/networkpolicies"
JOBS = "/apis/batch/v1/namespaces/gpulab/jobs"
SERVICES = "/api/v1/namespaces/gpulab/services"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/gpulab/jobsets"
LABELS = {
    "app.kubernetes.io/name": "gpulab",
    "app.kubernetes.io/managed-by": "gpulab",
    "app.kubernetes.io/component": "job",
    "gpulab.io/job-id": "a1b2c3d4e5f6",
}


def spec() -> JobSpec:
    s = JobSpec(
        code="print(1)",
        nodes=2,
        image="registry.example/gpulab:1",
        id="a1b2c3d4e5f6",
        user="ann",
        backend="kubernetes",
    )
    s.validate()
    return s


def options(root: str = JOBS_ROOT, **kw) -> JobOptions:
    return JobOptions(jobs_root=root, jobs_pvc="gpulab-jobs", **kw)


def test_the_secret_holds_the_rendezvous_secret():
    assert make_job_secret(spec(), options(), "f" * 64) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "gpulab-a1b2c3d4e5f6-rdzv", "labels": LABELS},
        "type": "Opaque",
        "stringData": {"rdzv-secret": "f" * 64},
    }


#: What a job's pods may open: DNS anywhere, the job's own pods (c10d, gloo, NCCL:
#: every port), every IPv4 address but the cloud metadata server.
DNS = {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
OUTSIDE = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}]}


def test_the_network_policy_lets_in_only_the_jobs_own_pods():
    policy = make_job_network_policy(spec(), options())
    own = {"matchLabels": {"gpulab.io/job-id": "a1b2c3d4e5f6"}}
    assert policy == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "gpulab-a1b2c3d4e5f6", "labels": LABELS},
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": own}]}],
            "egress": [DNS, {"to": [{"podSelector": own}]}, OUTSIDE],
        },
    }
    # It selects the pods of the Job and of the JobSet (their templates' labels).
    job = make_job(spec(), options())["spec"]["template"]
    js = make_jobset(spec(), options())["spec"]["replicatedJobs"][0]["template"]["spec"]
    for template in (job, js["template"]):
        labels = template["metadata"]["labels"]
        assert own["matchLabels"].items() <= labels.items()
    # Another job's pods do not match it.
    other = JobSpec(code="x", nodes=1, image="i", id="0ther0job0id", backend="kubernetes")
    other_labels = make_job(other, options())["spec"]["template"]["metadata"]["labels"]
    assert not own["matchLabels"].items() <= other_labels.items()


def test_the_network_policy_keeps_the_jobs_pods_from_the_blocked_ranges():
    """A site's private ranges join the metadata server (as z2jh's egressAllowRules
    leave them out for notebooks); DNS and the job's own pods stay open whatever is
    blocked, and blocking everything leaves only those."""
    private = ("169.254.169.254/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.1.7/16")
    policy = make_job_network_policy(spec(), options(egress_blocked_cidrs=private))
    egress = policy["spec"]["egress"]
    assert egress[2] == {
        "to": [
            {
                "ipBlock": {
                    "cidr": "0.0.0.0/0",
                    "except": [
                        "169.254.169.254/32",
                        "10.0.0.0/8",
                        "172.16.0.0/12",
                        "192.168.0.0/16",
                    ],
                }
            }
        ]
    }
    assert validate_strict(policy) == K8S_VERSIONS
    assert make_job_network_policy(spec(), options(egress_blocked_cidrs=()))["spec"]["egress"][
        2
    ] == {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}
    closed = make_job_network_policy(spec(), options(egress_blocked_cidrs=("0.0.0.0/0",)))
    assert closed["spec"]["egress"] == egress[:2]


@pytest.mark.parametrize(
    "cidrs,message",
    [
        (("metadata",), "'metadata' is not a CIDR"),
        (("fd00:ec2::254/128",), "is IPv6"),
        ("169.254.169.254/32", "a list of CIDRs"),
    ],
)
def test_blocked_ranges_are_ipv4_cidrs(cidrs, message):
    with pytest.raises(SpecError, match=message):
        options(egress_blocked_cidrs=cidrs)


@pytest.mark.parametrize("build", [make_job_secret, make_job_network_policy])
def test_the_guards_validate_strict(build):
    obj = (
        build(spec(), options(), "f" * 64) if build is make_job_secret else build(spec(), options())
    )
    assert validate_strict(obj) == K8S_VERSIONS


def test_the_node_gets_the_secret_from_the_secret_never_a_value():
    container = make_job(spec(), options())["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["GPULAB_RDZV_SECRET"] == {
        "name": "GPULAB_RDZV_SECRET",
        "valueFrom": {"secretKeyRef": {"name": "gpulab-a1b2c3d4e5f6-rdzv", "key": "rdzv-secret"}},
    }
    # Not the file on the jobs volume, which every user's pods mount.
    assert "GPULAB_RDZV_SECRET_FILE" not in env
    assert container["args"][:3] == ["python", "-m", "gpulab.training.launch"]
    assert "--rdzv-backend=gpulab" in container["args"]


@pytest.fixture
def cluster(job_cluster):
    return lambda groups=("batch", "apps"): job_cluster(groups, pod_patch_for=None)


@pytest.mark.parametrize("kind", ["Job", "JobSet"])
async def test_start_makes_the_guards_first_and_the_job_owns_them(cluster, kind):
    groups = ("batch", "apps", "jobset.x-k8s.io") if kind == "JobSet" else ("batch", "apps")
    server, backend = await cluster(groups)
    s = spec()
    await backend.start(s, [])
    posts = [p for m, p, _ in server.requests if m == "POST"]
    assert posts[:2] == [SECRETS, POLICIES]
    assert posts[2:] == ([SERVICES, JOBS] if kind == "Job" else [JOBSETS])
    secret = server.get(SECRETS, "gpulab-a1b2c3d4e5f6-rdzv")
    policy = server.get(POLICIES, "gpulab-a1b2c3d4e5f6")
    value = secret["stringData"]["rdzv-secret"]
    assert len(value) == 64 and int(value, 16) >= 0  # secrets.token_hex(32)
    owner = server.get(JOBS if kind == "Job" else JOBSETS, "gpulab-a1b2c3d4e5f6")
    # The Job's headless Service too (JobSet makes its own): a real cluster's
    # garbage collector left it behind when the Job was deleted.
    owned = (secret, policy) + (
        (server.get(SERVICES, "gpulab-a1b2c3d4e5f6"),) if kind == "Job" else ()
    )
    for obj in owned:
        [ref] = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == (
            kind,
            "gpulab-a1b2c3d4e5f6",
            owner["metadata"]["uid"],
        )
    # Another job gets another secret.
    other = JobSpec(code="x", nodes=1, image="i", id="0ther0job0id", backend="kubernetes")
    other.validate()
    await backend.start(other, [])
    assert server.get(SECRETS, "gpulab-0ther0job0id-rdzv")["stringData"]["rdzv-secret"] != value

    await backend.cancel(s)
    assert server.get(SECRETS, "gpulab-a1b2c3d4e5f6-rdzv") is None
    assert server.get(POLICIES, "gpulab-a1b2c3d4e5f6") is None
    await backend.cancel(s)  # gone already: fine
