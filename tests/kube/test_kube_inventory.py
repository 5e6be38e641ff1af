"""Node and pod objects (as the API returns them) -> GPUs and free resources."""

from __future__ import annotations

import json
import socket

import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from gpulab.backend.kubernetes.inventory import (
    free_mig_profiles,
    free_resources,
    load_cluster_inventory,
    parse_hami_register,
    parse_node,
    parse_nodes,
    quantity,
)
from gpulab.scheduler.inventory import Gpu


def node(name, labels=None, annotations=None, allocatable=None, unschedulable=False):
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", **(allocatable or {})},
            "capacity": {"cpu": "64"},
        },
    }


GFD_H100 = node(
    "gpu-a",
    labels={
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.present": "true",
    },
    allocatable={"nvidia.com/gpu": "2"},
)

MIG_MIXED = node(
    "gpu-mig",
    labels={
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.memory": "143771",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/mig.strategy": "mixed",
    },
    allocatable={
        "nvidia.com/mig-1g.18gb": "2",
        "nvidia.com/mig-2g.35gb": "1",
        "nvidia.com/mig-3g.71gb": "1",
        "nvidia.com/gpu": "0",
    },
)

HAMI_JSON = [
    {
        "id": "GPU-11111111-2222-3333-4444-555555555555",
        "index": 0,
        "count": 10,
        "devmem": 81920,
        "devcore": 100,
        "type": "NVIDIA-NVIDIA H100 80GB HBM3",
        "numa": 0,
        "mode": "hami-core",
        "health": True,
    },
    {
        "id": "GPU-66666666-7777-8888-9999-000000000000",
        "index": 1,
        "count": 10,
        "devmem": 81920,
        "devcore": 100,
        "type": "NVIDIA-NVIDIA H100 80GB HBM3",
        "numa": 1,
        "mode": "hami-core",
        "health": False,
    },
]
HAMI_NODE = node(
    "gpu-hami",
    annotations={"hami.io/node-nvidia-register": json.dumps(HAMI_JSON)},
    allocatable={"nvidia.com/gpu": "20"},
)


def test_gfd_labels():
    assert parse_node(GFD_H100) == [
        Gpu("k8s-gpu-a-gpu0", 0, "NVIDIA-H100-80GB-HBM3", 81559, "gpu-a"),
        Gpu("k8s-gpu-a-gpu1", 1, "NVIDIA-H100-80GB-HBM3", 81559, "gpu-a"),
    ]


def test_mig_node_lists_its_physical_cards():
    assert parse_node(MIG_MIXED) == [Gpu("k8s-gpu-mig-gpu0", 0, "NVIDIA-H200", 143771, "gpu-mig")]


def test_mig_single_strategy_product_suffix_is_dropped():
    n = node(
        "s",
        labels={
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            "nvidia.com/gpu.memory": "40960",
            "nvidia.com/gpu.count": "1",
        },
    )
    assert parse_node(n)[0].model == "NVIDIA-A100-SXM4-40GB"


def test_hami_registration_json_skips_unhealthy_cards():
    assert parse_node(HAMI_NODE) == [
        Gpu(
            "GPU-11111111-2222-3333-4444-555555555555",
            0,
            "NVIDIA H100 80GB HBM3",
            81920,
            "gpu-hami",
        )
    ]


def test_hami_registration_legacy_format():
    value = (
        "GPU-aaaa,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
        "GPU-bbbb,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,false:"
    )
    assert parse_hami_register(value, "old") == [
        Gpu("GPU-aaaa", 0, "NVIDIA-Tesla V100-PCIE-32GB", 32768, "old")
    ]


def test_time_slicing_replicas_are_not_cards():
    n = node(
        "ts",
        labels={
            "nvidia.com/gpu.product": "Tesla-T4",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.memory": "15360",
        },
        allocatable={"nvidia.com/gpu": "8"},
    )
    assert [g.uuid for g in parse_node(n)] == ["k8s-ts-gpu0", "k8s-ts-gpu1"]


