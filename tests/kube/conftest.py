"""Fixtures for the Kubernetes tests. Nothing here reaches a cluster.

KubeSpawner loads client credentials when it is constructed (not when it
builds a pod), so the spawner tests point the kubeconfig at a file naming an
address nothing listens on; no request is ever made to it.
"""

from __future__ import annotations

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
