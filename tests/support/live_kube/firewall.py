"""NetworkPolicy enforcement on the live cluster: kube-router's firewall on the node.

The bridge CNI plugin enforces no NetworkPolicy. kube-router
(``github.com/cloudnativelabs/kube-router/v2``, built by ``scripts/kube/build.sh``)
run with only its network-policy controller (``--run-firewall=true
--run-router=false --run-service-proxy=false``) turns every policy into iptables
rules and ipsets, as it does on a site's nodes. It runs inside the node's network
namespace, so its rules and sets live there and go with the namespace when the
cluster stops: nothing is left on the host. Pod-to-pod traffic crosses the node's
bridge, which iptables sees only with ``net.bridge.bridge-nf-call-iptables=1``
(per namespace; set here for the node's namespace only).

It reads the API as a user of its own (``gpulab-test:kube-router``, a client
certificate of the cluster's CA) with the read rights kube-router's own manifests
give it.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from .node_net import sh

USER = "gpulab-test:kube-router"
NEEDS = {"iptables": "iptables", "ipset": "ipset"}

_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": USER},
    "rules": [
        {
            "apiGroups": [""],
            "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["networking.k8s.io"],
            "resources": ["networkpolicies"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
    ],
}
_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": USER},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
}


def missing() -> str | None:
    """One line naming what this machine lacks to run the firewall, or None."""
    lacking = sorted({pkg for cmd, pkg in NEEDS.items() if shutil.which(cmd) is None})
    if lacking:
        return f"missing Debian packages {' '.join(lacking)}: run `make system-deps` (as root)"
    return None


class Firewall:
    """kube-router's network-policy controller on ``cluster``'s node: ``start()``; it
    stops with the cluster (one of its processes)."""

    def __init__(self, cluster):
        self.cluster = cluster

    def start(self, timeout: float = 60.0) -> Firewall:
        c = self.cluster
        binary = c.bins / "kube-router"
        if not binary.exists():
            raise RuntimeError(f"no {binary}: scripts/kube/build.sh builds it")
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        c.request("POST", f"{rbac}/clusterroles", _ROLE)
        c.request("POST", f"{rbac}/clusterrolebindings", _BINDING)
        pair = c.pki.client("kube-router", USER)
        kubeconfig = c.pki.kubeconfig(c.base / "kube-router.kubeconfig", c.server, pair, "kr")
        sh(*c.net.exec(), "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1")
        c._spawn(
            "kube-router",
            [
                str(binary),
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={c.node_name}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--enable-cni=false",
                f"--service-cluster-ip-range={c.net.service_cidr}",
                "--health-port=0",
                "--metrics-port=0",
                "--v=1",
            ],
        )
        deadline = time.monotonic() + timeout
        c._wait(
            "kube-router's first sync of the policy chains",
            lambda: "KUBE-ROUTER-FORWARD" in self.rules(),
            deadline,
            "kube-router",
        )
        return self

    def rules(self) -> str:
        """The node's iptables rules (``iptables-save``), where kube-router writes them."""
        r = subprocess.run(
            [*self.cluster.net.exec(), "iptables-save"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return r.stdout

    def guards(self, namespace: str, pod: str) -> bool:
        """Whether kube-router has given pod ``namespace/pod`` a firewall chain yet (its
        rules name the pod in their comments)."""
        return f"name:{pod} namespace: {namespace}" in self.rules()
