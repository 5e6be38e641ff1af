"""The lab's record of each notebook job's gpulab job (Jupyter Scheduler's scheduler,
in this process, over a stand-in for the service's client):

- a job whose outputs cannot be written back is failed once, saying why, not read
  again (its whole output) at every look of the panel;
- a scheduled run deleted in the panel stays deleted (it was adopted again at the
  next look, as a run no record names)."""

from __future__ import annotations

from jupyter_scheduler.models import Status
from jupyter_scheduler.orm import Job, create_tables
from sqlalchemy import insert, select

from gpulab.lab.notebook_jobs.environments import GpulabEnvironments
from gpulab.lab.notebook_jobs.scheduler import GpulabScheduler, job_links, schedule_links

FINISHED = "2026-12-07T03:00:05+00:00"


class StandInService:
    """The service as the scheduler's client sees it: one finished gpulab job, whose
    output cannot be read here, and one schedule that submitted it."""

    def __init__(self):
        self.output_reads = 0

    async def list_jobs(self):
        return [{"id": "g1", "state": "succeeded", "started": FINISHED, "finished": FINISHED}]

    async def job_output(self, job_id):
        self.output_reads += 1
        raise OSError(28, "No space left on device")

    async def request(self, method, path, **kw):
        assert (method, path) == ("GET", "/schedules/s1/runs")
        return [{"job_id": "g1", "fired": FINISHED}]


def scheduler(tmp_path) -> tuple[GpulabScheduler, StandInService]:
    db = f"sqlite:///{tmp_path}/scheduler.sqlite"
    create_tables(db)
    s = GpulabScheduler(
        root_dir=str(tmp_path), environments_manager=GpulabEnvironments(), db_url=db
    )
    service = StandInService()
    s._client = service
    return s, service


def a_job(s: GpulabScheduler, status: str) -> str:
    with s.db_session() as session:
        job = Job(
            runtime_environment_name="gpulab",
            input_filename="train.ipynb",
            name="nightly",
            status=status,
            output_formats=["ipynb"],
        )
        session.add(job)
        session.commit()
        return job.job_id


async def test_outputs_that_cannot_be_written_back_fail_the_job_once(tmp_path):
    s, service = scheduler(tmp_path)
    job_id = a_job(s, Status.IN_PROGRESS)
    with s._links.begin() as conn:
        conn.execute(insert(job_links), [{"job_id": job_id, "gpulab_job_id": "g1"}])
    await s.look()
    await s.look()
    assert service.output_reads == 1
    with s.db_session() as session:
        job = session.query(Job).filter(Job.job_id == job_id).one()
        assert job.status == Status.FAILED
        assert job.status_message == (
            "its outputs could not be written back: OSError: [Errno 28] No space left on device"
        )


async def test_a_scheduled_run_deleted_in_the_panel_stays_deleted(tmp_path):
    s, _ = scheduler(tmp_path)
    job_id = a_job(s, Status.COMPLETED)
    with s._links.begin() as conn:
        conn.execute(insert(schedule_links), [{"job_definition_id": "d1", "schedule_id": "s1"}])
        conn.execute(
            insert(job_links), [{"job_id": job_id, "gpulab_job_id": "g1", "collected": True}]
        )
    await s.delete_job(job_id)
    await s.sync_schedules()  # the run g1 is the schedule's: known, not adopted again
    with s.db_session() as session:
        assert session.query(Job).count() == 0
    with s._links.connect() as conn:
        assert [r.gpulab_job_id for r in conn.execute(select(job_links))] == ["g1"]
