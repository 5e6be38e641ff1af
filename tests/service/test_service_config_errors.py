"""A configuration the service cannot work with stops it before it listens: one
log line that says what to fix, exit code 1, the port never bound."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

OFFLINE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "http://127.0.0.1:9"}}]
contexts: [{name: offline, context: {cluster: offline, user: nobody}}]
current-context: offline
users: [{name: nobody, user: {token: never-used}}]
"""

CASES = {
    "jobs key": (
        'c.GpuLabService.kubernetes_jobs = {"namespace": "ml", "jobs_pvc": "x", "colour": "red"}',
        "unknown key colour",
    ),
    "jobs settings": ('c.GpuLabService.jobs_backend_class = "kubernetes"', "need 'namespace'"),
    "deployments key": (
        'c.GpuLabService.kubernetes_deployments = {"namespace": "ml", "flavour": 1}',
        "unknown key flavour",
    ),
    "policy": (
        'c.InventorySettings.policy = "tightest"',
        "c.InventorySettings.policy: unknown placement policy 'tightest'",
    ),
    "inventory source": (
        'c.InventorySettings.inventory_source = "kube"',
        "inventory_source = 'kube' is not a source",
    ),
    "no cluster": (
        'c.InventorySettings.inventory_source = "kubernetes"\n'
        "c.KubernetesInventory.kubeconfig = {kubeconfig!r}",
        "cluster's nodes cannot be listed",
    ),
    "backend class": (
        'c.GpuLabService.jobs_backend_class = "gpulab.nowhere.Backend"',
        "jobs_backend_class",
    ),
    "pool name": (
        'c.InventorySettings.pools = [{"name": "Big Box", "jobs": "local"}]',
        "c.InventorySettings.pools[0]['name'] = 'Big Box': give 1-32 lowercase letters",
    ),
    "pool key": (
        'c.InventorySettings.pools = [{"name": "box", "jobs": "local", "gpus": 2}]',
        "c.InventorySettings.pools[0] has unknown key gpus",
    ),
    "server pool": (
        'c.InventorySettings.server_pool = "slurm"',
        "c.InventorySettings.server_pool = 'slurm' is not a pool; this site's pools: local",
    ),
    # Ranges, checked as the setting is set (traitlets' @validate).
    "a duration that must be positive": (
        "c.Alerting.alert_interval_seconds = 0",
        "c.Alerting.alert_interval_seconds must be positive, got 0",
    ),
    "a duration that may be 0 (off)": (
        "c.Hibernation.hibernate_idle_seconds = -5",
        "c.Hibernation.hibernate_idle_seconds must be 0 (off) or more, got -5",
    ),
    # The chart's service pod runs no user code; a local backend there is a mistake.
    "local jobs without user code here": (
        "c.GpuLabService.user_code_in_service = False",
        "jobs_backend_class is 'local' but c.GpuLabService.user_code_in_service is False: "
        "jobs' ranks would run in the service's own pod",
    ),
    "local endpoints without user code here": (
        "c.GpuLabService.user_code_in_service = False\n"
        'c.GpuLabService.kubernetes_jobs = {"namespace": "ml", "jobs_pvc": "x"}',
        "serving_backend_class is 'local' but c.GpuLabService.user_code_in_service is "
        "False: endpoints' replicas would run in the service's own pod",
    ),
}


@pytest.fixture
def held_port():
    """A port this test listens on: a service that got as far as listening would fail
    with 'Address already in use' instead of the configuration message."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_configuration_stops_before_listening(case, tmp_path, held_port):
    config, message = CASES[case]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(OFFLINE_KUBECONFIG)
    config = config.replace("{kubeconfig!r}", repr(str(kubeconfig)))
    (tmp_path / "gpulab_config.py").write_text(config + "\n")
    env = {
        **os.environ,
        "GPULAB_DATA_DIR": str(tmp_path),
        "GPULAB_SIMULATE_GPUS": "",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        "JUPYTERHUB_API_TOKEN": "not-used",
        "KUBECONFIG": str(kubeconfig),
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{held_port}",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "gpulab.service"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    [line] = [x for x in out.splitlines() if "Configuration error" in x]
    assert message in line, out
    assert "Traceback" not in out and "Address already in use" not in out, out
    assert "gpulab service on" not in out, out
