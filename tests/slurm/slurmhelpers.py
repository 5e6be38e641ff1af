"""What the Slurm tests share besides the fixtures (tests/slurm/conftest.py):
the skip rule and the service settings for a sandbox."""

import os
import shutil
from pathlib import Path

import pytest

needs_slurm = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"),
    reason="needs root and Debian's slurm-wlm + munge (apt-get install slurm-wlm munge)",
)


def service_config(sandbox: dict) -> str:
    conf = Path(sandbox["data_dir"]) / "etc" / "slurm.conf"
    return (
        f'c.SlurmSite.slurm_conf = "{conf}"\n'
        'c.GpuLabService.jobs_backend_class = "slurm"\n'
        'c.GpuLabService.inventory_class = "slurm"\n'
        "c.SlurmInventory.simulated = True\n"
    )
