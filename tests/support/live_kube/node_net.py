"""The live cluster's network: a network namespace per cluster, joined to the host by
one veth pair, with address ranges of the suite's own.

Slot ``n`` (0-15, one per cluster running on the machine at once) owns:

- the link ``172.31.250.4n/30``: the host's end ``.4n+1``, the node's ``.4n+2``
  (the node's address: the API server, the kubelet, cluster DNS);
- pods ``10.251.n.0/24`` (a bridge inside the namespace; the host routes it to the node);
- services ``10.252.n.0/24`` (the API server allocates them; kube-proxy's rules in the
  namespace answer them, and the host routes the range to the node too).

The namespace has no default route: nothing in it can address anything beyond this
machine's veth.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


@dataclass(frozen=True)
class NodeNet:
    slot: int

    @property
    def netns(self) -> str:
        return f"gpulab-kube{self.slot}"

    @property
    def host_veth(self) -> str:
        return f"gkube{self.slot}h"

    @property
    def host_ip(self) -> str:
        return f"172.31.250.{4 * self.slot + 1}"

    @property
    def node_ip(self) -> str:
        return f"172.31.250.{4 * self.slot + 2}"

    @property
    def pod_cidr(self) -> str:
        return f"10.251.{self.slot}.0/24"

    @property
    def service_cidr(self) -> str:
        return f"10.252.{self.slot}.0/24"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"10.252.{self.slot}.1"

    def exists(self) -> bool:
        return self.netns in sh("ip", "netns", "list").stdout.split()

    def create(self) -> None:
        self.remove()
        ns, peer = self.netns, f"gkube{self.slot}n"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_veth)
        sh("ip", "link", "set", self.host_veth, "up")
        inside = ["ip", "netns", "exec", ns]
        sh(*inside, "ip", "link", "set", "lo", "up")
        sh(*inside, "ip", "link", "set", peer, "name", "eth0")
        sh(*inside, "ip", "addr", "add", f"{self.node_ip}/30", "dev", "eth0")
        sh(*inside, "ip", "link", "set", "eth0", "up")
        # The bridge's pods answer the host (tests call endpoints) through the node.
        sh(*inside, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        sh(*inside, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=0", check=False)
        sh("ip", "route", "add", self.pod_cidr, "via", self.node_ip)
        # Services' cluster IPs too: kube-proxy's rules in the namespace answer them.
        sh("ip", "route", "add", self.service_cidr, "via", self.node_ip)

    def exec(self) -> list[str]:
        """The prefix that runs a command inside the node's network namespace, and only
        that: ``ip netns exec`` would also give it a mount namespace with a fresh
        ``/sys`` (no cgroup mounts: the kubelet refuses to start) in which the
        kubelet's volume mounts would be invisible to containerd."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"]

    def remove(self) -> None:
        """The namespace (its end of the veth with it), the host's route; no error if gone."""
        sh("ip", "route", "del", self.pod_cidr, check=False)
        sh("ip", "route", "del", self.service_cidr, check=False)
        sh("ip", "link", "del", self.host_veth, check=False)
        if self.exists():
            sh("ip", "netns", "del", self.netns, check=False)
