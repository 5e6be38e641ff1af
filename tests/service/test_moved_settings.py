"""Settings that moved off GpuLabService to the part that reads them (c.Thresholds,
c.JobQueue...): the new name works, the old one still takes effect with one warning
line that names the new place, and a value out of range stops the start with a
message naming the setting."""

from __future__ import annotations

import logging

import pytest
from support.service import running_service
from traitlets import TraitError
from traitlets.config import Config, PyFileConfigLoader

from gpulab.service.app import MOVED_SETTINGS, SETTINGS_PARTS, GpuLabService
from gpulab.service.plugins import ConfigError


def built(text: str, tmp_path) -> GpuLabService:
    """The service's settings parts as a gpulab_config.py of ``text`` makes them (the
    file loaded as initialize() loads it, without starting anything)."""
    path = tmp_path / "gpulab_config.py"
    path.write_text(text)
    svc = GpuLabService()
    svc.update_config(PyFileConfigLoader(str(path)).load_config())
    svc.init_settings()
    return svc


def test_an_old_name_still_takes_effect_and_says_where_it_is_now(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="gpulab.service"):
        svc = built(
            "c.GpuLabService.alert_interval_seconds = 7\n"
            "c.GpuLabService.hibernate_max_bytes = 10**9\n"
            "c.GpuLabService.reconcile_interval = 30\n",  # a setting that stayed
            tmp_path,
        )
    assert svc.alerting.alert_interval_seconds == 7
    assert svc.hibernation.hibernate_max_bytes == 10**9
    assert svc.reconcile_interval == 30
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "c.GpuLabService.alert_interval_seconds is now c.Alerting.alert_interval_seconds",
        "c.GpuLabService.hibernate_max_bytes is now c.Hibernation.hibernate_max_bytes",
    ]


@pytest.mark.parametrize(
    "part, old, old_value, new, new_value",
    [
        ("TelemetrySettings", "sample_interval", 2.5, "local_sampler", False),
        ("InventorySettings", "simulate_gpus", "2xA100-80GB", "policy", "best-fit"),
        ("SharingSettings", "user_quota_milli", {"alice": 4000}, "group_quota_milli", {"x": 1}),
    ],
)
def test_an_old_name_of_a_newer_part_is_carried_there(
    tmp_path, caplog, part, old, old_value, new, new_value
):
    with caplog.at_level(logging.INFO, logger="gpulab.service"):
        svc = built(
            f"c.GpuLabService.{old} = {old_value!r}\n"
            f"c.{part}.{new} = {new_value!r}\n",  # the new name: no warning
            tmp_path,
        )
    settings = {
        "TelemetrySettings": svc.telemetry_settings,
        "InventorySettings": svc.inventory_settings,
        "SharingSettings": svc.sharing_settings,
    }[part]
    assert (getattr(settings, old), getattr(settings, new)) == (old_value, new_value)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"c.GpuLabService.{old} is now c.{part}.{old}"]


def test_the_node_selector_is_the_kubernetes_inventorys_label_selector(tmp_path, caplog):
    """c.GpuLabService.kubernetes_node_selector was a second name for it."""
    from gpulab.backend.kubernetes.inventory import KubernetesInventory

    with caplog.at_level(logging.INFO, logger="gpulab.service"):
        svc = built('c.GpuLabService.kubernetes_node_selector = "gpu=yes"\n', tmp_path)
    assert KubernetesInventory(parent=svc).label_selector == "gpu=yes"
    assert "kubernetes_node_selector" not in GpuLabService.class_trait_names()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "c.GpuLabService.kubernetes_node_selector is now c.KubernetesInventory.label_selector"
    ]
    svc = built(
        'c.KubernetesInventory.label_selector = "pool=big"\n'
        'c.GpuLabService.kubernetes_node_selector = "gpu=yes"\n',
        tmp_path,
    )
    assert KubernetesInventory(parent=svc).label_selector == "pool=big"


def test_the_design_documents_name_stays_without_a_warning(tmp_path, caplog):
    # DESIGN.md names c.GpuLabService.job_stall_seconds as a contract.
    with caplog.at_level(logging.INFO, logger="gpulab.service"):
        svc = built("c.GpuLabService.job_stall_seconds = 90\n", tmp_path)
    assert svc.thresholds.job_stall_seconds == 90
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_new_name_works_and_wins_over_the_old(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="gpulab.service"):
        svc = built("c.Thresholds.alert_slice_idle_seconds = 7200\n", tmp_path)
    assert svc.thresholds.alert_slice_idle_seconds == 7200
    assert not caplog.records  # the new name warns of nothing
    svc = built(
        "c.Thresholds.alert_disk_used_ratio = 0.95\nc.GpuLabService.alert_disk_used_ratio = 0.5\n",
        tmp_path,
    )
    assert svc.thresholds.alert_disk_used_ratio == 0.95


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "c.Thresholds.alert_quota_used_ratio = 90",
            "c.Thresholds.alert_quota_used_ratio is a share from 0 to 1",
        ),
        (
            "c.Alerting.alert_interval_seconds = 0",
            "c.Alerting.alert_interval_seconds must be positive, got 0",
        ),
        (
            "c.Endpoints.endpoint_router_port = 70000",
            "c.Endpoints.endpoint_router_port is a TCP port from 1 to 65535",
        ),
        (
            "c.GpuLabService.max_job_ranks = 0",
            "c.JobQueue.max_job_ranks must be positive, got 0",
        ),
        (
            "c.GpuLabService.policy = 'tightest'",
            "c.InventorySettings.policy: unknown placement policy 'tightest'",
        ),
        (
            "c.GpuLabService.hibernate_idle_seconds = -5",
            "c.Hibernation.hibernate_idle_seconds must be 0 (off) or more, got -5",
        ),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_setting(tmp_path, line, message):
    with pytest.raises(TraitError) as refused:
        built(line + "\n", tmp_path)
    assert str(refused.value).startswith(message)


async def test_the_running_service_reads_an_old_name_from_its_config_file(tmp_path):
    async with running_service(
        tmp_path / "svc", "c.GpuLabService.alert_interval_seconds = 42\n"
    ) as svc:
        assert svc.app.alerts.interval == 42
    with pytest.raises(ConfigError, match="c.Alerting.alert_interval_seconds must be positive"):
        async with running_service(
            tmp_path / "bad", "c.GpuLabService.alert_interval_seconds = -1\n"
        ):
            pass


def test_every_moved_setting_has_one_home():
    """A moved name is no longer a trait of the service (the map would be ambiguous),
    each part shows in --help-all, and every setting of a part is a moved name."""
    assert not set(MOVED_SETTINGS) & set(GpuLabService.class_trait_names())
    assert set(SETTINGS_PARTS) <= set(GpuLabService.classes)
    for part in SETTINGS_PARTS:
        for name in part.class_own_traits(config=True):
            assert MOVED_SETTINGS[name] == part.__name__
            assert f"c.{part.__name__}.{name} = " in part.class_traits()[name].help
    cfg = Config()
    cfg.GpuLabService.max_job_ranks_typo = 1  # an unknown name is not carried anywhere
    GpuLabService(config=cfg)
    assert "max_job_ranks_typo" in cfg.GpuLabService
