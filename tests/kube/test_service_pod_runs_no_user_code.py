"""The chart's service pod runs no user code: it holds the hub's tokens and gpulab's
database, so jobs and endpoints are pods of their own, and a job for the "local"
backend (processes in that pod) is refused with the fix.

The service is the real one, in this process, started from the chart's rendered
files (helm-python-sdk, offline) as its pod starts it; only the hub's API is a
stand-in (``support.service``), and no Kubernetes API is reached: a refused job
never gets as far as a backend.
"""

from __future__ import annotations

import os

import psutil
import pytest
from fake_apiserver import FakeApiServer
from support.service import running_service
from support.wait import wait_until_async
from test_chart_config_files import rendered_data

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.backend.spec import JobSpec
from gpulab.service.jobs.backends import NoLocalJobs

pytestmark = pytest.mark.asyncio

REFUSAL = (
    "this site runs jobs as Kubernetes pods; the service pod runs no user code "
    "(leave --backend out, or an admin adds the box as a pool: c.InventorySettings.pools)"
)


@pytest.fixture
def chart_config(tmp_path, monkeypatch, offline_kubeconfig) -> str:
    """The service's gpulab_config.py as the chart renders it with its defaults, and
    the values file it reads beside it."""
    data = rendered_data({})
    values = tmp_path / "service-values.json"
    values.write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(values))
    return data["gpulab_config.py"]


async def test_chart_defaults_put_jobs_and_endpoints_in_pods_of_their_own(tmp_path, chart_config):
    async with running_service(tmp_path / "svc", chart_config) as svc:
        app = svc.app
        assert app.user_code_in_service is False
        assert isinstance(app.jobs.backends["kubernetes"], KubernetesBackend)
        # The site's one pool: no "local" beside it; old local jobs read as ended.
        assert set(app.jobs.backends) == {"kubernetes"}
        assert type(app.jobs.backend_of({"backend": "local", "pool": None})) is NoLocalJobs
        assert isinstance(app.deployments.serving, KubernetesServing)


async def test_a_local_job_is_refused_with_the_fix_and_starts_nothing(tmp_path, chart_config):
    async with running_service(tmp_path / "svc", chart_config) as svc:
        bob = svc.create_user("bob")
        children = {p.pid for p in psutil.Process().children(recursive=True)}
        spec = {"code": "print('in the service pod')", "nodes": 1}
        r = await svc.request("POST", "/jobs", token=bob, json={**spec, "backend": "local"})
        assert r.status_code == 400, r.text
        assert r.json() == {"error": REFUSAL}
        # Nothing queued, no job directory, no process.
        assert (await svc.request("GET", "/jobs", token=bob)).json() == []
        jobs_root = tmp_path / "svc" / "jobs"
        assert not jobs_root.exists() or os.listdir(jobs_root) == []
        assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
        # The fix works: the same job for the site's backend passes its check (a pod).
        spec = JobSpec(
            **spec, backend="kubernetes", image="registry.example/gpulab:1", id="f00dfeedbeef"
        )
        spec.validate()
        svc.app.jobs.backends["kubernetes"].check(spec)


async def test_a_job_that_names_no_backend_becomes_a_kubernetes_job(tmp_path, chart_config):
    """The site's backend is every job's default: no --backend, and the job is an
    Indexed Job on the cluster (the API server is the fake one), never a process in
    the service pod."""
    api = await FakeApiServer().start()
    try:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        config = chart_config + f"c.KubernetesJobsSettings.kubeconfig = {kubeconfig!r}\n"
        async with running_service(tmp_path / "svc", config) as svc:
            bob = svc.create_user("bob")
            children = {p.pid for p in psutil.Process().children(recursive=True)}
            body = {"code": "print(1)", "image": "registry.example/gpulab:1"}  # no backend
            r = await svc.request("POST", "/jobs", token=bob, json=body)
            assert r.status_code == 201, r.text
            job = r.json()
            assert (job["pool"], job["backend"]) == ("kubernetes", "kubernetes")
            name = f"gpulab-{job['id']}"

            def made() -> dict | None:
                return next(
                    (o for k, o in api.objects.items() if "/jobs/" in k and k.endswith(name)),
                    None,
                )

            await wait_until_async(made, "the Job on the API server", 60)
            assert made()["spec"]["completionMode"] == "Indexed"
            assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    finally:
        await api.stop()
