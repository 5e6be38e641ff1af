"""Where a model came from, as a job's ranks see it: the code they ran, the data they read.

Two fingerprints, both plain SHA-256 hex digests a user can recompute by hand:

* the *code hash*: of the cell's source as sent (UTF-8), :func:`code_hash`;
* a *dataset version*: of the shards read through the dataset cache, one line
  ``<url>\\t<size in bytes>\\n`` per shard, sorted, :func:`dataset_version`. The same
  shards of the same sizes give the same version wherever and whenever they are read.

Each rank notes the shards it reads (:func:`note_read`, called by
:mod:`gpulab.cache`) in ``$GPULAB_JOB_DIR/metrics/datasets-rank<R>.jsonl``, once per
shard and process; the service merges every rank's notes into the job's datasets
(:func:`datasets_read`), so a dataset split between ranks is one version. Outside
a gpulab job nothing is written (as with ``report()``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable

from . import env

#: The notes' folder in the job directory (one the ranks may write) and file names.
READS_DIR = "metrics"
READS_PREFIX = "datasets-rank"

_lock = threading.Lock()
_seen: set[tuple[str, str]] = set()
#: Kept across a fork: a DataLoader worker appends to its rank's file (O_APPEND).
_fd: int | None = None


def code_hash(source: str | bytes) -> str:
    """SHA-256 hex of a cell's source: the job's code version."""
    data = source.encode() if isinstance(source, str) else source
    return hashlib.sha256(data).hexdigest()


def dataset_version(shards: Iterable[tuple[str, int]]) -> str:
    """SHA-256 hex over the sorted ``url<TAB>size`` lines of a dataset's shards.

    Duplicates count once, so the order ranks or epochs read them in does not matter.
    """
    lines = sorted({f"{url}\t{int(size)}\n" for url, size in shards})
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def dataset_name(urls: list[str]) -> str:
    """A name for a list of shards when none is given: the one URL, or what the
    URLs share followed by ``*`` (``https://host/train-*``)."""
    if len(urls) == 1:
        return urls[0]
    return os.path.commonprefix(urls) + "*"


def reads_file(rank: int) -> str:
    """The notes file of a rank, relative to the job directory."""
    return os.path.join(READS_DIR, f"{READS_PREFIX}{rank}.jsonl")


def note_read(dataset: str, url: str, size: int) -> None:
    """This rank read ``url`` (``size`` bytes) of ``dataset``; noted once per process."""
    global _fd
    job_dir = env.get(env.JOB_DIR)
    if not job_dir:
        return
    key = (dataset, url)
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
        line = json.dumps({"dataset": dataset, "url": url, "size": int(size)}) + "\n"
        try:
            if _fd is None:
                path = os.path.join(job_dir, reads_file(env.rank()))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            # One write per line with O_APPEND: workers of one rank never interleave.
            os.write(_fd, line.encode())
        except OSError:
            # Lineage must never fail a training run; the job then shows fewer shards.
            _seen.discard(key)


def datasets_read(lines: Iterable[bytes | str]) -> list[dict]:
    """The datasets a job read, from its ranks' note lines: ``[{"name", "version",
    "shards", "bytes"}]`` sorted by name. Broken lines are skipped."""
    shards: dict[str, dict[str, int]] = {}
    for line in lines:
        try:
            note = json.loads(line)
            name, url, size = note["dataset"], note["url"], int(note["size"])
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
            continue  # a rank's file says anything: infinity, deep nesting
        if isinstance(name, str) and isinstance(url, str) and size >= 0:
            shards.setdefault(name, {})[url] = size
    return [
        {
            "name": name,
            "version": dataset_version(found.items()),
            "shards": len(found),
            "bytes": sum(found.values()),
        }
        for name, found in sorted(shards.items())
    ]
