"""Training jobs through the service (``/jobs``): the calls ``%%train_distributed`` makes.

A mixin of :class:`~.base.AsyncClient`; the sync :class:`~.base.Client` has
the same methods, blocking. ``follow_job_logs`` is an async iterator; from
sync code use :meth:`JobsMixin.follow_job_logs_into`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from .errors import ServiceUnreachable


class JobsMixin:
    async def submit_job(self, spec: dict) -> dict:
        """Queue a job (fields of :class:`gpulab.backend.spec.JobSpec`); returns the job."""
        return await self.request("POST", "/jobs", body=spec)

    async def list_jobs(self, user: str | None = None, state: str | None = None) -> list[dict]:
        return await self.request("GET", "/jobs", query={"user": user, "state": state})

    async def get_job(self, job_id: str) -> dict:
        return await self.request("GET", f"/jobs/{job_id}")

    async def cancel_job(self, job_id: str) -> dict:
        return await self.request("DELETE", f"/jobs/{job_id}")

    async def job_metrics(self, job_id: str, cursor: int = 0, rank: int = 0) -> dict:
        """``{"records": [...], "cursor": next, "state": ...}``: records since ``cursor``."""
        return await self.request(
            "GET", f"/jobs/{job_id}/metrics", query={"cursor": cursor, "rank": rank}
        )

    async def job_logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        """Every log line so far (the last ``tail`` lines), prefixed ``[r0]``, ``[r1]``..."""
        return "\n".join([line async for line in self._log_lines(job_id, False, rank, tail)])

    def follow_job_logs(self, job_id: str, rank: int | None = None) -> AsyncIterator[str]:
        """Log lines as they are written, until the job ends."""
        return self._log_lines(job_id, True, rank)

    async def follow_job_logs_into(
        self, job_id: str, sink: Callable[[str], None], rank: int | None = None
    ) -> None:
        """Call ``sink(line)`` for each line until the job ends (reconnects if cut off)."""
        seen = 0
        for attempt in range(30):
            try:
                n = 0
                async for line in self._log_lines(job_id, True, rank):
                    n += 1
                    if n > seen:  # a reconnect replays from the start; skip what we had
                        seen = n
                        sink(line)
                return
            except ServiceUnreachable:
                await asyncio.sleep(min(1 + attempt, 5))

    async def _log_lines(
        self, job_id: str, follow: bool, rank: int | None, tail: int | None = None
    ):
        query = {"follow": "1" if follow else None, "rank": rank, "tail": tail}
        async for line in self.stream_lines(f"/jobs/{job_id}/logs", query):
            yield line

    async def job_output(self, job_id: str) -> bytes:
        """The ``--out`` value as cloudpickle bytes (``cloudpickle.loads`` them)."""
        return await self.read_bytes(f"/jobs/{job_id}/out")
