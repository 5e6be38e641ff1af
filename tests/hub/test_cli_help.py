"""`gpulab up --help-all` and docs/reference/config.md: gpulab's settings, and only those."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jupyterhub.spawner import Spawner

from gpulab.hub_ext import config_reference as ref

GPULAB = str(Path(sys.executable).with_name("gpulab"))
ROOT = Path(__file__).resolve().parents[2]
CONFIG_MD = ROOT / "docs" / "reference" / "config.md"


@pytest.fixture(scope="module")
def help_all() -> str:
    r = subprocess.run(
        [GPULAB, "up", "--help-all"], capture_output=True, text=True, timeout=120, check=True
    )
    return r.stdout


@pytest.fixture(scope="module")
def secs():
    return ref.sections()


def test_help_all_lists_every_gpulab_class(help_all):
    for name in (
        "GpuLabService",
        "FractionalLocalSpawner",
        "FractionalKubeSpawner",
        "UserAccounts",
        "AccountLimits",
        "GpuLabNativeAuthenticator",
        "KubernetesJobsSettings",
        "KubernetesInventory",
    ):
        assert f"\n# {name}\n" in help_all, name
    assert "c.UserAccounts.prefix" in help_all
    assert "c.SharingSettings.default_user_quota_milli = 1000" in help_all
    # The mixin's traits show under each spawner that users configure.
    assert "# c.FractionalLocalSpawner.gpulab_api_url = ''" in help_all
    assert "# c.FractionalKubeSpawner.gpulab_api_url = ''" in help_all
    assert "GpuLabServiceMixin" not in help_all
    # A default gpulab sets is the one shown.
    assert "# c.GpuLabNativeAuthenticator.minimum_password_length = 8" in help_all
    assert "#  Default: computed at start: os.geteuid() == 0" in help_all


def test_help_all_leaves_jupyterhubs_own_settings_out(help_all):
    assert not re.search(r"\bSpawner\.http_timeout\b|\.http_timeout = ", help_all)
    ours = {name for name, trait in Spawner.class_traits(config=True).items()}
    shown = set(re.findall(r"^# c\.Fractional\w+Spawner\.(\w+) = ", help_all, re.M))
    # Of the Spawner's settings only those whose default gpulab sets (the spawn form).
    assert shown & ours <= {"options_form", "options_from_form"}, shown & ours
    # JupyterHub's own settings would add thousands of lines; gpulab's grow with it.
    assert len(help_all.splitlines()) < 2500


def test_every_class_with_settings_is_listed(secs):
    # Found from the source: a class added later shows without being listed anywhere.
    listed = {s.name for s in secs}
    found = {name for _, name in ref.discover()}
    # Mixins and bases whose settings show under the classes that use them (the spawners,
    # the service).
    hidden = {
        "GpuLabServiceMixin",
        "SharingSettings",
        "FractionalHostSpawner",
    }
    assert found - listed <= hidden, found - listed
    for s in secs:
        assert not s.missing, s.missing  # the test extra installs kubespawner
        for t in s.settings:
            assert t.help.strip(), f"c.{s.name}.{t.name} has no help"


def test_examples_stay_whole_lines(help_all, secs):
    # An example is copied into gpulab_config.py: never wrapped mid-statement.
    shown = set(help_all.splitlines())
    for s in secs:
        for t in s.settings:
            if t.inherited_from:
                continue
            for code, lines in ref.paragraphs(t.help):
                for line in lines if code else ():
                    assert f"#  {line}" in shown or f"## {line}" in shown, line


def test_config_reference_is_generated_from_the_traits(secs):
    assert CONFIG_MD.read_text() == ref.as_markdown(secs), (
        f"docs/reference/config.md is out of date; regenerate it with:\n  {ref.REGENERATE}"
    )


def test_config_reference_command_prints_it():
    r = subprocess.run(
        [sys.executable, "-m", "gpulab.hub_ext.config_reference"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=os.fspath(ROOT),
    )
    assert r.stdout.startswith("# Configuration reference\n")
    assert "### `c.UserAccounts.prefix`" in r.stdout
