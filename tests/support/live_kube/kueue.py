"""Kueue on the live cluster: its controller manager as a process, its CRDs, its RBAC.

``scripts/kube/build.sh`` builds ``sigs.k8s.io/kueue/cmd/kueue`` (VERSION) from the Go
module proxy and copies the module's CRDs (``config/components/crd/bases``) beside it.
Here they are installed as Kueue's manifests would, and the manager runs inside the
node's network namespace (its probe, metrics and webhook ports stay there) as a user
of its own, ``gpulab-test:kueue`` (a client certificate of the cluster's CA), bound to
the ClusterRole of the module's ``config/components/rbac/role.yaml``.

No admission webhook is registered: the API server would need a Service in front of a
pod to call it. Kueue's own certificate management still runs (the webhook server and
the job controllers wait for it): it fills the Secret ``kueue-webhook-server-cert``,
which a pod would mount; here the harness copies it into the manager's ``certDir``.
Without the webhook a queued Job must be made suspended (gpulab does), and nothing
defaults or validates Kueue's objects beyond their CRD schemas.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

VERSION = "v0.14.0"
USER = "gpulab-test:kueue"
NAMESPACE = "kueue-system"
SECRET = "kueue-webhook-server-cert"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _config(cert_dir: Path) -> dict:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        # Ports of the node's network namespace, clear of CoreDNS's 8080/8181; no
        # metrics server (it would need the metrics-auth RBAC).
        "health": {"healthProbeBindAddress": ":18081"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": 19443, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True},
        # Only Jobs: the other integrations' CRDs (JobSet, Kubeflow, Ray) are absent.
        "integrations": {"frameworks": ["batch/job"]},
    }


class Kueue:
    """Kueue's manager on ``cluster``: ``start()``; it stops with the cluster (one of
    its processes), and its objects go with the cluster's etcd."""

    def __init__(self, cluster):
        self.cluster = cluster

    @property
    def binary(self) -> Path:
        return self.cluster.bins / f"kueue-{VERSION}"

    def _role(self) -> dict:
        import yaml

        # The module's config/components/rbac/role.yaml, copied there by build.sh.
        path = self.cluster.bins / f"kueue-role-{VERSION}.yaml"
        role = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        role["metadata"] = {"name": USER}
        return role

    def start(self, timeout: float = 90.0) -> Kueue:
        import yaml

        c = self.cluster
        crds = c.bins / f"kueue-crds-{VERSION}"
        role = self.cluster.bins / f"kueue-role-{VERSION}.yaml"
        if not (self.binary.exists() and crds.is_dir() and role.exists()):
            raise RuntimeError(
                f"no {self.binary}, {crds} or {role}: scripts/kube/build.sh makes them"
            )
        for f in sorted(crds.glob("*.yaml")):
            c.request("POST", CRDS, yaml.safe_load(f.read_text()))
        c.request("POST", f"{RBAC}/clusterroles", self._role())
        c.request(
            "POST",
            f"{RBAC}/clusterrolebindings",
            {
                "metadata": {"name": USER},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": USER,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}
                ],
            },
        )
        c.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        c.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", {"metadata": {"name": SECRET}})
        cert_dir = c.base / "kueue-certs"
        cert_dir.mkdir(exist_ok=True)
        config = c.base / "kueue-config.json"
        config.write_text(json.dumps(_config(cert_dir)))
        pair = c.pki.client("kueue", USER)
        kubeconfig = c.pki.kubeconfig(c.base / "kueue.kubeconfig", c.server, pair, "kueue")
        deadline = time.monotonic() + timeout
        c._wait("Kueue's CRDs to be established", self._established, deadline, "kube-apiserver")
        c._spawn(
            "kueue",
            [
                str(self.binary),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                "--feature-gates=VisibilityOnDemand=false",
                "--zap-log-level=2",
            ],
        )
        c._wait("Kueue's webhook certificate in its Secret", self._certs, deadline, "kueue")
        secret = self._secret_data()
        for name in ("tls.crt", "tls.key"):
            (cert_dir / name).write_bytes(base64.b64decode(secret[name]))
        c._wait("Kueue's controllers to start", self._controllers_up, deadline, "kueue")
        return self

    def _established(self) -> bool:
        found = self.cluster.get(CRDS)["items"]
        kueue = [d for d in found if d["spec"]["group"] == "kueue.x-k8s.io"]
        return bool(kueue) and all(
            any(
                x["type"] == "Established" and x["status"] == "True"
                for x in (d.get("status") or {}).get("conditions") or []
            )
            for d in kueue
        )

    def _secret_data(self) -> dict:
        return (
            self.cluster.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}").get("data") or {}
        )

    def _certs(self) -> bool:
        return {"tls.crt", "tls.key"} <= set(self._secret_data())

    def _controllers_up(self) -> bool:
        """Once Kueue's Job reconciler runs (controller-runtime logs its workers)."""
        log = (self.cluster.base / "logs" / "kueue.log").read_text(errors="replace")
        return any(
            "Starting workers" in line and '"controller":"job"' in line for line in log.splitlines()
        )
