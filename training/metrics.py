"""``report(**values)``: one JSON line per call in this rank's metrics file.

The file is ``$GPULAB_JOB_DIR/metrics/rank<R>.jsonl``; the service tails it, so
metrics survive a restart of the service and need no network from the rank.
Each line carries the time, the step (when inside ``checkpoint.resume_range``)
and the total steps, which is what the notebook's progress bar needs.
"""

from __future__ import annotations

import json
import math
import os
import time

from . import env

_progress = {"step": None, "total_steps": None}
_file = None


def finite_number(value) -> bool:
    """What a reader of these files (the service) takes as a metric: a finite number
    a float holds, not a bool (a line is its rank's user's to write: an integer of
    400 digits raises OverflowError in ``math.isfinite``)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def set_progress(step: int | None, total_steps: int | None) -> None:
    _progress["step"] = step
    _progress["total_steps"] = total_steps


def _open():
    global _file
    if _file is None:
        job_dir = env.get(env.JOB_DIR)
        if not job_dir:
            return None
        path = os.path.join(job_dir, "metrics", f"rank{env.rank()}.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _file = open(path, "a", buffering=1)  # noqa: SIM115
    return _file


def _plain(value):
    if hasattr(value, "item"):  # a tensor or numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


def report(**values) -> None:
    """Record metrics for this step (``loss=``, ``lr=``, ``samples=`` ...)."""
    f = _open()
    if f is None:
        return
    record = {
        "time": time.time(),
        "rank": env.rank(),
        "restart": env.restart_count(),
        "world_size": env.world_size(),  # an elastic job's changes over time
    }
    record.update({k: v for k, v in _progress.items() if v is not None})
    record.update({k: _plain(v) for k, v in values.items()})
    f.write(json.dumps(record) + "\n")
