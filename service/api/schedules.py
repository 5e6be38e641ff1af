"""Routes for scheduled jobs (``/api/v1/schedules``); the work is
:class:`~gpulab.service.jobs.schedules.ScheduledJobs` (``GpuLabService.schedules``).

A schedule is its owner's: to anyone else (but admins) it does not exist (404),
like another user's job. The jobs it submits are its owner's jobs (``/jobs``).
"""

from __future__ import annotations

from tornado import web

from gpulab.service.auth import APIHandler
from gpulab.service.jobs.schedules import ScheduledJobs, ScheduleRefused


def schedule_body_limit(max_schedules_mib: int) -> int:
    """A schedule's body: its job and meta (at most what all of a user's schedules may
    keep; the store judges the total) and a little for its other fields."""
    return (max_schedules_mib << 20) + (1 << 20)


class _ScheduleHandler(APIHandler):
    @property
    def schedules(self) -> ScheduledJobs:
        manager = self.gpulab.schedules
        if manager is None:  # an app made by make_app() without initialize()
            raise web.HTTPError(503, "scheduled jobs are not running; try again")
        return manager

    async def call(self, method, *args):
        try:
            result = method(*args)
            return await result if hasattr(result, "__await__") else result
        except ScheduleRefused as e:
            raise web.HTTPError(e.status, str(e)) from None


class SchedulesHandler(_ScheduleHandler):
    audit_actions = {"POST": "schedule.create"}
    body_setting = "JobQueue.max_schedules_mib"

    def body_limit(self) -> int:
        if self.request.method != "POST":
            return super().body_limit()
        return schedule_body_limit(self.gpulab.job_queue.max_schedules_mib)

    async def get(self):
        user = self.listed_user("schedules")
        self.write_json(await self.schedules.list(user))

    async def post(self):
        who = self.require_identity()
        sched = await self.call(self.schedules.create, who, self.json_body())
        await self.audit("schedule.create", sched["id"], name=sched["name"])
        self.write_json(sched, status=201)


class ScheduleHandler(_ScheduleHandler):
    audit_actions = {"PATCH": "schedule.update", "DELETE": "schedule.delete"}
    body_setting = "JobQueue.max_schedules_mib"

    def body_limit(self) -> int:
        if self.request.method != "PATCH":
            return super().body_limit()
        return schedule_body_limit(self.gpulab.job_queue.max_schedules_mib)

    async def get(self, schedule_id):
        self.write_json(await self.call(self.schedules.get, self.require_identity(), schedule_id))

    async def patch(self, schedule_id):
        who = self.require_identity()
        sched = await self.call(self.schedules.update, who, schedule_id, self.json_body())
        await self.audit("schedule.update", schedule_id, user=sched["user"])
        self.write_json(sched)

    async def delete(self, schedule_id):
        who = self.require_identity()
        sched = await self.call(self.schedules.get, who, schedule_id)
        await self.call(self.schedules.delete, who, schedule_id)
        await self.audit("schedule.delete", schedule_id, user=sched["user"])
        self.set_status(204)
        self.finish()


class ScheduleRunsHandler(_ScheduleHandler):
    """``[{"job_id", "fired"}]``: the jobs the schedule submitted, oldest first."""

    async def get(self, schedule_id):
        who = self.require_identity()
        self.write_json(await self.call(self.schedules.runs, who, schedule_id))


routes = [
    (r"api/v1/schedules", SchedulesHandler),
    (r"api/v1/schedules/([^/]+)", ScheduleHandler),
    (r"api/v1/schedules/([^/]+)/runs", ScheduleRunsHandler),
]
