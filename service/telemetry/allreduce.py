"""All-reduce probe results: read from the probe job itself, checked before anyone sees them.

``%gpulab nettest`` runs the probe as a job; its rank 0 writes
``out/allreduce.json`` (:func:`gpulab.training.allreduce_probe.run_probe` with
``record=True``). When the job succeeds the service reads that file, never
following a link, never more than :data:`MAX_FILE_BYTES`, as JSON only (never
unpickled), and records it under the job's user and id. A user cannot post a
result (``POST /telemetry/allreduce`` is for admins and the service), so what
``/metrics`` shows everyone comes from a probe that ran.

The ranks are the user's code, so the file is still a claim: it must be
internally consistent (nccl-tests' definitions: ``algbw = size / time``,
``busbw = algbw * 2(n-1)/n``), name the job's own world size and nodes, and stay
within what hardware can do (:data:`MAX_BYTES_PER_SECOND`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import time
from dataclasses import dataclass

from gpulab.training import env as rank_env

log = logging.getLogger("gpulab.service")

MAX_FILE_BYTES = 64 << 10
#: 10 TB/s: above any link's bus bandwidth today (NVLink 5 is 1.8 TB/s per GPU).
MAX_BYTES_PER_SECOND = 1e13
MAX_SIZE_BYTES = 1 << 40
MAX_NODES = 1024
_BACKEND = re.compile(r"^[a-z0-9:,_-]{1,32}$")


class BadResult(ValueError):
    """A result that is not a plausible probe measurement; the message says why."""


def _number(data: dict, key: str, lo: float, hi: float, integer: bool = False):
    v = data.get(key)
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (integer and not isinstance(v, int))
        or not math.isfinite(v)
        or not lo <= v <= hi
    ):
        raise BadResult(
            f"'{key}' must be {'an integer' if integer else 'a finite number'} "
            f"from {lo:g} to {hi:g}, got {v!r}"
        )
    return v


def validate(data: object, world_size: int | None = None, max_nodes: int = MAX_NODES) -> dict:
    """The fields worth keeping of one probe result, or :class:`BadResult`."""
    if not isinstance(data, dict):
        raise BadResult("a probe result is a JSON object")
    size = _number(data, "size_bytes", 4, MAX_SIZE_BYTES, integer=True)
    world = _number(data, "world_size", 1, world_size or 1 << 20, integer=True)
    if world_size is not None and world != world_size:
        raise BadResult(f"'world_size' {world} is not the job's {world_size} ranks")
    algbw = _number(data, "algbw_bytes_per_second", 0, MAX_BYTES_PER_SECOND)
    busbw = _number(data, "busbw_bytes_per_second", 0, MAX_BYTES_PER_SECOND)
    if not math.isclose(busbw, algbw * 2 * (world - 1) / world, rel_tol=1e-6, abs_tol=1e-9):
        raise BadResult("'busbw_bytes_per_second' must be algbw * 2(n-1)/n")
    out = {
        "size_bytes": size,
        "world_size": world,
        "algbw_bytes_per_second": float(algbw),
        "busbw_bytes_per_second": float(busbw),
    }
    if "time_s" in data:
        t = _number(data, "time_s", 1e-12, 86400)
        if not math.isclose(algbw, size / t, rel_tol=1e-6):
            raise BadResult("'algbw_bytes_per_second' must be size_bytes / time_s")
        out["time_s"] = float(t)
    backend = data.get("backend", "")
    if not isinstance(backend, str) or (backend and not _BACKEND.match(backend)):
        raise BadResult("'backend' must be a process-group backend name like gloo or nccl")
    out["backend"] = backend
    nodes = data.get("nodes") or []
    if (
        not isinstance(nodes, list)
        or len(nodes) > max_nodes
        or not all(isinstance(n, str) and 0 < len(n) <= 255 and n.isprintable() for n in nodes)
    ):
        raise BadResult(f"'nodes' must be a list of at most {max_nodes} node names")
    out["nodes"] = nodes
    return out


def read_result_file(path: str, fd: int | None = None) -> object:
    """The JSON in ``path`` (or in ``fd``, opened already): a regular file, not a
    link, at most MAX_FILE_BYTES."""
    if fd is None:
        # O_NONBLOCK: a FIFO put there must not hang the service; O_NOFOLLOW: no links.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise BadResult("it is not a regular file")
        if st.st_nlink != 1:  # a hard link to someone else's file
            raise BadResult("it has other names (a hard link)")
        if st.st_size > MAX_FILE_BYTES:
            raise BadResult(f"it is over {MAX_FILE_BYTES >> 10} KiB")
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise BadResult(f"it is over {MAX_FILE_BYTES >> 10} KiB")

    def refuse(name):
        raise BadResult(f"{name} is not a number")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


@dataclass(frozen=True)
class AllreduceRecords:
    """Jobs' all-reduce probe results into the telemetry store (the dashboard's
    Network tab). ``node_name``: the node a result names when it names none."""

    node_name: str
    telemetry: object  # has add_allreduce(record)

    def from_job(self, job: dict, jobdir) -> dict | None:
        """After a job succeeded: record its probe result, if it wrote one."""
        path = jobdir.p("out", rank_env.ALLREDUCE_RESULT)
        if not os.path.lexists(path):
            return None
        world = job["nodes"] * job["nproc_per_node"]
        try:
            # Opened through the job's folder with no link followed at any step: its
            # ranks may have put a link to another job's out/ in place of theirs.
            fd = jobdir.open_user(os.path.join("out", rank_env.ALLREDUCE_RESULT))
            result = validate(read_result_file(path, fd), world_size=world, max_nodes=job["nodes"])
        except (BadResult, OSError, ValueError, RecursionError) as e:
            jobdir.event(f"all-reduce result not recorded: {rank_env.ALLREDUCE_RESULT}: {e}")
            log.warning(
                "Job %s of %s: all-reduce result not recorded: %s", job["id"], job["user"], e
            )
            return None
        record = {
            "ts": time.time(),
            "user": job["user"],
            "job_id": job["id"],
            **result,
            "node": (result["nodes"] or [self.node_name])[0],
        }
        self.telemetry.add_allreduce(record)
        jobdir.event("all-reduce result recorded for the dashboard's Network tab")
        return record
