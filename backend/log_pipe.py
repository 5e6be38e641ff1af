"""A process's output into a capped log: the write end of a pipe to
``python -m gpulab.training.log_cap`` (see there), for ``Popen(stdout=...)``.

The writer runs as the log's owner (the job's account, or the service's for a
replica's root-owned log), in a session of its own: it outlives a service restart
with the agent it serves, and ends when the agent and its children are gone.
"""

from __future__ import annotations

import os
import subprocess

#: ``c.GpuLabService.job_log_max_bytes``' default: a log a person can still read, and
#: a disk that a print loop in every job cannot fill.
DEFAULT_LOG_MAX_BYTES = 64 << 20


def capped_log(
    path: str,
    max_bytes: int,
    python: str,
    env: dict[str, str],
    run_as: dict | None = None,
    keep: list | None = None,
) -> int:
    """An fd to give a child as its stdout (close it after ``Popen``): what is written
    there lands in ``path``, kept under ``max_bytes``. ``keep`` gets the writer's
    ``Popen`` (to be reaped with the job's processes)."""
    read_end, write_end = os.pipe()
    try:
        writer = subprocess.Popen(
            [python, "-m", "gpulab.training.log_cap", "--max-bytes", str(max_bytes), path],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd="/",
            start_new_session=True,
            **(run_as or {}),
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    if keep is not None:
        keep.append(writer)
    return write_end
