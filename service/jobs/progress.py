"""What the dashboard's Jobs tab shows of running jobs: the latest step, loss and
throughput rank 0 reported, read from each job's metrics file a little at a time."""

from __future__ import annotations

from gpulab.service.jobs.book import JobBook


class JobProgress:
    """A read cursor per running job into rank 0's ``report()`` records."""

    def __init__(self, book: JobBook):
        self.book = book
        #: Job id -> (bytes read, the last two records).
        self._tails: dict[str, tuple[int, list[dict]]] = {}

    def forget(self, job_id: str) -> None:
        """The job ended or went back to the queue: its next run reports afresh."""
        self._tails.pop(job_id, None)

    def summaries(self, user: str | None) -> list[dict]:
        """Queued and running jobs with their latest step, loss and throughput.

        For the dashboard's Jobs tab; ``user=None`` means every user's (admins).
        """
        out = []
        for job in self.book.queue.list(user=user, states=("queued", "running")):
            item = {k: job[k] for k in ("id", "name", "user", "state")}
            if job["state"] == "running" and self.book.backend_of(job) is not None:
                item.update(self.latest(job))
            out.append(item)
        return out

    def latest(self, job: dict) -> dict:
        cursor, tail = self._tails.get(job["id"], (0, []))
        records, cursor = self.book.jobdir(job).metrics(0, cursor)
        tail = (tail + records)[-2:]
        self._tails[job["id"]] = (cursor, tail)
        if not tail:
            return {}
        last = tail[-1]
        progress = {k: last[k] for k in ("step", "total_steps", "loss", "lr") if k in last}
        if len(tail) == 2 and "samples" in last and last["time"] > tail[0]["time"]:
            progress["samples_per_second"] = last["samples"] / (last["time"] - tail[0]["time"])
        return progress
