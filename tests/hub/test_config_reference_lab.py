"""The configuration reference lists the JupyterLab server extension's settings too,
last, and says they belong to the users' servers, not to gpulab_config.py."""

from __future__ import annotations

import pytest

from gpulab.hub_ext import config_reference as ref
from gpulab.lab.settings import GpuLabLab


@pytest.fixture(scope="module")
def secs():
    return ref.sections()


def test_the_labs_settings_are_found_in_its_source(secs):
    assert ("gpulab.lab.settings", "GpuLabLab") in ref.discover()
    lab = next(s for s in secs if s.name == "GpuLabLab")
    assert {t.name for t in lab.settings} == set(GpuLabLab.class_traits(config=True))
    assert all(t.help.strip() for t in lab.settings)


def test_the_servers_settings_come_last_and_say_where_they_go(secs):
    in_server = [s.in_server for s in secs]
    assert in_server == sorted(in_server) and in_server[-1], "the servers' sections come last"
    lab = next(s for s in secs if s.name == "GpuLabLab")
    assert "jupyter_server_config.py" in lab.where()
    assert "c.Spawner.args" in lab.where()
    # The hub's own classes go in gpulab_config.py: no such note there.
    assert not next(s for s in secs if s.name == "GpuLabService").where()


def test_both_references_show_them(secs):
    markdown = ref.as_markdown(secs)
    assert "- [`GpuLabLab`](#gpulablab)" in markdown
    assert "### `c.GpuLabLab.request_timeout`" in markdown
    assert "Float, default `30.0`" in markdown.split("## GpuLabLab")[1]
    config = ref.as_config_file(secs)
    assert "# c.GpuLabLab.max_body_bytes = 1048576" in config
    lab_part = config.split("\n# GpuLabLab\n")[1]
    assert "jupyter_server_config.py" in lab_part
