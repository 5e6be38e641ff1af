"""What the dashboard's Jobs tab shows of running jobs: the latest step, loss and
throughput rank 0 reported, read from the end of each job's metrics file.

The file is the job owner's to write: only its last 64 KiB is read, only records that
are objects count, and only numbers are taken from them (a record of any other shape
is skipped, never an error on everyone's dashboard)."""

from __future__ import annotations

import json

from gpulab.service.jobs.book import JobBook
from gpulab.training.metrics import finite_number

#: How much of the end of rank 0's metrics file is read (a record is a few hundred bytes).
TAIL_BYTES = 1 << 16
FIELDS = ("step", "total_steps", "loss", "lr", "samples", "time")


def last_records(data: bytes, n: int = 2) -> list[dict]:
    """The last ``n`` whole records of ``data`` (the end of a metrics file), oldest
    first, each with only the numeric fields the dashboard shows."""
    out: list[dict] = []
    for line in reversed(data[: data.rfind(b"\n") + 1].splitlines()):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            continue
        if isinstance(record, dict):
            out.append({k: record[k] for k in FIELDS if finite_number(record.get(k))})
            if len(out) == n:
                break
    return out[::-1]


class JobProgress:
    """Reads rank 0's latest records for the dashboard (no state is kept per job)."""

    def __init__(self, book: JobBook):
        self.book = book

    def summaries(self, user: str | None) -> list[dict]:
        """Queued and running jobs with their latest step, loss and throughput.

        For the dashboard's Jobs tab; ``user=None`` means every user's (admins). Reads
        files: call it off the event loop.
        """
        out = []
        for job in self.book.queue.list(user=user, states=("queued", "running")):
            item = {k: job[k] for k in ("id", "name", "user", "state")}
            if job["state"] == "running" and self.book.backend_of(job) is not None:
                item.update(self.latest(job))
            out.append(item)
        return out

    def latest(self, job: dict) -> dict:
        try:
            data = self.book.jobdir(job).read_user_end("metrics/rank0.jsonl", TAIL_BYTES)
        except OSError:
            return {}
        tail = last_records(data)
        if not tail:
            return {}
        last = tail[-1]
        progress = {k: last[k] for k in ("step", "total_steps", "loss", "lr") if k in last}
        if len(tail) == 2 and "samples" in last and "time" in last and "time" in tail[0]:
            elapsed = last["time"] - tail[0]["time"]
            if elapsed > 0:
                progress["samples_per_second"] = last["samples"] / elapsed
        return progress
