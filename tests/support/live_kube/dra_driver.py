"""A stand-in DRA driver for the live cluster: simulated GPUs published as NVIDIA's
driver for GPUs (``k8s-dra-driver-gpu``) publishes real ones.

What the real driver's Helm chart and kubelet plugin put into the API, and nothing
else: the DeviceClasses ``gpu.nvidia.com`` (whole cards) and ``mig.nvidia.com`` (MIG
devices), selecting the driver's devices by their ``type`` attribute, and one
``resource.k8s.io/v1`` ResourceSlice per node listing its devices with the
attributes and capacity gpulab's claims and inventory read (``uuid``,
``productName``, ``type``, ``profile``, ``parentUUID``; capacity ``memory``).

The slice is written with the node's own credentials (``system:node:<name>``), as
the kubelet plugin running on the node would: the API server's Node authorizer
and NodeRestriction let a node publish slices for itself only.

:meth:`StandInDriver.start_plugin` runs the driver's kubelet plugin on the node
(``scripts/kube/dra-plugin``, Go, on ``k8s.io/dynamic-resource-allocation``'s
kubeletplugin helper; built by ``scripts/kube/build.sh``): it registers with the
kubelet and prepares each allocated device (no CDI device: no GPU exists here), so
a pod whose claims the scheduler allocated starts. It stops with the cluster.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

DRIVER = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
PRODUCT = "NVIDIA H100 80GB HBM3"
CARD_MEMORY = "81559Mi"
#: MIG devices carved on the second card (balanced H100-80GB profiles).
MIG_LAYOUT = (("1g.10gb", "9984Mi"), ("2g.20gb", "19968Mi"))
RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class SimulatedGpu:
    name: str  # the device's name in the slice: gpu-<minor>
    uuid: str
    product: str = PRODUCT
    memory: str = CARD_MEMORY


def simulated_gpus(node: str) -> list[SimulatedGpu]:
    """Two cards; UUIDs stable per node (the ledger names cards by UUID)."""
    seed = sum(node.encode()) % 0xFFFF
    return [
        SimulatedGpu(f"gpu-{i}", f"GPU-{seed:04x}5a1e-0000-4000-8000-00000000000{i}")
        for i in (0, 1)
    ]


def device_classes() -> list[dict]:
    """What the driver's chart installs: a class per device type, by CEL."""

    def of(name: str, kind: str) -> dict:
        expression = (
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"'
        )
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {"gpulab.io/test": "dra-driver"}},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }

    return [of(DRIVER, "gpu"), of(MIG_CLASS, "mig")]


def _card(gpu: SimulatedGpu, minor: int) -> dict:
    return {
        "name": gpu.name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
            "productName": {"string": gpu.product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "index": {"int": minor},
        },
        "capacity": {"memory": {"value": gpu.memory}},
    }


def _mig(parent: SimulatedGpu, profile: str, memory: str) -> dict:
    return {
        "name": f"{parent.name}-mig-{profile.replace('.', '')}-0",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{parent.uuid[4:-1]}{profile[0]}"},
            "parentUUID": {"string": parent.uuid},
            "profile": {"string": profile},
            "productName": {"string": parent.product},
        },
        "capacity": {"memory": {"value": memory}},
    }


def resource_slice(node: str, gpus: list[SimulatedGpu]) -> dict:
    """The node's pool: its cards, and MIG devices on the last card."""
    devices = [_card(g, i) for i, g in enumerate(gpus)]
    devices += [_mig(gpus[-1], profile, memory) for profile, memory in MIG_LAYOUT]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}", "labels": {"gpulab.io/test": "dra-driver"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class _Api:
    """Just enough of the API for the driver: JSON over TLS with a client certificate."""

    def __init__(self, server: str, ca: str, cert: str, key: str):
        self.server = server
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)

    def request(self, method: str, path: str, body: dict | None = None) -> dict | None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=15) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404 and method == "DELETE":
                return None  # gone already
            raise RuntimeError(
                f"{method} {path} as the DRA driver: {e.code} {e.read().decode(errors='replace')}"
            ) from None


class StandInDriver:
    """``publish()`` the classes and the node's slice; ``remove()`` takes both away."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.node = cluster.node_name
        self.gpus = simulated_gpus(self.node)
        admin = cluster.admin
        self.admin = _Api(cluster.server, cluster.pki.ca, admin.cert, admin.key)
        node = cluster.pki.client("dra-driver", f"system:node:{self.node}", ("system:nodes",))
        self.as_node = _Api(cluster.server, cluster.pki.ca, node.cert, node.key)

    def publish(self) -> StandInDriver:
        for c in device_classes():
            self.admin.request("POST", f"{RESOURCE}/deviceclasses", c)
        self.slice = self.as_node.request(
            "POST", f"{RESOURCE}/resourceslices", resource_slice(self.node, self.gpus)
        )
        return self

    def remove(self) -> None:
        self.as_node.request("DELETE", f"{RESOURCE}/resourceslices/{self.node}-{DRIVER}")
        for c in device_classes():
            self.admin.request("DELETE", f"{RESOURCE}/deviceclasses/{c['metadata']['name']}")

    def start_plugin(self, timeout: float = 60.0) -> StandInDriver:
        """The kubelet plugin, as the node (the Node authorizer lets it read the claims
        of the node's pods); returns once the kubelet has registered it."""
        c = self.cluster
        binary = c.bins / "gpulab-dra-plugin"
        if not binary.exists():
            raise RuntimeError(f"no {binary}: scripts/kube/build.sh builds it")
        # Where its DaemonSet would mount the kubelet's plugin folder for its socket.
        (c.base / "kubelet" / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
        c._spawn(
            "dra-plugin",
            [
                str(binary),
                f"--kubeconfig={c.kubeconfigs['kubelet']}",
                f"--node={self.node}",
                f"--kubelet-dir={c.base / 'kubelet'}",
                f"--driver={DRIVER}",
            ],
        )
        log = c.base / "logs" / "dra-plugin.log"
        c._wait(
            "the kubelet to register the DRA plugin",
            lambda: "the kubelet registered the plugin" in log.read_text(errors="replace"),
            time.monotonic() + timeout,
            "dra-plugin",
        )
        return self
