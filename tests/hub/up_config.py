"""The hub configuration `gpulab up` writes, for tests that read it without a hub."""

import os

from traitlets.config import Config

from gpulab.hub_ext.hub_config import Settings, configure


def up_config(tmp_path) -> Config:
    """What `gpulab up` writes (hub_ext/jupyterhub_config.py, before gpulab_config.py)."""
    c = Config()
    umask = os.umask(0o022)  # configure() sets the hub process's umask; keep ours
    try:
        configure(c, Settings(data_dir=tmp_path / "data"))
    finally:
        os.umask(umask)
    return c
