"""Routes for training jobs (``/api/v1/jobs``); the work is the service's
:class:`~gpulab.service.jobs.manager.JobManager` (``GpuLabService.jobs``).

Only a job's owner and admins see a job; to anyone else it does not exist
(404), like another user's allocation.
"""

from __future__ import annotations

import asyncio
import json
import os

from tornado import web
from tornado.iostream import StreamClosedError

from gpulab.backend.jobdir import LogTail
from gpulab.backend.spec import MAX_CODE_BYTES
from gpulab.db.jobs import STATES, TERMINAL
from gpulab.enforcement.environments import SiteEnvironments
from gpulab.service.api.query_args import int_arg
from gpulab.service.auth import APIHandler
from gpulab.service.jobs.manager import JobManager, JobRefused

#: How often a following log stream looks for new lines.
FOLLOW_POLL_S = 0.5
#: The most lines ``?tail=`` may ask for (all lines: leave ``tail`` out).
MAX_TAIL_LINES = 100_000
#: Reads (each at most 8 MiB and 100,000 lines) one answer makes at once: 512 MiB.
MAX_CATCH_UP_READS = 64
#: What one read of an ``--out`` value takes (and one write sends).
OUT_STEP_BYTES = 1 << 20


class _JobHandler(APIHandler):
    @property
    def jobs(self) -> JobManager:
        manager = self.gpulab.jobs
        if manager is None:  # an app made by make_app() without initialize()
            raise web.HTTPError(503, "the job manager is not running; try again")
        return manager

    async def find(self, job_id: str) -> dict:
        who = self.require_identity()
        job = await asyncio.to_thread(self.jobs.queue.get, job_id)  # a database read
        if job is None or not who.can_act_for(job["user"]):
            raise web.HTTPError(404, f"no job {job_id!r}")
        return job


class JobsHandler(_JobHandler):
    body_setting = "JobQueue.max_job_vars_mib"
    audit_actions = {"POST": "job.submit"}

    def body_limit(self) -> int:
        if self.request.method != "POST":
            return super().body_limit()
        # The variables travel base64-encoded (4/3) beside the cell and the settings.
        return (
            self.gpulab.job_queue.max_job_vars_mib * 2**20 * 4 // 3 + MAX_CODE_BYTES * 2 + (1 << 20)
        )

    async def get(self):
        user = self.listed_user("jobs")
        state = self.get_argument("state", None)
        if state is not None and state not in STATES:
            raise web.HTTPError(400, f"state must be one of {', '.join(STATES)}")

        def views() -> list[dict]:  # each reads its job's folder: in a thread
            rows = self.jobs.queue.list(user=user, states=(state,) if state else None)
            positions = self.jobs.queue.positions()
            return [self.jobs.view(j, positions) for j in rows]

        self.write_json(await asyncio.to_thread(views))

    async def post(self):
        who = self.require_identity()
        # Up to max_job_vars_mib of base64 in it: parsed in a thread.
        body = await asyncio.to_thread(self.json_body)
        environment = body.get("environment")
        site = SiteEnvironments(parent=self.gpulab).environments
        if isinstance(environment, str) and environment and environment not in site:
            known = ", ".join(sorted(site)) or "none are set up"
            raise web.HTTPError(400, f"unknown environment {environment!r}; this site's: {known}")
        try:
            # GPU-hour budgets too (the job manager judges them for every way in).
            job = await self.jobs.submit(who, body)
        except JobRefused as e:
            raise web.HTTPError(e.status, str(e)) from None
        await self.audit(
            "job.submit",
            job["id"],
            name=job.get("name"),
            gpu_milli=job.get("gpu_milli"),
            ranks=job.get("nodes", 1) * job.get("nproc_per_node", 1),
            backend=job.get("backend"),
        )
        self.write_json(job, status=201)


class JobHandler(_JobHandler):
    async def get(self, job_id):
        job = await self.find(job_id)
        self.write_json(await asyncio.to_thread(self.jobs.view, job))

    async def delete(self, job_id):
        """Cancel: stop every rank, release the slices. A finished job stays as it ended."""
        job = await self.find(job_id)
        who = self.identity
        by = "its owner" if who.name == job["user"] else f"{who.kind} {who.name}"
        view = await self.jobs.cancel(job, f"cancelled by {by}")
        await self.audit("job.cancel", job_id, user=job["user"], name=job.get("name"))
        self.write_json(view)


