"""A real Kubernetes cluster for the live-cluster suite (tests/kube/test_live_cluster.py).

:func:`start` builds the binaries once (``scripts/kube/build.sh``: Go modules from
the proxy, cached under ``~/.cache/gpulab-kube``) and starts a one-node cluster of
plain processes in a network namespace (:mod:`.cluster`); ``stop()`` removes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from . import images
from .cluster import ClusterError, LiveCluster

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "scripts" / "kube" / "build.sh"
CACHE = Path(os.environ.get("GPULAB_KUBE_CACHE", Path.home() / ".cache" / "gpulab-kube"))
NEEDS = {
    "containerd": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "ip": "iproute2",
}
BUILD_TIMEOUT_S = 2400


def missing_prerequisites() -> str | None:
    """One line saying what this machine lacks to run the cluster, or None."""
    if os.geteuid() != 0:
        return "the live cluster runs as root (network namespaces, containerd, cgroups)"
    if shutil.which("go") is None and not any(CACHE.glob("bin-*/kubelet")):
        return "no 'go' to build Kubernetes from its modules: install Go >= 1.24"
    lacking = sorted(
        {pkg for path, pkg in NEEDS.items() if not (os.path.exists(path) or shutil.which(path))}
    )
    if lacking:
        return f"missing Debian packages {' '.join(lacking)}: run `make system-deps` (as root)"
    if not Path("/sys/fs/cgroup/memory").is_dir():
        return "the kubelet (1.34, cgroupfs) expects cgroup v1 controllers in /sys/fs/cgroup"
    return None


def build(log=print) -> tuple[Path, float]:
    """The folder of built binaries and the seconds it took (near 0 from the cache).
    ``GPULAB_KUBE_BINS`` names a folder of binaries built elsewhere (nothing is built)."""
    t0 = time.monotonic()
    if os.environ.get("GPULAB_KUBE_BINS"):
        return Path(os.environ["GPULAB_KUBE_BINS"]), 0.0
    logfile = CACHE / "build.log"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as out:
        r = subprocess.run(
            ["nice", "-n", "10", str(BUILD)],
            stdout=subprocess.PIPE,
            stderr=out,
            timeout=BUILD_TIMEOUT_S,
            env={**os.environ, "GPULAB_KUBE_CACHE": str(CACHE)},
        )
    if r.returncode:
        tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-20:])
        raise ClusterError(f"{BUILD} failed ({r.returncode}); {logfile}:\n{tail}")
    return Path(r.stdout.decode().strip().splitlines()[-1]), time.monotonic() - t0


def start(log=print, timeout: float = 180.0) -> LiveCluster:
    bins, build_s = build(log)
    cluster = LiveCluster(bins, CACHE, log)
    cluster.build_seconds = build_s
    try:
        cluster.start(timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


__all__ = ["ClusterError", "LiveCluster", "images", "missing_prerequisites", "start"]
