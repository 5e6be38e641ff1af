"""The dashboard's Jobs tab reads the end of rank 0's metrics file, which the job's
owner writes: records of any shape are skipped, never an error on everyone's
dashboard, and a file of any size costs one 64 KiB read (8 MiB lines were parsed on
the service's event loop, and the last two records kept whole per job)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from gpulab.backend.jobdir import JobDir
from gpulab.service.jobs.progress import JobProgress, last_records


def book_with(jd: JobDir) -> SimpleNamespace:
    return SimpleNamespace(jobdir=lambda job: jd)


def test_odd_records_are_skipped_and_only_numbers_taken():
    lines = [
        {"time": 10.0, "step": 1, "samples": 32, "loss": 2.0},
        5,
        None,
        {"time": "soon", "step": "two", "loss": 1.5, "note": "x" * 100, "lr": True},
        {"time": 12.0, "step": 3, "samples": 64, "loss": 1.0, "total_steps": 10},
    ]
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines) + b'{"time": 1'
    first, last = last_records(data)
    assert first == {"loss": 1.5}
    assert last == {"time": 12.0, "step": 3, "samples": 64, "loss": 1.0, "total_steps": 10}


def test_numbers_past_a_float_and_deep_nesting_are_skipped():
    good = b'{"step": 7, "loss": 0.5}\n'
    huge = b'{"step": 1' + b"0" * 400 + b', "loss": 0.25}\n'  # an int no float holds
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"  # past Python's recursion limit
    assert last_records(good + huge + deep) == [{"step": 7, "loss": 0.5}, {"loss": 0.25}]


def test_a_huge_file_is_read_at_its_end_only(tmp_path):
    jd = JobDir(str(tmp_path), "j1")
    (tmp_path / "j1" / "metrics").mkdir(parents=True)
    with open(jd.p("metrics", "rank0.jsonl"), "wb") as f:
        f.write(b"[" + b"{}," * (3 << 20) + b"{}]\n")  # a 9 MiB line of no use
        f.write(json.dumps({"time": 1.0, "step": 1, "samples": 10}).encode() + b"\n")
        f.write(json.dumps({"time": 3.0, "step": 2, "samples": 10, "loss": 0.5}).encode() + b"\n")
    progress = JobProgress(book_with(jd)).latest({"id": "j1"})
    assert progress == {"step": 2, "loss": 0.5, "samples_per_second": 5.0}
    # No file yet, or only rubbish: nothing to show, no error.
    assert JobProgress(book_with(JobDir(str(tmp_path), "none"))).latest({"id": "none"}) == {}