class JobLogsHandler(_JobHandler):
    """``text/plain`` lines, each prefixed ``[r<rank>]``, ``[node<n>]`` or ``[gpulab]``.

    ``?follow=1`` streams (chunked) until the job ends; ``?rank=R`` only that rank;
    ``?tail=N`` starts with the last N lines so far (like ``kubectl logs --tail``),
    read from the ends of the files. A log more than 8 MiB behind gives its newest
    8 MiB (a line says what was skipped), and one answer at most 512 MiB of all of
    a job's logs at once: ``tail`` or follow for the rest.
    """

    def set_default_headers(self):
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    async def get(self, job_id):
        job = await self.find(job_id)
        follow = self.get_argument("follow", "0").lower() in ("1", "true", "yes")
        rank = int_arg("rank", self.get_argument("rank", None), None, 0)
        last = self._tail_lines()
        tail = LogTail(self.jobs.jobdir(job), rank)
        loop = asyncio.get_running_loop()
        rounds = 0
        try:
            while True:
                # Ask first, read second: lines written before the job ended are not lost.
                ended = (await asyncio.to_thread(self.jobs.queue.get, job_id))["state"] in TERMINAL
                # Off the event loop: a read of a big log must not stall other requests.
                lines = await loop.run_in_executor(None, tail.read, ended, last)
                last = None  # only the first read is cut
                if lines:
                    self.write("\n".join(lines) + "\n")
                    await self.flush()
                # A read stops at its budget (8 MiB, 100,000 lines): the rest of what
                # is there now follows at once, a read at a time, up to a bound (a
                # running job may write as fast as it is read).
                if tail.behind and rounds < MAX_CATCH_UP_READS:
                    rounds += 1
                    continue
                if ended or not follow:
                    break
                rounds = 0
                await asyncio.sleep(FOLLOW_POLL_S)
        except StreamClosedError:
            return  # the reader went away
        self.finish()

    def _tail_lines(self) -> int | None:
        value = self.get_argument("tail", None)
        if value is None:
            return None
        # ASCII digits only, and few ("²" is a digit to str.isdigit; int() refuses
        # strings of more than 4300 digits).
        plain = value.isascii() and value.isdigit() and len(value) <= 6
        if not plain or not 1 <= int(value) <= MAX_TAIL_LINES:
            raise web.HTTPError(
                400,
                f"tail must be a number of lines from 1 to {MAX_TAIL_LINES}, got {value[:20]!r}"
                " (leave it out for every line)",
            )
        return int(value)


class JobMetricsHandler(_JobHandler):
    """``report()`` records of one rank (default 0) from ``?cursor=`` on."""

    async def get(self, job_id):
        job = await self.find(job_id)
        rank = int_arg("rank", self.get_argument("rank", None), 0, 0)
        cursor = int_arg("cursor", self.get_argument("cursor", None), 0, 0)
        jd = self.jobs.jobdir(job)

        def answer() -> str:  # up to 8 MiB of the rank's records: read and written here
            records, after = jd.metrics(rank, cursor)
            return json.dumps(
                {
                    "records": records,
                    "cursor": after,
                    "state": job["state"],
                    "checkpoints": jd.checkpoint_steps(),
                }
            )

        self.finish(await asyncio.to_thread(answer))


class JobOutHandler(_JobHandler):
    """The ``--out`` value: cloudpickle bytes written by rank 0, sent in steps read off
    the event loop (it may be a whole model, or a sparse file of any size)."""

    async def get(self, job_id):
        job = await self.find(job_id)
        jd = self.jobs.jobdir(job)
        if jd.out_path() is None:
            raise web.HTTPError(
                404,
                f"job {job_id} has no --out value" + ("" if job["state"] in TERMINAL else " yet"),
            )
        try:
            fd = jd.open_user("out/value.pkl")
        except OSError:
            raise web.HTTPError(
                404, f"job {job_id}'s --out value is not a plain file of the job's own"
            ) from None
        self.set_header("Content-Type", "application/octet-stream")
        with os.fdopen(fd, "rb") as f:
            try:
                while chunk := await asyncio.to_thread(f.read, OUT_STEP_BYTES):
                    self.write(chunk)
                    await self.flush()
            except StreamClosedError:
                return  # the reader went away
        self.finish()


routes = [
    (r"api/v1/jobs", JobsHandler),
    (r"api/v1/jobs/([^/]+)", JobHandler),
    (r"api/v1/jobs/([^/]+)/logs", JobLogsHandler),
    (r"api/v1/jobs/([^/]+)/metrics", JobMetricsHandler),
    (r"api/v1/jobs/([^/]+)/out", JobOutHandler),
]
