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
from support.service import running_service
from test_chart_config_files import rendered_data

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.kubernetes.serving import KubernetesServing
from gpulab.backend.spec import JobSpec
from gpulab.service.backends import NoLocalJobs

pytestmark = pytest.mark.asyncio

REFUSAL = (
    "this site runs jobs as Kubernetes pods; the service pod runs no user code "
    "(use --backend kubernetes)"
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
        # "local" stays a name old jobs are read under; it never starts a process.
        assert type(app.jobs.backends["local"]) is NoLocalJobs
        assert isinstance(app.deployments.serving, KubernetesServing)


@pytest.mark.parametrize("backend", ["local", None], ids=["local", "no backend named"])
async def test_a_local_job_is_refused_with_the_fix_and_starts_nothing(
    tmp_path, chart_config, backend
):
    async with running_service(tmp_path / "svc", chart_config) as svc:
        bob = svc.create_user("bob")
        children = {p.pid for p in psutil.Process().children(recursive=True)}
        spec = {"code": "print('in the service pod')", "nodes": 1}
        named = {"backend": backend} if backend else {}  # none named: the spec's default
        r = await svc.request("POST", "/jobs", token=bob, json={**spec, **named})
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
