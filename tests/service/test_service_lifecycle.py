"""The service is built in one place (initialize's ordered init_* steps), its managers
are declared traits, every background task it starts ends with stop(), and backends are
chosen by class settings (the old dict settings still select them, with a warning)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.wait import wait_until_async

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.local_inventory import LocalInventory
from gpulab.service.app import GpuLabService
from gpulab.service.jobs.manager import JobManager
from gpulab.service.plugins import ConfigError
from gpulab.service.tasks import run_unless

STEPS = [
    "init_logging",
    "init_settings",
    "init_hub",
    "init_db",
    "init_ledger",
    "init_audit",
    "init_telemetry_store",
    "init_jobs",
    "init_deployments",
    "init_reconcile",
    "init_telemetry",
    "init_handlers",
]


@pytest.fixture
def make_service(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GPULAB_SIMULATE_GPUS", "2xA100-80GB")
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:9/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "unused")

    def make(config: str = "") -> GpuLabService:
        GpuLabService.clear_instance()
        path = tmp_path / "gpulab_config.py"
        path.write_text(config)
        app = GpuLabService()
        app.initialize([f"--config={path}"])
        return app

    return make


def test_initialize_runs_the_steps_in_order(make_service, monkeypatch):
    seen = []
    for name in STEPS:
        step = getattr(GpuLabService, name)
        monkeypatch.setattr(
            GpuLabService, name, lambda self, _s=step, _n=name: (seen.append(_n), _s(self))[1]
        )
    app = make_service()
    assert seen == STEPS
    assert isinstance(app.jobs, JobManager) and app.deployments is not None
    assert app.telemetry is not None and app.tornado_app is not None and len(app.gpus) == 2
    assert app.inventory_settings.inventory_class is LocalInventory
    for name in ("jobs", "deployments", "ledger", "telemetry", "sampler", "reconciler"):
        assert name in GpuLabService.class_trait_names()


def test_stop_ends_every_background_task(make_service):
    app = make_service(
        "c.TelemetrySettings.local_sampler = True\nc.TelemetrySettings.sample_interval = 0.05\n"
    )

    async def run():
        before = asyncio.all_tasks()
        await app.start_managers()
        loops = {"gpulab-reconcile", "gpulab-job-queue", "gpulab-local-sampler"}
        await wait_until_async(
            lambda: loops <= {t.get_name() for t in asyncio.all_tasks() - before},
            "the managers' loops to run",
            timeout=30,
        )
        started = asyncio.all_tasks() - before
        await app.stop()
        await asyncio.sleep(0)
        return [t for t in started if not t.done()]

    assert asyncio.run(run()) == []


def test_kubernetes_jobs_by_class_and_settings(make_service):
    app = make_service(
        'c.GpuLabService.jobs_backend_class = "kubernetes"\n'
        'c.KubernetesJobsSettings.namespace = "research"\n'
        'c.KubernetesJobsSettings.jobs_pvc = "team-jobs"\n'
        'c.KubernetesJobsSettings.queue = "research"\n'
    )
    kube = app.jobs.backends["kubernetes"]
    assert isinstance(kube, KubernetesBackend) and kube.namespace == "research"
    assert kube.options.jobs_pvc == "team-jobs"
    assert kube.options.labels["kueue.x-k8s.io/queue-name"] == "research"
    # The site's backend is its one pool: no local jobs beside it.
    assert set(app.jobs.backends) == {"kubernetes"}
    assert app.site_pools.default == "kubernetes"


def test_the_old_dict_still_selects_kubernetes_with_a_warning(make_service, caplog):
    with caplog.at_level(logging.WARNING, logger="gpulab.service"):
        app = make_service(
            'c.GpuLabService.kubernetes_jobs = {"namespace": "ml", '
            '"jobs_pvc": "gpulab-jobs", "rdzv_port": 29500}\n'
        )
    assert app.jobs_backend_class is KubernetesBackend
    assert app.jobs.backends["kubernetes"].options.rdzv_port == 29500
    assert "kubernetes_jobs is deprecated" in caplog.text


def test_local_only_by_default(make_service):
    app = make_service()
    assert set(app.jobs.backends) == {"local"}


def test_a_sites_own_backend_is_a_class_and_an_entry_point(make_service, tmp_path, monkeypatch):
    """A package of the site's, installed beside gpulab (here: a module and its
    dist-info on sys.path, as pip lays them out), adds a job backend to the
    ``gpulab.jobs_backends`` entry point group; settings then name it like gpulab's own."""
    site = tmp_path / "site-packages"
    (site / "labsite-1.0.dist-info").mkdir(parents=True)
    (site / "labsite-1.0.dist-info" / "METADATA").write_text("Name: labsite\nVersion: 1.0\n")
    (site / "labsite-1.0.dist-info" / "entry_points.txt").write_text(
        "[gpulab.jobs_backends]\nlabcluster = labsite_backend:LabCluster\n"
    )
    (site / "labsite_backend.py").write_text(
        "from gpulab.backend.local import LocalBackend\n\n\n"
        "class LabCluster(LocalBackend):\n    name = 'labcluster'\n"
    )
    monkeypatch.syspath_prepend(str(site))
    app = make_service('c.InventorySettings.pools = [{"name": "lab", "jobs": "labcluster"}]\n')
    backend = app.jobs.backends["lab"]
    assert type(backend).__name__ == "LabCluster" and app.site_pools.list[0].kind == "labcluster"
    app = make_service('c.GpuLabService.jobs_backend_class = "labcluster"\n')
    assert set(app.jobs.backends) == {"labcluster"}
    with pytest.raises(ConfigError, match="'labcluster'"):  # the names it offers include it
        make_service('c.InventorySettings.pools = [{"name": "lab", "jobs": "nowhere"}]\n')


class SlowToStart:
    """A manager whose start takes until it is cancelled (the standby router's start
    takes seconds); it notes its stop."""

    def __init__(self):
        self.starting = asyncio.Event()
        self.stopped = False

    async def start(self):
        self.starting.set()
        await asyncio.Event().wait()

    async def stop(self):
        self.stopped = True


def test_a_stop_during_the_start_cuts_it_short_and_stops_what_started(make_service, monkeypatch):
    app = make_service()
    slow = SlowToStart()
    managers = app.managers()
    where = managers.index(app.deployments)  # where the standby router starts
    monkeypatch.setattr(app, "managers", lambda: [*managers[:where], slow, *managers[where:]])

    async def run():
        stopping = asyncio.Event()
        starting = asyncio.ensure_future(run_unless(stopping, app.start_managers()))
        await slow.starting.wait()
        stopping.set()  # Ctrl-C while the managers start
        await asyncio.wait_for(starting, timeout=30)  # returns: the start is cut short
        await app.stop()

    asyncio.run(run())
    assert slow.stopped  # the one whose start was cut short is stopped too
