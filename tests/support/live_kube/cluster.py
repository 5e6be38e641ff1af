"""A one-node Kubernetes cluster as plain processes, for the live-cluster suite.

What ``hack/local-up-cluster.sh`` and envtest do, inside a network namespace of the
suite's own (:mod:`.node_net`): etcd, kube-apiserver (client certificates from a
private CA, ``Node,RBAC`` authorization, NodeRestriction), kube-controller-manager
(a service-account credential per controller), kube-scheduler, CoreDNS (cluster
DNS: a job's pods find index 0 by name), containerd + runc + the bridge CNI plugin,
and a kubelet. Images come from a docker-archive (:mod:`.images`), no registry.

:func:`LiveCluster.stop` removes everything the cluster made: its processes (by
process group, and every process left in its cgroup subtree: containers, shims),
the mounts under its folder and the pods' network namespaces, its cgroups, its
network namespace. It runs at the end of the session, at interpreter exit, and on
SIGTERM/SIGHUP; a run killed outright is cleaned up by the next one (same slot).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from .images import PAUSE_IMAGE, image_archive
from .node_net import NodeNet, sh
from .pki import Pki

CONTROLLERS = (
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
    "pids",
    "systemd",
)
CGROUP_V1 = Path("/sys/fs/cgroup")
STATE = Path(os.environ.get("GPULAB_KUBE_STATE", "/var/lib/gpulab-kube"))


class ClusterError(RuntimeError):
    """The cluster did not come up: the message names the part and its log."""


class LiveCluster:
    def __init__(self, bins: Path, cache: Path, log=print):
        self.bins, self.cache, self.log = bins, cache, log
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self._lock = None
        self.net: NodeNet | None = None
        self.base: Path | None = None
        self._stopped = False
        self._netns_before: set[str] = set()

    # -- names ------------------------------------------------------------------------
    @property
    def node_name(self) -> str:
        return f"gpulab-node-{self.net.slot}"

    @property
    def server(self) -> str:
        return f"https://{self.net.node_ip}:6443"

    @property
    def cgroup_root(self) -> str:
        return f"gpulab-kube{self.net.slot}"

    @property
    def containerd_sock(self) -> str:
        return str(self.base / "containerd.sock")

    # -- start ------------------------------------------------------------------------
    def _take_slot(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        for slot in range(16):
            f = open(STATE / f"slot{slot}.lock", "w")  # noqa: SIM115 - held while we run
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            self._lock, self.net, self.base = f, NodeNet(slot), STATE / f"s{slot}"
            return
        raise ClusterError(f"16 live clusters already run on this machine ({STATE}/slot*.lock)")

    def start(self, timeout: float = 180.0) -> LiveCluster:
        t0 = time.monotonic()
        self._take_slot()
        # A run killed outright (SIGKILL) left its slot's things: remove them first.
        self._cleanup()
        self._stopped = False
        atexit.register(self.stop)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous = signal.getsignal(sig)

            def on_signal(signum, frame, previous=previous):
                self.stop()
                if callable(previous):
                    previous(signum, frame)
                else:
                    raise SystemExit(128 + signum)

            signal.signal(sig, on_signal)
        self._netns_before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
        self.base.mkdir(parents=True)
        (self.base / "logs").mkdir()
        self.net.create()
        self._pki()
        self._make_cgroup_root()
        deadline = t0 + timeout
        self._spawn("etcd", self._etcd_argv())
        self._spawn("kube-apiserver", self._apiserver_argv())
        self._wait(
            "the API server's /readyz",
            lambda: self.get("/readyz", raw=True) == "ok",
            deadline,
            "kube-apiserver",
        )
        self.apply_bootstrap()
        self._spawn("kube-controller-manager", self._controller_manager_argv())
        self._spawn("kube-scheduler", self._scheduler_argv())
        self._spawn("coredns", self._coredns_argv())
        self._spawn("containerd", self._containerd_argv())
        self._wait(
            "containerd's socket",
            lambda: os.path.exists(self.containerd_sock),
            deadline,
            "containerd",
        )
        self._import_images()
        self._spawn("kubelet", self._kubelet_argv())
        self._wait("the node to be Ready", self._node_ready, deadline, "kubelet")
        # Services' cluster IPs (the endpoint Services, z2jh's hub and proxy-api): rules in
        # the node's namespace, which the host reaches through the route to the service range.
        self._spawn("kube-proxy", self._kube_proxy_argv())
        self._wait(
            "the default ServiceAccount",
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default", missing=None),
            deadline,
            "kube-controller-manager",
        )
        self._probe_volume_binding(deadline)
        self.start_seconds = time.monotonic() - t0
        self.version = self.get("/version")["gitVersion"]
        return self

    def _pki(self) -> None:
        pki = self.pki = Pki(self.base / "pki")
        ip = self.net.node_ip
        self.serving = pki.server(
            "apiserver",
            "kube-apiserver",
            [
                ip,
                self.net.kubernetes_service_ip,
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        self.kubelet_serving = pki.server("kubelet-serving", self.node_name, [ip, self.node_name])
        self.sa = pki.service_account_keys()
        self.apiserver_kubelet = pki.client(
            "apiserver-kubelet", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        self.admin = pki.client("admin", "gpulab-test-admin", ("system:masters",))
        self.admin_kubeconfig = pki.kubeconfig(
            self.base / "admin.kubeconfig", self.server, self.admin, "admin"
        )
        kc = {}
        for name, user, groups in [
            ("controller-manager", "system:kube-controller-manager", ()),
            ("scheduler", "system:kube-scheduler", ()),
            ("kubelet", f"system:node:{self.node_name}", ("system:nodes",)),
            ("coredns", "gpulab-test:coredns", ()),
            ("kube-proxy", "system:kube-proxy", ()),  # bound to system:node-proxier
        ]:
            pair = pki.client(name, user, groups)
            kc[name] = pki.kubeconfig(self.base / f"{name}.kubeconfig", self.server, pair, name)
        self.kubeconfigs = kc

    def user_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> str:
        """A kubeconfig for ``user`` (a client certificate of the cluster's CA)."""
        stem = "user-" + user.replace(":", "-")
        pair = self.pki.client(stem, user, groups)
        return self.pki.kubeconfig(self.base / f"{stem}.kubeconfig", self.server, pair, stem)

    def _make_cgroup_root(self) -> None:
        for c in CONTROLLERS:
            d = CGROUP_V1 / c / self.cgroup_root
            if not (CGROUP_V1 / c).is_dir():
                continue
            d.mkdir(exist_ok=True)
            if c == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((CGROUP_V1 / c / f).read_text())

    # -- the processes ------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - the child's
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.base),
        }
        p = subprocess.Popen(
            [*self.net.exec(), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=self.base,
        )
        log.close()
        self.procs.append((name, p))

    def log_tail(self, name: str, lines: int = 25) -> str:
        path = self.base / "logs" / f"{name}.log"
        if not path.exists():
            return f"(no {path})"
        return f"--- {path} (last {lines} lines) ---\n" + "\n".join(
            path.read_text(errors="replace").splitlines()[-lines:]
        )

    def _wait(self, what: str, check, deadline: float, part: str) -> None:
        while True:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise ClusterError(
                        f"{name} exited ({p.returncode}) while waiting for {what}\n"
                        + self.log_tail(name)
                    )
            try:
                if check():
                    return
            except (OSError, ValueError, KeyError, subprocess.SubprocessError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}\n{self.log_tail(part)}")
            time.sleep(0.5)

    def _etcd_argv(self) -> list[str]:
        return [
            str(self.bins / "etcd"),
            f"--data-dir={self.base / 'etcd'}",
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=default=http://127.0.0.1:2380",
            "--listen-metrics-urls=",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        return [
            str(self.bins / "kube-apiserver"),
            "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=0.0.0.0",
            "--secure-port=6443",
            f"--advertise-address={self.net.node_ip}",
            f"--cert-dir={self.base / 'apiserver-certs'}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.pki.ca}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa.cert}",
            f"--service-account-signing-key-file={self.sa.key}",
            f"--service-cluster-ip-range={self.net.service_cidr}",
            f"--kubelet-client-certificate={self.apiserver_kubelet.cert}",
            f"--kubelet-client-key={self.apiserver_kubelet.key}",
            f"--kubelet-certificate-authority={self.pki.ca}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_argv(self) -> list[str]:
        kc = self.kubeconfigs["controller-manager"]
        return [
            str(self.bins / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            f"--service-account-private-key-file={self.sa.key}",
            f"--root-ca-file={self.pki.ca}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--v=1",
        ]

    def _scheduler_argv(self) -> list[str]:
        kc = self.kubeconfigs["scheduler"]
        return [
            str(self.bins / "kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--v=1",
        ]

    def _kube_proxy_argv(self) -> list[str]:
        return [
            str(self.bins / "kube-proxy"),
            f"--kubeconfig={self.kubeconfigs['kube-proxy']}",
            f"--hostname-override={self.node_name}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={self.net.pod_cidr}",
            # A pod calling a Service whose replica sits on the same bridge gets the
            # answer back through the node (no br_netfilter here), and so does the host.
            "--masquerade-all",
            f"--nodeport-addresses={self.net.node_ip}/32",
            # Host-wide conntrack settings are left alone.
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--healthz-bind-address=127.0.0.1:10256",
            "--metrics-bind-address=127.0.0.1:10249",
            "--v=1",
        ]

    def _coredns_argv(self) -> list[str]:
        corefile = self.base / "Corefile"
        corefile.write_text(
            ".:53 {\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
            f"        kubeconfig {self.kubeconfigs['coredns']} coredns\n"
            "        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }\n}\n"
        )
        return [str(self.bins / "coredns"), "-conf", str(corefile)]

    def _containerd_argv(self) -> list[str]:
        cni = self.base / "cni"
        cni.mkdir()
        (cni / "10-gpulab.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "gpulab-test",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "gkbr0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": self.net.pod_cidr}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.base / "cni-ipam"),
                            },
                        }
                    ],
                }
            )
        )
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = self.base / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{self.base / "containerd-root"}"
state = "{self.base / "containerd-state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{self.containerd_sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.base / "containerd-opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"""
        )
        return ["containerd", "--config", str(config)]

    def _import_images(self) -> None:
        archive = image_archive(self.cache / "images")
        r = subprocess.run(
            ["ctr", "-a", self.containerd_sock, "-n", "k8s.io", "images", "import", str(archive)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode:
            raise ClusterError(f"ctr images import {archive} failed: {r.stderr.strip()}")

    def _kubelet_argv(self) -> list[str]:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.net.node_ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": self.pki.ca},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": self.kubelet_serving.cert,
            "tlsPrivateKeyFile": self.kubelet_serving.key,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "enforceNodeAllocatable": [],
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "clusterDNS": [self.net.node_ip],
            "clusterDomain": "cluster.local",
            "resolvConf": "",
            "volumePluginDir": str(self.base / "kubelet-plugins"),
            "serializeImagePulls": False,
            "maxPods": 60,
        }
        path = self.base / "kubelet.json"
        path.write_text(json.dumps(config))
        return [
            str(self.bins / "kubelet"),
            f"--config={path}",
            f"--kubeconfig={self.kubeconfigs['kubelet']}",
            f"--root-dir={self.base / 'kubelet'}",
            f"--cert-dir={self.base / 'kubelet-certs'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.net.node_ip}",
            "--v=1",
        ]

    # -- the API, for the harness's own waits (the tests use kubernetes_asyncio) --------
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.pki.ca)
        ctx.load_cert_chain(self.admin.cert, self.admin.key)
        return ctx

    _MISSING = object()

    def request(self, method: str, path: str, body=None, missing=_MISSING, raw=False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=15) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing is not self._MISSING:
                return missing
            raise
        return text if raw else json.loads(text)

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def _node_ready(self):
        node = self.get(f"/api/v1/nodes/{self.node_name}", missing=None)
        conds = (node or {}).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def _probe_volume_binding(self, deadline: float) -> None:
        """A claim bound to a volume reserved for it, then both deleted: the
        controller-manager's volume binder works before any test relies on it (the
        suite binds the chart's claims the same way; no provisioner runs here)."""
        folder = self.base / "probe-volume"
        folder.mkdir()
        ns = "/api/v1/namespaces/default/persistentvolumeclaims"
        self.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "metadata": {"name": "gpulab-probe"},
                "spec": {
                    "capacity": {"storage": "1Mi"},
                    "accessModes": ["ReadWriteOnce"],
                    "hostPath": {"path": str(folder), "type": "Directory"},
                    "claimRef": {"namespace": "default", "name": "gpulab-probe"},
                },
            },
        )
        claim = {
            "metadata": {"name": "gpulab-probe"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Mi"}},
            },
        }
        self.request("POST", ns, claim)
        self._wait(
            "a probe claim to be bound (the volume binder)",
            lambda: self.get(f"{ns}/gpulab-probe")["status"].get("phase") == "Bound",
            deadline,
            "kube-controller-manager",
        )
        self.request("DELETE", f"{ns}/gpulab-probe")
        self.request("DELETE", "/api/v1/persistentvolumes/gpulab-probe")

    def apply_bootstrap(self) -> None:
        """What a kubeadm cluster has from the start and the harness's parts need:
        CoreDNS's read access."""
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "gpulab-test:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpulab-test:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpulab-test:coredns",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": "gpulab-test:coredns",
                }
            ],
        }
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        self.request("POST", f"{rbac}/clusterroles", role)
        self.request("POST", f"{rbac}/clusterrolebindings", binding)

    # -- stop ----------------------------------------------------------------------------
    def stop(self) -> None:
        if self._stopped or self.net is None:
            return
        self._stopped = True
        # etcd last: a kube-apiserver stopping removes its own address from the
        # "kubernetes" Endpoints, and with etcd gone it retried that until killed (15 s).
        for last in (False, True):
            procs = [p for name, p in reversed(self.procs) if (name == "etcd") == last]
            for p in procs:
                _signal_group(p, signal.SIGTERM)
            deadline = time.monotonic() + 15
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(p, signal.SIGKILL)
                    p.wait(timeout=10)
        self.procs.clear()
        self._cleanup()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _cleanup(self) -> None:
        """Remove what this slot's cluster made, whether or not it still runs."""
        # Containers and their shims: every process in the cgroup subtree, then any
        # containerd-shim started by this slot's containerd.
        for _ in range(3):
            pids = _cgroup_pids(CGROUP_V1 / "pids" / self.cgroup_root)
            pids |= _shims_of(str(self.base / "containerd.sock"))
            pids |= _processes_in(self.net.netns)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        # Mounts under the slot's folder (pods' volumes, overlay rootfs, shm), deepest first.
        base = str(self.base)
        for mount in sorted(_mounts_under(base), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)
        # The pods' network namespaces (containerd's cni-*), made while we ran.
        if os.path.isdir("/run/netns"):
            for name in set(os.listdir("/run/netns")) - self._netns_before:
                if name.startswith("cni-"):
                    path = f"/run/netns/{name}"
                    subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)
                    with contextlib.suppress(OSError):
                        os.unlink(path)
        for c in CONTROLLERS:
            _rmdir_tree(CGROUP_V1 / c / self.cgroup_root)
        self.net.remove()
        if self.base.exists():
            # Keep the logs (a failed run's evidence); drop the rest (images, etcd).
            logs = self.base.parent / f"{self.base.name}-logs"
            if logs.exists():  # the run before's, one generation back
                previous = logs.with_name(logs.name + ".previous")
                shutil.rmtree(previous, ignore_errors=True)
                logs.rename(previous)
            if (self.base / "logs").exists():
                shutil.move(str(self.base / "logs"), logs)
            shutil.rmtree(self.base, ignore_errors=True)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def _cgroup_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    if not root.is_dir():
        return pids
    for dirpath, _dirs, files in os.walk(root):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                pids |= {int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()}
    return pids


def _shims_of(sock: str) -> set[int]:
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and sock.encode() in argv:
            found.add(int(pid))
    return found


def _processes_in(netns: str) -> set[int]:
    r = sh("ip", "netns", "pids", netns, check=False)
    return {int(x) for x in r.stdout.split() if x.isdigit()}


def _mounts_under(base: str) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == base or point.startswith(base + "/"):
                out.append(point)
    return out


def _rmdir_tree(root: Path) -> None:
    if not root.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda w: len(w[0]), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
