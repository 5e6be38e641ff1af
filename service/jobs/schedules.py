"""Scheduled jobs: a job spec the service submits on a cron schedule, as its owner.

A user's server may be stopped when their nightly job is due, so the schedule is
the service's: a row (:mod:`gpulab.db.schedules`) with the body of ``POST /jobs``,
a cron line and a time zone. A loop submits each due schedule's job through the
job manager, as the owner (queued, preempted, accounted and refused by quota like
any job they submit), records the job as one of the schedule's runs, and moves
``next_run`` to the next time the cron names after now. Time is
:mod:`gpulab.db.clock`'s, so a test's clock fires a schedule without waiting.

Jupyter Scheduler's job definitions with a schedule (``gpulab.lab.notebook_jobs``)
are these; the server finds their runs (``GET /schedules/{id}/runs``) when it
starts again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import unicodedata
import uuid
import zoneinfo

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from gpulab.db import clock
from gpulab.db.schedules import OverLimit, ScheduleStore, stored_size
from gpulab.scheduler.slices import noun, plural
from gpulab.service.auth import Identity
from gpulab.service.jobs.manager import JobManager, JobRefused
from gpulab.service.tasks import KeptTask, wait_for_wake

log = logging.getLogger("gpulab.service.jobs.schedules")

#: How often the loop looks for due schedules (a cron's finest step is a minute).
TICK_S = 1.0
#: The most schedules one user keeps.
MAX_PER_USER = 100
#: What one user's schedules may take together unless said (``c.JobQueue.max_schedules_mib``).
DEFAULT_MAX_BYTES = 64 << 20
#: Fields of a schedule a client sets.
FIELDS = ("name", "schedule", "timezone", "active", "job", "meta")


#: The longest cron line and time zone name kept (their columns' sizes).
MAX_SCHEDULE_CHARS = 255
MAX_TIMEZONE_CHARS = 64
#: A run that could not be submitted because the hub did not answer is tried again
#: this long after (the missed run is made up, once).
RETRY_S = 60.0


class OwnerGone(Exception):
    """The hub has no user of the schedule's owner's name (any more), or the one it has
    was made after the schedule (a later user given the name)."""


class ScheduleRefused(Exception):
    """Bad input or not allowed; ``status`` is the HTTP code to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _instant(wall: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    """The UTC instant of the wall-clock time ``wall`` (naive) in ``zone``, as cron
    reads it: in the hour repeated when clocks go back, its first pass (``fold=0``);
    a time the clocks skip when they go forward, the moment they skip to (cron runs
    such a job right after the change)."""
    instant = wall.replace(tzinfo=zone, fold=0).astimezone(dt.UTC)
    if instant.astimezone(zone).replace(tzinfo=None) == wall:
        return instant
    # In the gap: the first wall-clock minute after it that exists (clocks skip at most
    # a day, as Samoa's did in 2011).
    later = wall.replace(second=0, microsecond=0)
    for _ in range(26 * 60):
        later += dt.timedelta(minutes=1)
        instant = later.replace(tzinfo=zone, fold=0).astimezone(dt.UTC)
        if instant.astimezone(zone).replace(tzinfo=None) == later:
            return instant
    raise ValueError(f"{wall} does not exist in {zone.key}, nor a day after it")


def next_run(schedule: str, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first time after ``after`` that ``schedule`` (cron) names, in UTC; the
    cron's hours are the time zone's wall clock, whatever its offset that day (the
    cron is read on the local time without its offset, then each time it names is
    placed in the zone: an offset taken from ``after`` would be an hour off on the
    other side of a change of daylight saving time, or name ``after`` itself again)."""
    zone = zoneinfo.ZoneInfo(timezone)
    after = after.astimezone(dt.UTC) if after.tzinfo else after.replace(tzinfo=dt.UTC)
    wall = after.astimezone(zone).replace(tzinfo=None)
    cron = croniter(schedule, wall)
    # Wall-clock times before ``after`` come only from the repeated hour (an hour at
    # most, every minute of it) or a gap: a bound far above both.
    for _ in range(10_000):
        when = _instant(cron.get_next(dt.datetime), zone)
        if when > after:
            return when
    raise ValueError(f"{schedule!r} in {timezone} names no time after {after.isoformat()}")


def check_schedule(schedule, timezone) -> None:
    if not isinstance(schedule, str) or len(schedule.split()) != 5:
        raise ScheduleRefused(
            400,
            f"'schedule' must be a cron line of five fields (minute hour day month "
            f"weekday), e.g. '0 2 * * *' for 02:00 every day; got {schedule!r}",
        )
    if len(schedule) > MAX_SCHEDULE_CHARS:
        raise ScheduleRefused(
            400,
            f"'schedule' is {len(schedule)} characters, over the {MAX_SCHEDULE_CHARS} a cron "
            f"line may have here; name fewer values (ranges such as 1-5, steps such as */5)",
        )
    try:
        cron = croniter(schedule)
    except (CroniterBadCronError, ValueError, KeyError) as e:
        raise ScheduleRefused(400, f"'schedule' {schedule!r} is not a cron line: {e}") from None
    try:
        # A cron line can be well formed and name no date (30 February): refused
        # here, not a 500 when its next run is worked out.
        cron.get_next(dt.datetime)
    except CroniterBadDateError:
        raise ScheduleRefused(
            400,
            f"'schedule' {schedule!r} never matches a date (no month has that day); "
            f"pick a day the month has",
        ) from None
    if not isinstance(timezone, str) or not timezone:
        raise ScheduleRefused(
            400,
            f"'timezone' must be a time zone name such as 'UTC' or "
            f"'Europe/Berlin', got {timezone!r}",
        )
    bad_zone = ScheduleRefused(
        400, f"'timezone' {timezone!r} is not a time zone name (e.g. 'UTC', 'Asia/Shanghai')"
    )
    if len(timezone) > MAX_TIMEZONE_CHARS:
        raise bad_zone
    try:
        # A folder of the time zone database ('America') is an IsADirectoryError, a
        # name too long for the file system an OSError.
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise bad_zone from None


def hub_time(value) -> dt.datetime | None:
    """A time in the hub's user model (``"2026-12-01T03:00:00.123456Z"``), in UTC; None
    when it says none (or something that is not a time)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def _public(sched: dict | None) -> dict | None:
    """A schedule as the API shows it (what the service keeps of its owner left out)."""
    if sched is not None:
        sched.pop("owner_created", None)
    return sched


class ScheduledJobs:
    """Schedules kept, checked and fired. Built from the job manager (which submits
    each run as its owner) and who a user is (their admin flag and groups)."""

    def __init__(
        self,
        *,
        engine,
        jobs: JobManager,
        identity_of,
        created_of=None,
        audit=None,
        max_bytes=DEFAULT_MAX_BYTES,
    ):
        self.engine = engine
        self.rows = ScheduleStore(engine)
        self.jobs = jobs
        #: The most bytes one user's schedules take together, as stored.
        self.max_bytes = max_bytes
        #: The audit trail (``record(action, subject, **fields)``): each run's submit.
        self.audit = audit
        #: ``await identity_of(user, made)``: the owner as the hub says now (admin,
        #: groups); raises :class:`OwnerGone` when the hub has no such user, or has one
        #: made after ``made`` (a UTC time, or None: not judged).
        self.identity_of = identity_of
        #: ``await created_of(user)``: when the hub made ``user`` (UTC), None if it
        #: does not say; kept with each schedule made. None: not kept.
        self.created_of = created_of
        self._wake = asyncio.Event()
        self._loop = KeptTask("gpulab-schedules", self.loop)

    @classmethod
    def of(cls, service) -> ScheduledJobs:
        async def identity_of(user: str, made: dt.datetime | None = None) -> Identity:
            # identify() makes a plain user of a name the hub does not know; a run
            # for a deleted user (or a later one given the name) must not go.
            model = await service.hub.user(user)
            if model is None:
                raise OwnerGone(f"the hub has no user {user!r} (deleted)")
            created = hub_time(model.get("created"))
            if made is not None and created is not None and created > made:
                raise OwnerGone(
                    f"the hub's user {user!r} was made {created.isoformat()}, after the "
                    f"schedule's owner of that name (deleted, and the name given again)"
                )
            return await service.identify({"kind": "user", "name": user})

        async def created_of(user: str) -> dt.datetime | None:
            return hub_time((await service.hub.user(user) or {}).get("created"))

        return cls(
            engine=service.engine,
            jobs=service.jobs,
            identity_of=identity_of,
            created_of=created_of,
            audit=service.audit,
            max_bytes=service.job_queue.max_schedules_mib << 20,
        )

    # -- running -----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.fire_due()
            except Exception:  # the loop must outlive one bad schedule or a hub hiccup
                log.exception("scheduled jobs")
            await wait_for_wake(self._wake, TICK_S)

    async def fire_due(self) -> list[str]:
        """Submit the job of every schedule whose time has come; the ids submitted."""
        now = clock.utcnow()
        submitted = []
        for sched in await asyncio.to_thread(self.rows.due, now):
            try:
                job_id = await self._fire(sched, now)
            except Exception:  # one schedule failing never holds up the others
                log.exception("Schedule %s of %s", sched["id"], sched["user"])
                continue
            if job_id:
                submitted.append(job_id)
        return submitted

    @staticmethod
    def _following(sched: dict, now: dt.datetime) -> dt.datetime:
        """The run after this one: always after ``now`` (a run at ``now`` again would
        fire at every tick)."""
        following = next_run(sched["schedule"], sched["timezone"], now)
        if following <= now:
            following = next_run(
                sched["schedule"], sched["timezone"], now + dt.timedelta(seconds=RETRY_S)
            )
        return following

    @staticmethod
    def _made(sched: dict) -> dt.datetime | None:
        """When the schedule's owner was made, as far as it knows: the hub's time kept
        with it, else (made before that was kept) the schedule's own creation."""
        return hub_time(sched.get("owner_created")) or hub_time(sched.get("created"))

    async def _fire(self, sched: dict, now: dt.datetime) -> str | None:
        """Submit one due schedule's job; its id, or None when it was not submitted."""
        sid, user = sched["id"], sched["user"]
        # Taken before anything can fail, and only if nothing changed it since it was
        # read (paused, deleted, edited or taken by another look): a schedule fires once
        # per time its cron names, never again at every tick, and with its job as it is.
        following = self._following(sched, now)
        claimed = await asyncio.to_thread(self.rows.claim, sched, following, now)
        if claimed is None:
            return None
        sched = claimed
        try:
            who = await self.identity_of(user, self._made(sched))
            job = await self.jobs.submit(who, dict(sched["job"]))
        except OwnerGone as e:
            reason = f"not run: {e}; the schedule is paused"
            log.warning("Schedule %s: %s", sid, reason)
            await asyncio.to_thread(self.rows.update, sid, active=False, last_error=reason)
            await self._audit(sched, sid, "denied", reason=reason)
            return None
        except JobRefused as e:
            log.warning("Schedule %s of %s: the job was refused: %s", sid, user, e)
            await asyncio.to_thread(self.rows.update, sid, last_error=str(e))
            await self._audit(sched, sid, "denied", reason=str(e))
            return None
        except Exception as e:  # the hub down: this run is made up once it answers
            log.exception("Schedule %s of %s", sid, user)
            retry = now + dt.timedelta(seconds=RETRY_S)
            error = f"could not submit ({e}); tried again at {retry.isoformat()}"
            await asyncio.to_thread(self.rows.put_back, sid, following, retry, error)
            return None
        await asyncio.to_thread(self.rows.update, sid, last_error=None)
        await asyncio.to_thread(self.rows.add_run, sid, job["id"], now)
        try:
            self.jobs.jobdir(job).event(f"submitted by schedule {sid} ({sched['name']})")
        except OSError as e:  # the job is submitted and its run recorded all the same
            log.warning("Schedule %s: job %s's event log: %s", sid, job["id"], e)
        await self._audit(sched, job["id"], "ok", schedule=sid, name=job.get("name"))
        log.info("Schedule %s of %s submitted job %s", sid, user, job["id"])
        return job["id"]

    async def _audit(self, sched: dict, subject: str, result: str, **detail) -> None:
        """A run's submit in the audit trail, as the service's on the owner's behalf."""
        if self.audit is not None:
            await self.audit.record(
                "job.submit", subject, user=sched["user"], result=result, **detail
            )

    # -- reading (in a thread: a user's schedules may hold tens of MiB of bodies) -------
    async def get(self, who, schedule_id: str) -> dict:
        """A schedule the caller may see (their own; admins any), else a 404."""
        sched = _public(await asyncio.to_thread(self.rows.get, schedule_id))
        if sched is None or not who.can_act_for(sched["user"]):
            raise ScheduleRefused(404, f"no schedule {schedule_id!r}")
        return sched

    async def list(self, user: str | None) -> list[dict]:
        return [_public(s) for s in await asyncio.to_thread(self.rows.list, user)]

    async def runs(self, who, schedule_id: str) -> list[dict]:
        await self.get(who, schedule_id)
        return await asyncio.to_thread(self.rows.runs, schedule_id)

    # -- changing ----------------------------------------------------------------------
    @staticmethod
    def _check_job(job) -> None:
        if not isinstance(job, dict):
            raise ScheduleRefused(400, "'job' must be a job spec, the body of POST /jobs")

    async def _check_job_as(self, owner: Identity, job: dict) -> None:
        """The job body as ``POST /jobs`` would take it from ``owner`` now, by the
        checks that do not change with the time (the spec, the slice size, the site's
        caps, the priority and its class), with the same 4xx: a schedule whose every run
        would be refused is refused when it is made. Its budget, queue, quota and room
        are judged at each run, as for a job submitted then."""
        try:
            await self.jobs.intake.checked_spec(owner, job)
        except JobRefused as e:
            raise ScheduleRefused(e.status, f"'job': {e}") from None

    async def _owner(self, who, user: str) -> Identity:
        """Whom the schedule's runs are submitted as: the caller if it is theirs, else
        (an admin changing another's) the owner as the hub says, or a plain user."""
        if who.kind == "user" and who.name == user:
            return who
        try:
            return await self.identity_of(user)
        except OwnerGone:
            return Identity(user, "user")

    def _checked(self, body, base: dict) -> dict:
        if not isinstance(body, dict):
            raise ScheduleRefused(400, "the body must be a JSON object")
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise ScheduleRefused(
                400,
                f"unknown {noun(len(unknown), 'field')}: {', '.join(unknown)}; "
                f"known: {', '.join(FIELDS)}",
            )
        merged = {**base, **body}
        name = merged.get("name")
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise ScheduleRefused(400, "'name' must be a text of 1 to 255 characters")
        # The name goes into its jobs' event logs: a line break in it would forge a line.
        if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in name):
            raise ScheduleRefused(
                400, f"'name' {name!r} holds a control character or line break; remove it"
            )
        check_schedule(merged.get("schedule"), merged.get("timezone"))
        if not isinstance(merged.get("active"), bool):
            raise ScheduleRefused(400, "'active' must be true or false")
        if not isinstance(merged.get("meta"), dict):
            raise ScheduleRefused(400, "'meta' must be a JSON object")
        self._check_job(merged.get("job"))
        return merged

    async def create(self, who, body) -> dict:
        if who.kind != "user":
            raise ScheduleRefused(403, "schedules are made by users (with a user's token)")
        base = {"timezone": "UTC", "active": True, "meta": {}}
        sched = await asyncio.to_thread(self._checked, body, base)
        await self._check_job_as(who, sched["job"])
        now = clock.utcnow()
        row = {
            **{k: sched[k] for k in FIELDS},
            "id": uuid.uuid4().hex[:12],
            "user": who.name,
            "created": now,
            "owner_created": await self.created_of(who.name) if self.created_of else None,
            "next_run": next_run(sched["schedule"], sched["timezone"], now),
        }
        try:
            await asyncio.to_thread(
                self.rows.add, row, max_count=MAX_PER_USER, max_bytes=self.max_bytes
            )
        except OverLimit as e:
            count, used = e.args
            if count >= MAX_PER_USER:
                raise ScheduleRefused(
                    409, f"you have {MAX_PER_USER} schedules, the most one user keeps; delete one"
                ) from None
            raise self._too_large(row, count, used) from None
        self._wake.set()
        return _public(await asyncio.to_thread(self.rows.get, row["id"]))

    async def update(self, who, schedule_id: str, body) -> dict:
        current = await self.get(who, schedule_id)
        sched = await asyncio.to_thread(self._checked, body, {k: current[k] for k in FIELDS})
        if isinstance(body, dict) and "job" in body:  # one left as it was is not judged again
            await self._check_job_as(await self._owner(who, current["user"]), sched["job"])
        values = {k: sched[k] for k in FIELDS}
        if (sched["schedule"], sched["timezone"], sched["active"]) != (
            current["schedule"],
            current["timezone"],
            current["active"],
        ):
            values["next_run"] = next_run(sched["schedule"], sched["timezone"], clock.utcnow())
        try:
            await asyncio.to_thread(
                self.rows.replace, schedule_id, current["user"], values, max_bytes=self.max_bytes
            )
        except OverLimit as e:
            count, used = e.args
            raise self._too_large(values, count, used) from None
        self._wake.set()
        return _public(await asyncio.to_thread(self.rows.get, schedule_id))

    def _too_large(self, sched: dict, others: int, used: int) -> ScheduleRefused:
        """Why a schedule of this size is refused: alone over the cap (413), or with the
        owner's ``others`` schedules, which take ``used`` bytes (409)."""
        size, cap = stored_size(sched), self.max_bytes

        def mib(n: int) -> str:
            return f"{n / 2**20:.1f} MiB"

        fix = "an admin can raise c.JobQueue.max_schedules_mib"
        if size > cap:
            return ScheduleRefused(
                413,
                f"the schedule's job and meta take {mib(size)}, over the {mib(cap)} one "
                f"user's schedules may keep; put the data in a folder or dataset the job "
                f"reads ({fix})",
            )
        return ScheduleRefused(
            409,
            f"your other {plural(others, 'schedule')} take {mib(used)}; with this one "
            f"({mib(size)}) they would be over the {mib(cap)} one user's schedules may "
            f"keep: delete one or make this one smaller ({fix})",
        )

    async def delete(self, who, schedule_id: str) -> None:
        """The schedule goes; jobs it submitted stay (cancel them with DELETE /jobs/{id})."""
        await self.get(who, schedule_id)
        await asyncio.to_thread(self.rows.remove, schedule_id)
