"""The runtime environments a notebook job may run in: gpulab's, on a GPU slice.

Jupyter Scheduler asks for them (``GET <server>/scheduler/runtime_environments``);
each one's ``compute_types`` are the slice sizes this user may take (the site's
sizes up to their quota, from the service's ``/availability``, as the spawn form
offers them), in words (``1/4 GPU``, ``no GPU``); its default is the server's own
slice.
"""

from __future__ import annotations

import os
import re

from jupyter_scheduler.environments import EnvironmentManager, EnvironmentRetrievalError
from jupyter_scheduler.models import RuntimeEnvironment

from gpulab.client.base import AsyncClient
from gpulab.client.errors import GpuLabError
from gpulab.client.units import MILLI_PER_GPU, gpu_label

#: The environment of the server's own Python, run as a gpulab job.
ENV_NAME = "gpulab-python"
OUTPUT_FORMATS = {"ipynb": "Notebook", "html": "HTML"}
_FRACTION = re.compile(r"^(\d+)\s*/\s*(\d+)\s*gpus?$")
_WHOLE = re.compile(r"^(\d+)\s*gpus?$")


class ComputeTypeError(ValueError):
    """A compute type that is no slice size; the message names the ones there are."""


def parse_compute_type(text) -> int:
    """``1/4 GPU`` -> 250, ``2 GPUs`` -> 2000, ``no GPU`` -> 0; a number is milli-GPU."""
    value = str(text).strip().lower()
    if value.isdigit():
        return int(value)
    if value in ("no gpu", "cpu", "none", "0 gpu"):
        return 0
    m = _FRACTION.match(value)
    if m and int(m.group(2)):
        return int(m.group(1)) * MILLI_PER_GPU // int(m.group(2))
    m = _WHOLE.match(value)
    if m:
        return int(m.group(1)) * MILLI_PER_GPU
    raise ComputeTypeError(f"compute type {text!r} is not a slice size (e.g. '1/4 GPU')")


async def allowed_sizes(client: AsyncClient) -> list[int]:
    """The site's slice sizes up to the user's whole quota (what they hold now counts
    back in: a job waits in the queue until its slice is free)."""
    avail = await client.request("GET", "/availability")
    quota = avail.get("quota_milli")
    total = None if quota is None else quota + (avail.get("held_milli") or 0)
    return [s["milli"] for s in avail.get("sizes", []) if total is None or s["milli"] <= total]


def default_size(sizes: list[int]) -> int | None:
    """The server's own slice where it is one of ``sizes``, else the smallest GPU one."""
    own = os.environ.get("GPULAB_GPU_MILLI", "")
    if own.isdigit() and int(own) in sizes:
        return int(own)
    gpus = [s for s in sizes if s]
    return min(gpus) if gpus else (sizes[0] if sizes else None)


def environment(sizes: list[int]) -> RuntimeEnvironment:
    default = default_size(sizes)
    return RuntimeEnvironment(
        name=ENV_NAME,
        label="gpulab: this server's Python on a GPU slice",
        description=(
            "Runs the notebook as a gpulab job on a slice of its own (queued, "
            "preempted and accounted like any job), with this server's Python and packages"
        ),
        file_extensions=["ipynb"],
        output_formats=list(OUTPUT_FORMATS),
        metadata={"runs_as": "gpulab job"},
        compute_types=[gpu_label(s) for s in sizes],
        default_compute_type=gpu_label(default) if default is not None else None,
        utc_only=False,
    )


class GpulabEnvironments(EnvironmentManager):
    """``c.SchedulerApp.environment_manager_class`` of every server gpulab spawns."""

    async def list_environments(self) -> list[RuntimeEnvironment]:
        try:
            client = AsyncClient()
            return [environment(await allowed_sizes(client))]
        except GpuLabError as e:
            raise EnvironmentRetrievalError(f"gpulab's slice sizes: {e.message}") from None

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self) -> dict[str, str]:
        return dict(OUTPUT_FORMATS)
