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
