"""What the Slurm tests share besides the fixtures (tests/slurm/conftest.py):
the skip rule and the service settings for a sandbox."""

import os
import shutil
from pathlib import Path

import pytest
from support.wait import wait_until_async

needs_slurm = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"),
    reason="needs root and Debian's slurm-wlm + munge (apt-get install slurm-wlm munge)",
)


def service_config(sandbox: dict) -> str:
    conf = Path(sandbox["data_dir"]) / "etc" / "slurm.conf"
    return (
        f'c.SlurmSite.slurm_conf = "{conf}"\n'
        'c.GpuLabService.jobs_backend_class = "slurm"\n'
        'c.InventorySettings.inventory_class = "slurm"\n'
        "c.SlurmInventory.simulated = True\n"
    )


TERMINAL = ("succeeded", "failed", "cancelled")


async def wait_job(svc, token, job_id, states=TERMINAL, timeout=240):
    """The job once it is in one of ``states``; its logs in the error if it never is."""

    async def reached():
        job = (await svc.request("GET", f"/jobs/{job_id}", token)).json()
        return job if job["state"] in states else None

    try:
        return await wait_until_async(reached, f"job {job_id} in {states}", timeout, every=0.2)
    except AssertionError:
        logs = (await svc.request("GET", f"/jobs/{job_id}/logs", token)).text
        raise AssertionError(f"job {job_id} did not reach {states}:\n{logs[-3000:]}") from None