def test_nodes_without_gpus_and_cordoned_nodes():
    cpu = node("cpu-1")
    cordoned = node("gpu-z", labels=GFD_H100["metadata"]["labels"], unschedulable=True)
    assert parse_nodes([cpu, cordoned]) == (
        [],
        "no node in the cluster offers NVIDIA GPUs (nvidia.com/gpu or HAMi)",
    )
    gpus, reason = parse_nodes([cpu, GFD_H100, HAMI_NODE])
    assert [g.node for g in gpus] == ["gpu-a", "gpu-a", "gpu-hami"] and reason is None


def test_memory_unknown_is_said():
    bare = node("bare", allocatable={"nvidia.com/gpu": "1"})
    gpus, reason = parse_nodes([GFD_H100, bare])
    assert [g.node for g in gpus] == ["gpu-a", "gpu-a"]
    assert "GPU memory unknown on node bare" in reason
    # The model name carries the size when the memory label is missing.
    sized = node(
        "sized",
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1"},
    )
    assert parse_node(sized)[0].memory_mib == 40 * 1024


def pod(name, node_name, limits, phase="Running"):
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": phase},
    }


def test_free_resources_and_mig_profiles():
    pods = [
        pod("a", "gpu-mig", {"nvidia.com/mig-1g.18gb": "1", "cpu": "2"}),
        pod("b", "gpu-mig", {"nvidia.com/mig-3g.71gb": "1"}),
        pod("done", "gpu-mig", {"nvidia.com/mig-2g.35gb": "1"}, phase="Succeeded"),
        pod("c", "gpu-a", {"nvidia.com/gpu": "1"}),
        pod("elsewhere", "other", {"nvidia.com/gpu": "1"}),
    ]
    free = free_resources([GFD_H100, MIG_MIXED], pods)
    assert free == {
        "gpu-a": {"nvidia.com/gpu": 1},
        "gpu-mig": {
            "nvidia.com/mig-1g.18gb": 1,
            "nvidia.com/mig-2g.35gb": 1,
            "nvidia.com/mig-3g.71gb": 0,
            "nvidia.com/gpu": 0,
        },
    }
    assert free_mig_profiles(free) == {"1g.18gb": 1, "2g.35gb": 1}


@pytest.mark.parametrize(
    "text,value", [("4", 4), ("2k", 2000), ("1Ki", 1024), ("1500m", 1), (3, 3)]
)
def test_quantities(text, value):
    assert quantity(text) == value


class NodesHandler(web.RequestHandler):
    """The one route of a Kubernetes API server the inventory reads."""

    def get(self):
        assert self.request.headers["Authorization"] == "Bearer inventory-test-token"
        selector = self.get_argument("labelSelector", "")
        items = [GFD_H100, HAMI_NODE, node("cpu-1")]
        if selector == "nvidia.com/gpu.present=true":
            items = [GFD_H100]
        self.write({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})


def kubeconfig(tmp_path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
users: [{{name: u, user: {{token: inventory-test-token}}}}]
""")
    return str(path)


async def test_load_cluster_inventory_over_http(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = HTTPServer(web.Application([(r"/api/v1/nodes", NodesHandler)]))
    server.listen(port, "127.0.0.1")
    try:
        config = kubeconfig(tmp_path, port)
        gpus, reason = await load_cluster_inventory(config)
        assert reason is None
        assert [g.uuid for g in gpus] == [
            "k8s-gpu-a-gpu0",
            "k8s-gpu-a-gpu1",
            "GPU-11111111-2222-3333-4444-555555555555",
        ]
        gpus, _ = await load_cluster_inventory(config, "nvidia.com/gpu.present=true")
        assert {g.node for g in gpus} == {"gpu-a"}
    finally:
        server.stop()


async def test_unreachable_cluster_says_why(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    gpus, reason = await load_cluster_inventory(kubeconfig(tmp_path, port))
    assert gpus == [] and reason.startswith("cannot list the cluster's nodes (")
