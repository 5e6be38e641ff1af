"""A job's lineage facts, read from its directory: the code hash and the datasets read.

The code hash is of ``cell.py`` (the service's own copy of what was sent); the
datasets come from the ranks' notes (:mod:`gpulab.training.lineage`), read the way
every file the ranks write is read (:meth:`JobDir.read_user`: no symlinks, bounded).
An ended job's facts no longer change, so they are kept in memory once read.
"""

from __future__ import annotations

import glob
import os
from collections import OrderedDict

from gpulab.backend.jobdir import JobDir
from gpulab.backend.spec import MAX_CODE_BYTES
from gpulab.db.jobs import TERMINAL
from gpulab.training.lineage import READS_DIR, READS_PREFIX, code_hash, datasets_read

#: The most bytes of notes read per job (a rank could write any amount).
MAX_NOTES_BYTES = 16 << 20
#: Ended jobs whose facts are kept.
KEPT = 4096
#: Beside an ended job, written by the service: its MLflow run (service/experiments/).
MLFLOW_RUN_FILE = "mlflow-run.json"


class JobLineage:
    """``of(job, jobdir)`` -> ``{"code_hash", "datasets", "mlflow_run_id"}``."""

    def __init__(self):
        self._ended: OrderedDict[str, dict] = OrderedDict()
        self._hashes: OrderedDict[str, str | None] = OrderedDict()
        self._runs: OrderedDict[str, str] = OrderedDict()

    def of(self, job: dict, jobdir: JobDir) -> dict:
        kept = self._ended.get(job["id"])
        if kept is None:
            kept = {
                "code_hash": self._code_hash(job["id"], jobdir),
                "datasets": read_datasets(jobdir),
            }
            if job["state"] in TERMINAL:
                _keep(self._ended, job["id"], kept)
        return {**kept, "mlflow_run_id": self._run_id(job, jobdir)}

    def _run_id(self, job: dict, jobdir: JobDir) -> str | None:
        """The job's MLflow run, once the service has written it (after the job ends)."""
        if job["id"] in self._runs:
            return self._runs[job["id"]]
        if job["state"] not in TERMINAL:
            return None
        run_id = (jobdir.read_json(MLFLOW_RUN_FILE) or {}).get("run_id")
        if run_id:
            _keep(self._runs, job["id"], run_id)
        return run_id

    def _code_hash(self, job_id: str, jobdir: JobDir) -> str | None:
        if job_id not in self._hashes:  # the cell never changes
            try:
                code = jobdir.read_own("cell.py", MAX_CODE_BYTES + 1)
                _keep(self._hashes, job_id, code_hash(code))
            except OSError:
                return None  # the directory is gone: nothing to say, nothing kept
        return self._hashes[job_id]


def read_datasets(jobdir: JobDir) -> list[dict]:
    """Every rank's notes merged: ``[{"name", "version", "shards", "bytes"}]``."""
    lines: list[bytes] = []
    budget = MAX_NOTES_BYTES
    for path in sorted(glob.glob(jobdir.p(READS_DIR, f"{READS_PREFIX}*.jsonl"))):
        try:
            data = jobdir.read_user(os.path.relpath(path, jobdir.path), limit=budget)
        except OSError:
            continue
        budget -= len(data)
        lines += data[: data.rfind(b"\n") + 1].splitlines()  # a line being written waits
        if budget <= 0:
            break
    return datasets_read(lines)


def _keep(kept: OrderedDict, key: str, value) -> None:
    kept[key] = value
    while len(kept) > KEPT:
        kept.popitem(last=False)
