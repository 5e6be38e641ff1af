"""NIC and RDMA samplers on this machine's real /sys, and on network namespaces."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from gpulab.telemetry.nic import NicSampler
from gpulab.telemetry.rdma import RdmaSampler
from gpulab.telemetry.sample import SourceMissing

HELPER = os.path.join(os.path.dirname(__file__), "netns_traffic.py")


def read_counter(device, name):
    with open(f"/sys/class/net/{device}/statistics/{name}") as f:
        return int(f.read())


def test_every_interface_of_this_machine_is_read():
    expected = sorted(d for d in os.listdir("/sys/class/net") if d != "lo")
    before = {d: read_counter(d, "rx_bytes") for d in expected}
    nics = NicSampler().sample()
    after = {d: read_counter(d, "rx_bytes") for d in expected}

    assert [n["device"] for n in nics] == expected
    for nic in nics:
        assert before[nic["device"]] <= nic["rx_bytes"] <= after[nic["device"]]
        assert nic["rx_bytes_per_second"] is None  # no earlier reading yet
        assert nic["mtu"] > 0
        assert nic["virtual"] == (not os.path.exists(f"/sys/class/net/{nic['device']}/device"))
    json.dumps(nics)


def test_loopback_traffic_shows_in_counters_and_rates():
    sampler = NicSampler(include_loopback=True)
    first = {n["device"]: n for n in sampler.sample()}
    payload = 2_000_000
    with socket.create_server(("127.0.0.1", 0)) as server:

        def drain():
            conn, _ = server.accept()
            with conn:
                while conn.recv(65536):
                    pass

        reader = threading.Thread(target=drain)
        reader.start()
        with socket.create_connection(server.getsockname()) as conn:
            conn.sendall(b"x" * payload)
        reader.join(timeout=30)
    second = {n["device"]: n for n in sampler.sample()}
    # Other processes may use loopback too, so only a lower bound holds here;
    # the namespace test below checks exact figures.
    assert second["lo"]["tx_bytes"] - first["lo"]["tx_bytes"] >= payload
    assert second["lo"]["tx_bytes_per_second"] > 0


def test_a_sysfs_without_network_reports_why(tmp_path):
    with pytest.raises(SourceMissing, match="no network interfaces"):
        NicSampler(sysfs=str(tmp_path)).sample()


def run(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespace_pair():
    """Two network namespaces joined by a veth pair: 10.231.7.1 <-> 10.231.7.2."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create network namespaces")
    tag = str(os.getpid())
    ns_a, ns_b, veth_a, veth_b = f"gpltA{tag}", f"gpltB{tag}", f"gplA{tag}", f"gplB{tag}"
    try:
        run("ip", "netns", "add", ns_a)
        run("ip", "netns", "add", ns_b)
        run("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        run("ip", "link", "set", veth_a, "netns", ns_a)
        run("ip", "link", "set", veth_b, "netns", ns_b)
        run("ip", "-n", ns_a, "addr", "add", "10.231.7.1/30", "dev", veth_a)
        run("ip", "-n", ns_b, "addr", "add", "10.231.7.2/30", "dev", veth_b)
        run("ip", "-n", ns_a, "link", "set", veth_a, "up")
        run("ip", "-n", ns_b, "link", "set", veth_b, "up")
        yield (ns_a, veth_a), (ns_b, veth_b)
    finally:
        # Deleting a namespace deletes the veth end inside it, and with it the peer.
        for ns in (ns_a, ns_b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.mark.netns
@pytest.mark.timeout(60)
def test_counters_match_the_bytes_sent_between_namespaces(namespace_pair):
    (ns_a, veth_a), (ns_b, veth_b) = namespace_pair
    nbytes = 20_000_000
    receiver = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns_b,
            sys.executable,
            HELPER,
            "recv",
            "10.231.7.2",
            "5001",
            str(nbytes),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout.readline().strip() == "listening"
        sender = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns_a,
                sys.executable,
                HELPER,
                "send",
                "10.231.7.2",
                "5001",
                str(nbytes),
            ],
            capture_output=True,
            text=True,
            timeout=50,
            check=True,
        )
        received = json.loads(receiver.communicate(timeout=50)[0])
    finally:
        receiver.kill()
        receiver.wait()
    sent = json.loads(sender.stdout)
    assert sent["sent"] == received["got"] == nbytes

    # Each namespace's sampler sees only its own end of the pair (lo is left out).
    assert list(sent["after"]) == [veth_a]
    assert list(received["after"]) == [veth_b]
    tx = sent["after"][veth_a]["tx_bytes"] - sent["before"][veth_a]["tx_bytes"]
    rx = received["after"][veth_b]["rx_bytes"] - received["before"][veth_b]["rx_bytes"]
    # Headers and ACKs add a little; the payload must account for the rest.
    assert nbytes <= tx <= nbytes * 1.05
    assert nbytes <= rx <= nbytes * 1.05


def test_rdma_on_this_machine():
    if os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband"):
        assert RdmaSampler().sample()
    else:
        with pytest.raises(SourceMissing, match=r"no RDMA devices \(/sys/class/infiniband"):
            RdmaSampler().sample()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_rdma_counters_count_four_byte_words(tmp_path):
    # No RDMA hardware here: a sysfs tree laid out as mlx5 presents it.
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    write(port / "counters/port_rcv_data", "1000\n")
    write(port / "counters/port_xmit_data", "250\n")
    write(port / "counters/port_rcv_packets", "10\n")
    write(port / "counters/port_xmit_packets", "5\n")
    write(port / "link_layer", "InfiniBand\n")
    write(port / "state", "4: ACTIVE\n")
    write(port / "rate", "200 Gb/sec (4X HDR)\n")
    now = [100.0]
    sampler = RdmaSampler(sysfs=str(tmp_path), clock=lambda: now[0])

    (first,) = sampler.sample()
    assert (first["device"], first["port"]) == ("mlx5_0", "1")
    assert (first["rx_bytes"], first["tx_bytes"]) == (4000, 1000)
    assert first["link_layer"] == "InfiniBand" and first["state"] == "4: ACTIVE"
    assert first["rx_bytes_per_second"] is None

    write(port / "counters/port_rcv_data", "3500\n")
    now[0] = 102.0
    (second,) = sampler.sample()
    assert second["rx_bytes_per_second"] == (3500 - 1000) * 4 / 2
    assert second["tx_bytes_per_second"] == 0


def test_an_empty_infiniband_class_is_missing(tmp_path):
    (tmp_path / "class/infiniband").mkdir(parents=True)
    with pytest.raises(SourceMissing, match="none under"):
        RdmaSampler(sysfs=str(tmp_path)).sample()
