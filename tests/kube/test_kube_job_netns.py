"""The Indexed Job's pods, played by two network namespaces: they train to the
same weights as the local backend.

Each namespace plays one pod of the Job that ``make_job`` renders (or of the
JobSet ``make_jobset`` renders, whose pods are named differently): it runs the
pod template's container ``command + args`` with its ``env``, after doing what
the kubelet would (``kubelet_sim``: the completion-index annotation and the
pod IP through the downward API, ``$(VAR)`` expansion). Nothing in the
command names a node or an address: index 1 finds index 0 by its DNS name
``<job>-0.<job>``, which resolves inside the namespaces only, through a hosts
file that ``ip netns exec`` bind-mounts over ``/etc/hosts``
(``/etc/netns/<ns>/hosts``: what the cluster DNS answers for the headless
Service). The job directory is the same path in both, as the PVC is in every pod.

The namespaces, the veth pair, its private 10.x addresses and the hosts files
exist only for the test and are deleted afterwards, also when it fails.
"""

import contextlib
import os
import shutil
import socket
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from cells import LINEAR  # noqa: E402
from kubelet_sim import container_argv, container_env  # noqa: E402
from localrun import new_spec, prepare, run, weights  # noqa: E402
from support.netns_run import start_in_namespace, wait_all  # noqa: E402
from test_two_nodes_netns import SHOW_NETDEVS, two_nodes  # noqa: E402,F401  (a fixture)

from gpulab.backend.kubernetes import (  # noqa: E402
    JobOptions,
    make_job,
    make_job_secret,
    make_jobset,
)
from gpulab.backend.kubernetes.job import rdzv_host  # noqa: E402
from gpulab.backend.kubernetes.jobset import jobset_rdzv_host  # noqa: E402
from gpulab.backend.kubernetes.pods import INDEX_ANNOTATION  # noqa: E402
from gpulab.backend.local import PASS_ENV, LocalBackend  # noqa: E402

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture
def cluster_dns(two_nodes):
    """Each pod's DNS names, as the cluster would answer them, inside both namespaces only."""

    def write(names_by_addr: dict[str, list[str]]):
        text = "127.0.0.1 localhost\n" + "".join(
            f"{addr} {' '.join(names)}\n" for addr, names in names_by_addr.items()
        )
        for ns, _, _ in two_nodes:
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(text)

    had_netns_dir = os.path.isdir("/etc/netns")
    try:
        yield write
    finally:
        for ns, _, _ in two_nodes:
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        if not had_netns_dir:
            # If it fails, someone else's namespace files are there now.
            with contextlib.suppress(OSError):
                os.rmdir("/etc/netns")


def pods_of(kind: str, spec, options):
    """(pod template, rendezvous host, the DNS name of pod ``i``) of a Job or a JobSet."""
    if kind == "Job":
        job = make_job(spec, options)
        name = job["metadata"]["name"]
        assert job["spec"]["template"]["spec"]["subdomain"] == name
        return job["spec"]["template"], rdzv_host(spec), lambda i: f"{name}-{i}.{name}"
    js = make_jobset(spec, options)
    name = js["metadata"]["name"]
    assert js["spec"]["network"]["subdomain"] == name
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    # JobSet names pod i of replicated job "node" (its only Job) `<jobset>-node-0-<i>`.
    return template, jobset_rdzv_host(spec), lambda i: f"{name}-node-0-{i}.{name}"


ENV = {"STEPS": "20"}


@pytest.fixture(scope="module")
def local_weights(tmp_path_factory):
    """The same training on the local backend: one node, two processes."""
    backend = LocalBackend(str(tmp_path_factory.mktemp("local") / "jobs"))
    single, single_dir = run(
        backend,
        new_spec(LINEAR, nodes=1, nproc_per_node=2, out="model", checkpoint_every=10, env=ENV),
    )
    assert single.state == "succeeded", single
    return weights(single_dir)


@pytest.mark.parametrize("kind", ["Job", "JobSet"])
def test_indexed_job_pods_train_across_two_namespaces(
    tmp_path, two_nodes, cluster_dns, kind, local_weights
):
    backend = LocalBackend(str(tmp_path / "jobs"))
    env = ENV
    spec = new_spec(
        SHOW_NETDEVS + LINEAR,
        nodes=2,
        nproc_per_node=1,
        out="model",
        checkpoint_every=10,
        env=env,
        backend="kubernetes",
        image="gpulab:test",
    )
    jd = prepare(backend, spec)
    options = JobOptions(jobs_root=backend.jobs_root, jobs_pvc="gpulab-jobs")
    template, host, pod_name = pods_of(kind, spec, options)
    container = template["spec"]["containers"][0]

    assert host == pod_name(0)
    cluster_dns(
        {
            addr: [pod_name(i), f"{pod_name(i)}.default.svc.cluster.local"]
            for i, (_, _, addr) in enumerate(two_nodes)
        }
    )
    with pytest.raises(socket.gaierror):  # only the namespaces know the pods' names
        socket.getaddrinfo(host, None)

    secret = make_job_secret(spec, options, "s" * 64)
    secrets = {secret["metadata"]["name"]: secret["stringData"]}
    # The image's PATH: torchrun is the one installed with gpulab.
    base = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    base["PATH"] = os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    procs, argvs = [], []
    for index, (ns, veth, addr) in enumerate(two_nodes):
        pod_env = container_env(
            container,
            annotations={INDEX_ANNOTATION: str(index)},
            pod_ip=addr,
            secrets=secrets,  # the job's Secret, as the kubelet reads it
        )
        # On a cluster the pod has one interface; here gloo must be told the veth's name.
        pod_env["GLOO_SOCKET_IFNAME"] = veth
        argv = container_argv(container, pod_env)
        argvs.append(argv)
        log = jd.p("logs", f"node{index}.log")
        env = {**base, **pod_env}
        procs.append(start_in_namespace(ns, argv, env, log, cwd=container["workingDir"]))
    wait_all(procs)
    logs = {n: open(jd.p("logs", f"node{n}.log")).read() for n in (0, 1)}
    assert [p.returncode for p in procs] == [0, 0], logs

    # Both pods ran the same command but the pod's own address and log dir;
    # both rendezvous at index 0's name (never an address).
    for index, argv in enumerate(argvs):
        assert f"--rdzv-endpoint={host}:{options.rdzv_port}" in argv
        assert f"--local-addr={two_nodes[index][2]}" in argv
        assert argv[-1] == jd.path
    assert os.path.isdir(jd.p("torchrun", "node0")) and os.path.isdir(jd.p("torchrun", "node1"))
    # Each rank ran in its own namespace: it saw only its node's veth (and lo).
    seen = sorted(open(jd.p("logs", f"rank{r}.log")).readline().strip() for r in (0, 1))
    assert seen == sorted(f"netdevs {sorted(['lo', veth])}" for _, veth, _ in two_nodes)
    assert os.listdir(jd.p("checkpoints")), "checkpoints go to the job volume"

    a, b = local_weights, weights(jd)
    for k in a:
        assert torch.equal(a[k], b[k]), k
