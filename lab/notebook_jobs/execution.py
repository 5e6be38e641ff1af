"""How one notebook job runs: as a gpulab job on a slice, and back into its files.

:func:`job_body` is the ``POST /jobs`` body: a one-rank job whose cell runs the
notebook (``gpulab.training.notebook.run_in_rank``) with its parameters injected as
papermill does and its folder's files shipped as a job variable; the job's name is
the scheduler's (in the letters a job name may hold). The service runs it as the
user's account on the slice of the compute type. :func:`write_outputs` turns what the
rank sent back (``GET /jobs/{id}/out``) into the job's output files in the staging
area: the executed notebook in each output format and the files it wrote.

:class:`GpulabExecution` is Jupyter Scheduler's execution manager
(``c.Scheduler.execution_manager_class``): what a job supports, and a blocking
:meth:`~GpulabExecution.execute` (submit, wait, write back) for Jupyter Scheduler's
own process model; :class:`~.scheduler.GpulabScheduler` calls the same steps
without a process, following the job in the service instead.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re

import cloudpickle
import nbconvert
import nbformat
from jupyter_scheduler.executors import ExecutionManager
from jupyter_scheduler.models import JobFeature, Status

from gpulab.client.base import AsyncClient, run_sync

from .environments import parse_compute_type
from .parameters import inject

#: The job variable that carries the notebook, and the job's ``--out`` variable.
INPUT_VAR = "notebook_job_input"
OUT_VAR = "notebook_job"
CODE = f"from gpulab.training.notebook import run_in_rank\n{OUT_VAR} = run_in_rank({INPUT_VAR})\n"
#: A job name's letters (gpulab's job names: 1-63 of these, starting with one of
#: the first kind); any other run of characters becomes one '-'.
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
#: How the service's job states read in Jupyter Scheduler.
STATUS_OF = {
    "queued": Status.QUEUED,
    "running": Status.IN_PROGRESS,
    "succeeded": Status.COMPLETED,
    "failed": Status.FAILED,
    "cancelled": Status.STOPPED,
}
FINAL = (Status.COMPLETED, Status.FAILED, Status.STOPPED)
#: How often execute() (Jupyter Scheduler's process model) asks for the job's state.
POLL_S = 2.0


def job_name(name: str | None) -> str:
    """The scheduler's job name as a gpulab job name: ``nightly-train`` stays,
    ``My job #3`` becomes ``My-job-3``."""
    slug = _NOT_NAME.sub("-", (name or "").strip()).strip("-._")
    return slug[:63] or "notebook"


def _folder_files(folder: str, skip: str) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if rel != skip:
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


def job_body(
    staged_input: str,
    *,
    name: str,
    parameters: dict | None,
    gpu_milli: int,
    package_folder: bool = False,
) -> dict:
    """The ``POST /jobs`` body of a notebook job, from its staged input notebook."""
    with open(staged_input, encoding="utf-8") as f:
        nb = nbformat.read(f, as_version=4)
    nb = inject(nb, parameters)
    filename = os.path.basename(staged_input)
    files = _folder_files(os.path.dirname(staged_input), filename) if package_folder else {}
    job_input = {"notebook": nbformat.writes(nb), "filename": filename, "files": files}
    return {
        "code": CODE,
        "name": job_name(name),
        "gpu_milli": gpu_milli,
        "nodes": 1,
        "nproc_per_node": 1,
        "vars_b64": base64.b64encode(cloudpickle.dumps({INPUT_VAR: job_input})).decode(),
        "out": OUT_VAR,
    }


def write_outputs(output_formats: list[str], staging_paths: dict[str, str], result: dict):
    """The executed notebook in each format, and the files it wrote, in the staging
    folder. Returns the files' paths (relative to that folder)."""
    nb = nbformat.reads(result["notebook"], as_version=4)
    folder = os.path.dirname(staging_paths["input"])
    os.makedirs(folder, exist_ok=True)
    for fmt in output_formats or []:
        if fmt == "ipynb":
            text = result["notebook"]
        else:
            text, _ = nbconvert.get_exporter(fmt)().from_notebook_node(nb)
        with open(staging_paths[fmt], "w", encoding="utf-8") as f:
            f.write(text)
    written = []
    for rel, data in (result.get("files") or {}).items():
        path = os.path.abspath(os.path.join(folder, rel))
        if not path.startswith(os.path.abspath(folder) + os.sep):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        written.append(rel)
    return written


async def job_result(client: AsyncClient, gpulab_job_id: str) -> dict | None:
    """What the job's rank sent back, or None (a job stopped before it ran the
    notebook, or one that kept nothing)."""
    from gpulab.client.errors import NotFound

    try:
        data = await client.job_output(gpulab_job_id)
    except NotFound:
        return None
    value = cloudpickle.loads(data)  # the user's own job's value, read by the user's server
    return value if isinstance(value, dict) and "notebook" in value else None


class GpulabExecution(ExecutionManager):
    """``c.Scheduler.execution_manager_class``: a notebook job as a gpulab job."""

    def supported_features(cls) -> dict[JobFeature, bool]:
        return {
            JobFeature.job_name: True,
            JobFeature.parameters: True,
            JobFeature.output_formats: True,
            JobFeature.job_definition: True,
            JobFeature.idempotency_token: True,
            JobFeature.tags: True,
            JobFeature.email_notifications: False,
            JobFeature.timeout_seconds: False,
            JobFeature.retry_on_timeout: False,
            JobFeature.max_retries: False,
            JobFeature.min_retry_interval_millis: False,
            JobFeature.output_filename_template: False,
            JobFeature.stop_job: True,
            JobFeature.delete_job: True,
        }

    def validate(cls, input_path: str) -> bool:
        """A notebook nbformat reads (its kernel is the rank's Python where the rank
        lacks the notebook's)."""
        try:
            with open(input_path, encoding="utf-8") as f:
                nbformat.read(f, as_version=4)
        except (OSError, ValueError):
            return False
        return True

    def execute(self):
        """Jupyter Scheduler's process model: submit, wait for the end, write back."""
        run_sync(self._run())

    async def _run(self) -> None:
        job = self.model
        client = AsyncClient()
        body = job_body(
            self.staging_paths["input"],
            name=job.name,
            parameters=job.parameters,
            gpu_milli=parse_compute_type(job.compute_type) if job.compute_type else 0,
            package_folder=bool(job.package_input_folder),
        )
        submitted = await client.submit_job(body)
        while True:
            state = (await client.get_job(submitted["id"]))["state"]
            if STATUS_OF.get(state) in FINAL:
                break
            await asyncio.sleep(POLL_S)
        result = await job_result(client, submitted["id"])
        if result is not None:
            write_outputs(job.output_formats or [], self.staging_paths, result)
        if state != "succeeded":
            raise RuntimeError((await client.get_job(submitted["id"]))["message"])
