"""Two nodes as two network namespaces: the command lines the spec renders for
node 0 and node 1 run there (joined by a veth pair, nothing else) and train to
the same weights as one node with two processes.

The namespaces, the veth pair and its private 10.x addresses exist only for the
test and are deleted afterwards, also when it fails.
"""

import os
import random
import subprocess

import pytest
import torch
from cells import LINEAR
from localrun import new_spec, prepare, run, weights
from support.netns_run import start_in_namespace, wait_all

from gpulab.backend.local import PASS_ENV, LocalBackend
from gpulab.backend.render import render_node

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SHOW_NETDEVS = 'import os\nprint("netdevs", sorted(os.listdir("/sys/class/net")), flush=True)\n'


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_nodes():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 1000:03d}{random.randint(0, 9)}"
    octet = random.randint(1, 250)
    nodes = [
        (f"gpl4n0{tag}", f"gpl4v0{tag}", f"10.234.{octet}.1"),
        (f"gpl4n1{tag}", f"gpl4v1{tag}", f"10.234.{octet}.2"),
    ]
    try:
        for ns, _, _ in nodes:
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", nodes[0][1], "type", "veth", "peer", "name", nodes[1][1])
        for ns, veth, addr in nodes:
            ip("link", "set", veth, "netns", ns)
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", veth)
            ip("-n", ns, "link", "set", veth, "up")
        yield nodes
    finally:
        # Deleting a namespace deletes its veth end, and with it the peer.
        for ns, _, _ in nodes:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_rendered_node_commands_train_across_two_namespaces(tmp_path, two_nodes):
    backend = LocalBackend(str(tmp_path / "jobs"))
    env = {"STEPS": "20"}
    spec = new_spec(
        SHOW_NETDEVS + LINEAR, nodes=2, nproc_per_node=1, out="model", checkpoint_every=10, env=env
    )
    jd = prepare(backend, spec)
    host_addr = two_nodes[0][2]
    base = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    procs = []
    for node, (ns, veth, addr) in enumerate(two_nodes):
        launch = render_node(
            spec,
            node,
            job_dir=jd.path,
            rdzv_host=host_addr,
            rdzv_port=29455,
            local_addr=addr,
            ifname=veth,
        )
        log = jd.p("logs", f"node{node}.log")
        procs.append(start_in_namespace(ns, launch.argv, {**base, **launch.env}, log))
    wait_all(procs, timeout=400)
    logs = {n: open(jd.p("logs", f"node{n}.log")).read() for n in (0, 1)}
    assert [p.returncode for p in procs] == [0, 0], logs
    # Each rank ran in its own namespace: it saw only its node's veth (and lo).
    seen = sorted(open(jd.p("logs", f"rank{r}.log")).readline().strip() for r in (0, 1))
    assert seen == sorted(f"netdevs {sorted(['lo', veth])}" for _, veth, _ in two_nodes)

    single, single_dir = run(
        backend,
        new_spec(LINEAR, nodes=1, nproc_per_node=2, out="model", checkpoint_every=10, env=env),
    )
    assert single.state == "succeeded", single
    a, b = weights(single_dir), weights(jd)
    for k in a:
        assert torch.equal(a[k], b[k]), k
