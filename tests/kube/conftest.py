"""Fixtures for the Kubernetes tests. Only ``live_kube`` reaches a cluster (a real one).

KubeSpawner loads client credentials when it is constructed (not when it
builds a pod), so the spawner tests point the kubeconfig at a file naming an
address nothing listens on; no request is ever made to it.
"""

from __future__ import annotations

import contextlib
import os

import pytest

OFFLINE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: offline
  cluster: {server: "http://127.0.0.1:9"}
contexts:
- name: offline
  context: {cluster: offline, user: nobody}
current-context: offline
users:
- name: nobody
  user: {token: offline-tests-never-connect}
"""


@pytest.fixture(scope="session")
def offline_kubeconfig(tmp_path_factory):
    from kubernetes_asyncio.config import kube_config

    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(OFFLINE_KUBECONFIG)
    # kubernetes_asyncio reads $KUBECONFIG once, at import.
    mp = pytest.MonkeyPatch()
    mp.setenv("KUBECONFIG", str(path))
    mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    yield str(path)
    mp.undo()


@pytest.fixture
async def job_cluster(tmp_path):
    """``await make(groups, server_class, **settings)``: a fake API server (``fake_apiserver``'s
    ``FakeApiServer`` or the subclass ``server_class``, as no cluster runs here) and a
    Kubernetes job backend of ``settings`` that talks to it, in namespace ``gpulab`` with
    jobs on claim ``gpulab-jobs``; both stop after the test."""
    from fake_apiserver import FakeApiServer

    from gpulab.backend.kubernetes.backend import KubernetesBackend

    made = []

    async def make(groups=("batch", "apps"), server_class=FakeApiServer, **settings):
        server = await server_class(groups).start()
        backend = KubernetesBackend(
            str(tmp_path / "jobs"),
            namespace="gpulab",
            jobs_pvc="gpulab-jobs",
            kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"),
            **settings,
        )
        made.append((server, backend))
        return server, backend

    yield make
    for server, backend in made:
        await backend.close()
        await server.stop()


# -- the live cluster (test_live_cluster.py) ---------------------------------------------


class SiteCluster:
    """A site's own cluster (``GPULAB_TEST_KUBECONFIG``): nothing started, nothing stopped."""

    local = False
    build_seconds = start_seconds = None

    def __init__(self, kubeconfig: str):
        self.admin_kubeconfig = kubeconfig
        self.image = os.environ.get("GPULAB_TEST_IMAGE", "python:3.11-slim")
        self.version = None


def _say(config, line: str) -> None:
    """A line in pytest's own output, past the capture: the cluster's figures."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or hasattr(config, "workeroutput"):
        # An xdist worker: its output does not reach the terminal; the controller
        # prints these lines when the worker ends (pytest_testnodedown, tests/conftest.py).
        config.workeroutput.setdefault("gpulab_say", []).append(line)
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.ensure_newline()
        reporter.write_line(line)


@pytest.fixture(scope="session")
def say(request):
    """``say(line)``: print a line in pytest's output even while it captures."""
    return lambda line: _say(request.config, line)


@pytest.fixture(scope="module")
def live_kube(request):
    """The cluster the live suite runs against: a site's (``GPULAB_TEST_KUBECONFIG``),
    else one the suite builds (cached) and starts (``tests/support/live_kube``), and
    removes when the module's tests end (module scope: under xdist the worker goes on
    to other files, which need its memory; a second module would start its own, ~10 s)."""
    site = os.environ.get("GPULAB_TEST_KUBECONFIG")
    if site:
        yield SiteCluster(site)
        return
    if os.environ.get("GPULAB_TEST_LIVE_KUBE") == "0":
        pytest.skip(
            "GPULAB_TEST_LIVE_KUBE=0: the live cluster is not started (make test-kube runs it)"
        )
    from support import live_kube

    problem = live_kube.missing_prerequisites()
    if problem:
        pytest.fail(f"live-cluster suite cannot run: {problem}", pytrace=False)
    cluster = live_kube.start()
    cluster.local = True
    cluster.image = live_kube.images.PYTHON_IMAGE
    _say(
        request.config,
        f"live cluster: binaries {cluster.build_seconds:.1f} s "
        f"(scripts/kube/build.sh, cached), started in {cluster.start_seconds:.1f} s "
        f"(node {cluster.node_name} at {cluster.net.node_ip})",
    )
    try:
        yield cluster
    finally:
        cluster.stop()
