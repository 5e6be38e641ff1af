"""The local and the Slurm spawner share FractionalHostSpawner, and the Slurm one is no
local process spawner: its settings, state and form are its own; the names sites use
(entry points, ``c.FractionalLocalSpawner.*``) still work."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from jupyterhub.spawner import LocalProcessSpawner
from traitlets.config import Config

from gpulab.spawner.host import FractionalHostSpawner
from gpulab.spawner.local import FractionalLocalSpawner
from gpulab.spawner.slurm import FractionalSlurmSpawner

AVAILABILITY = {
    "sizes": [
        {"milli": 0, "label": "No GPU", "available": True, "count": 0, "reason": ""},
        {"milli": 250, "label": "1/4 GPU", "available": True, "count": 4, "reason": ""},
    ],
    "held_milli": 0,
}
INVENTORY = {"nodes": [{"name": "n1", "gpus": [{"uuid": "GPU-1"}, {"uuid": "GPU-2"}]}]}


def test_the_entry_points_name_the_same_classes():
    spawners = {e.name: e for e in entry_points(group="jupyterhub.spawners")}
    assert spawners["gpulab-local"].load() is FractionalLocalSpawner
    assert spawners["gpulab-slurm"].load() is FractionalSlurmSpawner


def test_the_slurm_spawner_is_no_local_process():
    assert issubclass(FractionalLocalSpawner, FractionalHostSpawner)
    assert issubclass(FractionalSlurmSpawner, FractionalHostSpawner)
    assert not issubclass(FractionalSlurmSpawner, LocalProcessSpawner)
    slurm = set(FractionalSlurmSpawner.class_trait_names(config=True))
    # A local process's settings are not the Slurm spawner's any more.
    assert not slurm & {"popen_kwargs", "shell_cmd", "home_dir_template", "kill_timeout"}
    shared = {"gpulab_api_url", "gpulab_api_token", "kernel_dir", "cache_root"}
    assert shared <= slurm and shared <= set(FractionalLocalSpawner.class_trait_names())


def test_a_slurm_servers_state_has_no_pid_or_cgroup():
    spawner = FractionalSlurmSpawner()
    spawner.slurm_job_id, spawner.slurm_job_dir = "42", "/home/a/.gpulab/slurm/default"
    assert spawner.get_state() == {
        "slurm_job_id": "42",
        "slurm_job_dir": "/home/a/.gpulab/slurm/default",
    }
    spawner.load_state({"slurm_job_id": "7", "slurm_job_dir": "/d", "pid": 123})
    assert (spawner.slurm_job_id, getattr(spawner, "pid", None)) == ("7", None)


def test_shared_settings_reach_both_and_the_local_sections_still_reach_slurm(caplog):
    c = Config()
    c.FractionalHostSpawner.gpulab_api_url = "http://service/api/v1"
    c.FractionalHostSpawner.kernel_dir = "/srv/jupyter"
    c.FractionalHostSpawner.cache_root = "/var/cache/host"
    # A site's gpulab_config.py of before the shared base (the Slurm spawner was a
    # FractionalLocalSpawner then), with a local process's setting among them.
    c.FractionalLocalSpawner.gpulab_api_token = "site-token"
    c.FractionalLocalSpawner.cache_root = "/var/cache/local"
    c.FractionalLocalSpawner.home_dir_template = "/home/{username}"
    c.FractionalSlurmSpawner.kernel_dir = "/shared/jupyter"
    with caplog.at_level(logging.WARNING):
        slurm = FractionalSlurmSpawner(config=c)
    assert slurm.gpulab_api_url == "http://service/api/v1"
    assert slurm.gpulab_api_token == "site-token"  # the local section ranks above the base
    assert slurm.cache_root == "/var/cache/local"
    assert slurm.kernel_dir == "/shared/jupyter"  # and below the Slurm spawner's own
    assert "not recognized" not in caplog.text  # home_dir_template is not offered to it
    local = FractionalLocalSpawner(config=c)
    assert (local.gpulab_api_url, local.kernel_dir) == ("http://service/api/v1", "/srv/jupyter")
    assert (local.cache_root, local.home_dir_template) == ("/var/cache/local", "/home/{username}")


def test_only_the_local_spawner_shows_its_cgroup_limits_on_the_form():
    c = Config()
    c.UserAccounts.enabled = True
    # The local spawner holds each server to a cgroup; Slurm's own limits (sbatch_args)
    # are the site's, so the Slurm form shows none of gpulab's.
    limits = FractionalLocalSpawner(config=c).form_limits(AVAILABILITY, INVENTORY)
    assert set(limits) == {0, 250} and all(limits.values())
    # In words a user reads: what the server gets, not the mechanism's name.
    assert not any("cgroup" in text for text in limits.values()), limits
    assert FractionalSlurmSpawner(config=c).form_limits(AVAILABILITY, INVENTORY) is None
    c.UserAccounts.enabled = False
    assert FractionalLocalSpawner(config=c).form_limits(AVAILABILITY, INVENTORY) is None
