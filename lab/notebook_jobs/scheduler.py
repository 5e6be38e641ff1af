"""Jupyter Scheduler's scheduler for gpulab: records in the server, work in the service.

Jupyter Scheduler keeps its jobs and job definitions in the server's SQLite
database and shows them in the lab's Notebook Jobs panel; this subclass keeps that,
and moves the work to gpulab:

- a job is a gpulab job (:func:`~.execution.job_body`, ``POST /jobs`` with the
  server's token, so as the user): each look at the jobs (the panel polls) reads
  their state from the service, and a job that ended gets its output files written
  back (:func:`~.execution.write_outputs`) into the staging area and the job's
  folder under the server's root, where ``job_files`` point;
- a job definition with a schedule is a schedule of the service (``/schedules``),
  which submits its job while the server is stopped too; the jobs it submitted show
  up here (with their outputs) the next time the server looks;
- stopping a job cancels the gpulab job (``DELETE /jobs/{id}``).

Which gpulab job and schedule belong to which record is kept beside Jupyter
Scheduler's tables, in the same database.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import shutil

from jupyter_scheduler.exceptions import IdempotencyTokenError, InputUriError, SchedulerError
from jupyter_scheduler.models import (
    CountJobsQuery,
    CreateJob,
    CreateJobDefinition,
    CreateJobFromDefinition,
    DescribeJob,
    DescribeJobDefinition,
    JobFile,
    ListJobsQuery,
    ListJobsResponse,
    Status,
    UpdateJobDefinition,
)
from jupyter_scheduler.orm import Job, JobDefinition
from jupyter_scheduler.scheduler import Scheduler
from jupyter_scheduler.utils import get_utc_timestamp
from sqlalchemy import (
    Boolean,
    Column,
    MetaData,
    String,
    Table,
    create_engine,
    delete,
    insert,
    select,
    update,
)
from traitlets import Type

from gpulab.client.base import AsyncClient
from gpulab.client.errors import GpuLabError, NotFound

from .environments import (
    ENV_NAME,
    ComputeTypeError,
    allowed_sizes,
    default_size,
    parse_compute_type,
)
from .execution import FINAL, STATUS_OF, job_body, job_result, write_outputs
from .parameters import ParameterError

log = logging.getLogger("gpulab.lab.notebook_jobs")

links = MetaData()
#: A scheduler job and the gpulab job that runs it; ``collected``: its outputs are in.
job_links = Table(
    "gpulab_notebook_jobs",
    links,
    Column("job_id", String(36), primary_key=True),
    Column("gpulab_job_id", String(32), nullable=False),
    Column("collected", Boolean, nullable=False, default=False),
)
#: A job definition with a schedule and the service's schedule that runs it.
schedule_links = Table(
    "gpulab_notebook_schedules",
    links,
    Column("job_definition_id", String(36), primary_key=True),
    Column("schedule_id", String(32), nullable=False),
)


def _ms(iso: str | None) -> int | None:
    return int(dt.datetime.fromisoformat(iso).timestamp() * 1000) if iso else None


class GpulabScheduler(Scheduler):
    """``c.SchedulerApp.scheduler_class`` of every server gpulab spawns."""

    # The service fires schedules (the server may be stopped): no task runner here.
    task_runner_class = Type(
        allow_none=True,
        default_value=None,
        klass="jupyter_scheduler.task_runner.BaseTaskRunner",
        config=True,
        help="""What turns job definitions' schedules into jobs inside this server.
        None (gpulab's): the gpulab service keeps and fires the schedules, so they run
        while the server is stopped too; Jupyter Scheduler's own task runner would
        fire them only while the server runs, and twice beside the service.

        c.GpulabScheduler.task_runner_class = None
        """,
    )

    execution_manager_class = Type(
        default_value="gpulab.lab.notebook_jobs.execution.GpulabExecution",
        klass="jupyter_scheduler.executors.ExecutionManager",
        config=True,
        help="""What a notebook job supports (parameters, output formats, stop) and how
        one runs on its own: gpulab's runs it as a gpulab job on a slice. A site's
        subclass may offer more:

        c.GpulabScheduler.execution_manager_class = "mysite.jobs.MyExecution"
        """,
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._links = create_engine(self.db_url)
        links.create_all(self._links)
        self._client: AsyncClient | None = None
        # One look at the service at a time: the panel polls, and two looks at once
        # would both adopt a schedule's new run or both write a job's files.
        self._looking = asyncio.Lock()

    @property
    def client(self) -> AsyncClient:
        """The service's client with this server's token (the user's own)."""
        if self._client is None:
            try:
                self._client = AsyncClient()
            except GpuLabError as e:
                raise SchedulerError(f"notebook jobs need gpulab's service: {e.message}") from None
        return self._client

    # -- what a job asks for -----------------------------------------------------------
    async def _slice_of(self, model) -> int:
        """The slice (milli-GPU) of a job's environment and compute type, checked."""
        if model.runtime_environment_name != ENV_NAME:
            raise SchedulerError(
                f"runtime environment {model.runtime_environment_name!r} is not gpulab's: "
                f"use {ENV_NAME!r} (GET /scheduler/runtime_environments lists it)"
            )
        try:
            sizes = await allowed_sizes(self.client)
        except GpuLabError as e:
            raise SchedulerError(f"gpulab's slice sizes: {e.message}") from None
        if not model.compute_type:
            milli = default_size(sizes)
            if milli is None:
                raise SchedulerError("gpulab offers you no slice size: ask an admin")
            return milli
        try:
            milli = parse_compute_type(model.compute_type)
        except ComputeTypeError as e:
            raise SchedulerError(str(e)) from None
        if milli not in sizes:
            raise SchedulerError(
                f"compute type {model.compute_type!r} is not a slice size you may take; "
                f"take one of the environment's compute_types"
            )
        return milli

    # -- jobs --------------------------------------------------------------------------
    async def create_job(self, model: CreateJob) -> str:
        milli = await self._slice_of(model)
        if not model.job_definition_id and not self.file_exists(model.input_uri):
            raise InputUriError(model.input_uri)
        input_path = os.path.join(self.root_dir, model.input_uri)
        if not self.execution_manager_class.validate(self.execution_manager_class, input_path):
            raise SchedulerError(f"{model.input_uri} is not a notebook nbformat can read")
        with self.db_session() as session:
            if model.idempotency_token and (
                session.query(Job).filter(Job.idempotency_token == model.idempotency_token).first()
            ):
                raise IdempotencyTokenError(model.idempotency_token)
            model.output_formats = model.output_formats or []
            job = Job(**model.dict(exclude_none=True, exclude={"input_uri"}))
            job.status = Status.CREATED
            session.add(job)
            session.commit()
            describe = DescribeJob.from_orm(job)
            staging = self.get_staging_paths(describe)
            if model.package_input_folder:
                copied = self.copy_input_folder(model.input_uri, staging["input"])
                job.packaged_files = [f for f in copied if f != os.path.basename(model.input_uri)]
                session.commit()
            else:
                self.copy_input_file(model.input_uri, staging["input"])
            describe = DescribeJob.from_orm(job)
        await self._submit(describe, staging, milli)
        return describe.job_id

    async def _submit(self, job: DescribeJob, staging: dict, milli: int) -> None:
        """Send the job to the service; a refusal (quota, size) is the job's failure."""
        try:
            body = job_body(
                staging["input"],
                name=job.name,
                parameters=job.parameters,
                gpu_milli=milli,
                package_folder=bool(job.package_input_folder),
            )
            submitted = await self.client.submit_job(body)
        except (GpuLabError, ParameterError) as e:
            message = e.message if isinstance(e, GpuLabError) else str(e)
            self._set(job.job_id, status=Status.FAILED, status_message=message)
            return
        with self._links.begin() as conn:
            conn.execute(
                insert(job_links), [{"job_id": job.job_id, "gpulab_job_id": submitted["id"]}]
            )
        self._set(job.job_id, status=Status.QUEUED, status_message=submitted.get("message") or "")

    def _set(self, job_id: str, **values) -> None:
        with self.db_session() as session:
            session.query(Job).filter(Job.job_id == job_id).update(values)
            session.commit()

    async def look(self, schedules: bool = False) -> None:
        """Bring the records up to date with the service (``schedules``: the runs of
        the job definitions' schedules first)."""
        async with self._looking:
            if schedules:
                await self.sync_schedules()
            await self.sync()

    async def sync(self) -> None:
        """Read the state of every job not yet collected from the service; write back
        the outputs of those that ended. The service not answering leaves them as
        they were (the next look tries again)."""
        with self._links.connect() as conn:
            pending = list(conn.execute(select(job_links).where(~job_links.c.collected)))
        if not pending:
            return
        try:
            jobs = {j["id"]: j for j in await self.client.list_jobs()}
        except GpuLabError as e:
            log.warning("gpulab's jobs: %s", e)
            return
        for link in pending:
            job = jobs.get(link.gpulab_job_id)
            if job is not None:
                try:
                    await self._follow(link.job_id, link.gpulab_job_id, job)
                except GpuLabError as e:  # the service: the next look tries again
                    log.warning("Notebook job %s (gpulab job %s): %s", link.job_id, job["id"], e)
                except Exception as e:  # one job's files must not hide the others
                    log.exception("Notebook job %s (gpulab job %s)", link.job_id, job["id"])
                    self._give_up(link.job_id, e)

    def _give_up(self, job_id: str, error: Exception) -> None:
        """A job whose outputs cannot be written back (no room, a file in the way): said
        in its status, and not tried again at every look (each read its whole output)."""
        message = f"its outputs could not be written back: {type(error).__name__}: {error}"
        self._set(job_id, status=Status.FAILED, status_message=message[:500])
        with self._links.begin() as conn:
            conn.execute(
                update(job_links).where(job_links.c.job_id == job_id).values(collected=True)
            )

    async def _follow(self, job_id: str, gpulab_job_id: str, job: dict) -> None:
        status = STATUS_OF[job["state"]]
        values = {"status": status, "status_message": job.get("message") or ""}
        if job.get("started"):
            values["start_time"] = _ms(job["started"])
        if status not in FINAL:
            self._set(job_id, **values)
            return
        values["end_time"] = _ms(job.get("finished")) or get_utc_timestamp()
        with self.db_session() as session:
            record = session.query(Job).filter(Job.job_id == job_id).first()
            if record is None:
                return
            describe = DescribeJob.from_orm(record)
        result = await job_result(self.client, gpulab_job_id)
        if result is not None:
            staging = self.get_staging_paths(describe)
            formats = describe.output_formats or []
            # Off the server's loop: an HTML export of a large notebook takes a while.
            written = await asyncio.to_thread(write_outputs, formats, staging, result)
            values["packaged_files"] = sorted(set(describe.packaged_files or []) | set(written))
            if result.get("skipped"):
                values["status_message"] += (
                    f" (not sent back, too large: {', '.join(result['skipped'])})"
                )
        self._set(job_id, **values)
        with self.db_session() as session:
            describe = DescribeJob.from_orm(session.query(Job).filter(Job.job_id == job_id).one())
        if result is not None:
            await asyncio.to_thread(self._download, describe)
        with self._links.begin() as conn:
            conn.execute(
                update(job_links).where(job_links.c.job_id == job_id).values(collected=True)
            )

    def _download(self, job: DescribeJob) -> None:
        """The job's files from the staging area into its folder under the root."""
        staging = self.get_staging_paths(job)
        names = self.get_job_filenames(job)
        out = self.get_local_output_path(job)
        os.makedirs(out, exist_ok=True)
        for fmt in [*(job.output_formats or []), "input"]:
            if os.path.exists(staging[fmt]):
                shutil.copyfile(staging[fmt], os.path.join(out, names[fmt]))
        folder = os.path.dirname(staging["input"])
        for rel in job.packaged_files or []:
            source = os.path.join(folder, rel)
            if os.path.isfile(source):
                os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
                shutil.copyfile(source, os.path.join(out, rel))

    def add_job_files(self, model: DescribeJob):
        """Jupyter Scheduler's files, and the files the notebook wrote (its ``Files``
        entry, which it lists only for a packaged input folder)."""
        super().add_job_files(model)
        if model.packaged_files and not model.package_input_folder:
            out = self.get_local_output_path(model, root_dir_relative=True)
            model.job_files.append(
                JobFile(
                    display_name="Files",
                    file_format="files",
                    file_path=out if self.dir_exists(out) else None,
                )
            )

    async def get_job(self, job_id: str, job_files: bool | None = True) -> DescribeJob:
        await self.look()
        return super().get_job(job_id, job_files)

    async def list_jobs(self, query: ListJobsQuery) -> ListJobsResponse:
        await self.look(schedules=True)
        return super().list_jobs(query)

    async def count_jobs(self, query: CountJobsQuery) -> int:
        await self.look()
        return super().count_jobs(query)

    def _gpulab_job(self, job_id: str) -> str | None:
        with self._links.connect() as conn:
            return conn.execute(
                select(job_links.c.gpulab_job_id).where(job_links.c.job_id == job_id)
            ).scalar()

    async def stop_job(self, job_id: str) -> None:
        gpulab_job_id = self._gpulab_job(job_id)
        if gpulab_job_id is None:
            return
        self._set(job_id, status=Status.STOPPING)
        try:
            await self.client.cancel_job(gpulab_job_id)
        except NotFound:
            pass
        except GpuLabError as e:
            raise SchedulerError(
                f"gpulab could not stop job {gpulab_job_id}: {e.message}"
            ) from None
        await self.look()

    async def delete_job(self, job_id: str) -> None:
        with self.db_session() as session:
            record = session.query(Job).filter(Job.job_id == job_id).one()
            describe = DescribeJob.from_orm(record)
        if describe.status not in FINAL:
            await self.stop_job(job_id)
        folder = os.path.dirname(self.get_staging_paths(describe)["input"])
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        with self.db_session() as session:
            session.query(Job).filter(Job.job_id == job_id).delete()
            session.commit()
        # The link stays, as done: a scheduled run deleted here would otherwise be
        # adopted again at the next look (sync_schedules: a run no link names is new).
        with self._links.begin() as conn:
            conn.execute(
                update(job_links).where(job_links.c.job_id == job_id).values(collected=True)
            )

    # -- job definitions: schedules kept by the service --------------------------------
    def _schedule_of(self, definition_id: str) -> str | None:
        with self._links.connect() as conn:
            return conn.execute(
                select(schedule_links.c.schedule_id).where(
                    schedule_links.c.job_definition_id == definition_id
                )
            ).scalar()

    def _schedule_body(self, definition: DescribeJobDefinition, milli: int) -> dict:
        staging = self.get_staging_paths(definition)
        return {
            "name": definition.name,
            "schedule": definition.schedule,
            "timezone": definition.timezone or "UTC",
            "active": bool(definition.active),
            "job": job_body(
                staging["input"],
                name=definition.name,
                parameters=definition.parameters,
                gpu_milli=milli,
                package_folder=bool(definition.package_input_folder),
            ),
            "meta": {"job_definition_id": definition.job_definition_id},
        }

    async def create_job_definition(self, model: CreateJobDefinition) -> str:
        milli = await self._slice_of(model)
        definition_id = super().create_job_definition(model)
        if not model.schedule:
            return definition_id
        try:
            body = self._schedule_body(self.get_job_definition(definition_id), milli)
            sched = await self.client.request("POST", "/schedules", body=body)
        except (GpuLabError, ParameterError) as e:
            self._drop_definition(definition_id)
            message = e.message if isinstance(e, GpuLabError) else str(e)
            raise SchedulerError(f"gpulab refused the schedule: {message}") from None
        with self._links.begin() as conn:
            conn.execute(
                insert(schedule_links),
                [{"job_definition_id": definition_id, "schedule_id": sched["id"]}],
            )
        return definition_id

    async def update_job_definition(self, job_definition_id: str, model: UpdateJobDefinition):
        super().update_job_definition(job_definition_id, model)
        definition = self.get_job_definition(job_definition_id)
        schedule_id = self._schedule_of(job_definition_id)
        if schedule_id is None and not definition.schedule:
            return
        milli = await self._slice_of(definition)
        body = self._schedule_body(definition, milli)
        try:
            if schedule_id is None:
                sched = await self.client.request("POST", "/schedules", body=body)
                with self._links.begin() as conn:
                    conn.execute(
                        insert(schedule_links),
                        [{"job_definition_id": job_definition_id, "schedule_id": sched["id"]}],
                    )
            else:
                await self.client.request("PATCH", f"/schedules/{schedule_id}", body=body)
        except GpuLabError as e:
            raise SchedulerError(f"gpulab refused the schedule: {e.message}") from None

    async def delete_job_definition(self, job_definition_id: str) -> None:
        schedule_id = self._schedule_of(job_definition_id)
        if schedule_id is not None:
            try:
                await self.client.request("DELETE", f"/schedules/{schedule_id}")
            except NotFound:
                pass
            except GpuLabError as e:
                raise SchedulerError(f"gpulab kept the schedule: {e.message}") from None
        with self.db_session() as session:
            ids = [
                j.job_id
                for j in session.query(Job).filter(Job.job_definition_id == job_definition_id)
            ]
        for job_id in ids:
            await self.delete_job(job_id)
        self._drop_definition(job_definition_id)

    def _drop_definition(self, job_definition_id: str) -> None:
        definition = self.get_job_definition(job_definition_id)
        folder = os.path.dirname(self.get_staging_paths(definition)["input"])
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        with self.db_session() as session:
            session.query(JobDefinition).filter(
                JobDefinition.job_definition_id == job_definition_id
            ).delete()
            session.commit()
        with self._links.begin() as conn:
            conn.execute(
                delete(schedule_links).where(
                    schedule_links.c.job_definition_id == job_definition_id
                )
            )

    async def create_job_from_definition(
        self, job_definition_id: str, model: CreateJobFromDefinition
    ) -> str:
        definition = self.get_job_definition(job_definition_id)
        attributes = definition.dict(exclude={"schedule", "timezone"}, exclude_none=True)
        attributes = {
            **attributes,
            **model.dict(exclude_none=True),
            "input_uri": self.get_staging_paths(definition)["input"],
        }
        return await self.create_job(CreateJob(**attributes))

    async def sync_schedules(self) -> None:
        """Records for the jobs the service's schedules submitted since the last look
        (while this server was stopped, too)."""
        with self._links.connect() as conn:
            scheduled = list(conn.execute(select(schedule_links)))
            known = {r.gpulab_job_id for r in conn.execute(select(job_links.c.gpulab_job_id))}
        for link in scheduled:
            try:
                runs = await self.client.request("GET", f"/schedules/{link.schedule_id}/runs")
            except GpuLabError as e:
                log.warning("gpulab's schedule %s: %s", link.schedule_id, e)
                continue
            for run in runs:
                if run["job_id"] not in known:
                    self._adopt(link.job_definition_id, run)

    def _adopt(self, definition_id: str, run: dict) -> None:
        """A record for a job the schedule of ``definition_id`` submitted."""
        definition = self.get_job_definition(definition_id)
        source = self.get_staging_paths(definition)["input"]
        attributes = definition.dict(exclude={"schedule", "timezone"}, exclude_none=True)
        model = CreateJob(**attributes, input_uri=source)
        with self.db_session() as session:
            job = Job(**model.dict(exclude_none=True, exclude={"input_uri"}))
            job.status = Status.QUEUED
            job.create_time = _ms(run["fired"])
            session.add(job)
            session.commit()
            describe = DescribeJob.from_orm(job)
        staging = self.get_staging_paths(describe)
        os.makedirs(os.path.dirname(staging["input"]), exist_ok=True)
        shutil.copyfile(source, staging["input"])
        with self._links.begin() as conn:
            conn.execute(
                insert(job_links), [{"job_id": describe.job_id, "gpulab_job_id": run["job_id"]}]
            )
