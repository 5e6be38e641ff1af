"""The job queue: class and priority first, then fair share, then first come first
served; all-or-nothing starts.

The order is the caller's (:attr:`JobQueue.order`, a sort key per job row); the
service orders by priority class, then the job's priority, then its owner's
decayed GPU use (least first), then submit time. Without one: priority, then
submit time.

A job needs one slice per rank. :meth:`JobQueue.admit` walks the queued jobs
in order and asks the ledger for each job's ranks as one gang
(:meth:`~.ledger.Ledger.allocate_gang`), so a job either holds every slice it
needs or none. When the cluster has no room for the job at the head, the jobs
behind it wait too (no backfilling): a large job is never starved by a stream
of small ones. A job that only waits for its owner's quota (their other
servers and jobs) does not hold up other users' jobs.

A job whose slices exceed its owner's quota *limit* could never start, even on
an empty cluster; :func:`never_fits` says so at submit time and it is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from gpulab.db.engine import utcnow
from gpulab.db.jobs import JobStore

from .ledger import Ledger, NoCapacity
from .quota import QuotaExceeded, Quotas
from .slices import label


def never_fits(quotas: Quotas, user: str, milli: int, groups: Mapping[str, set[str]]) -> str | None:
    """Why a request of ``milli`` can never fit the user's or a group's quota, if so."""
    if milli == 0:
        return None
    limit = quotas.user_limit(user)
    if limit is not None and milli > limit:
        return (
            f"over your quota: the job needs {label(milli)} in all and your quota is "
            f"{label(limit)}; use fewer ranks or a smaller --gpu, or ask an admin for more"
        )
    for group in sorted(groups):
        glimit = quotas.group_milli.get(group)
        if glimit is not None and milli > glimit:
            return (
                f"over the quota of group {group!r}: the job needs {label(milli)} "
                f"in all and the group's quota is {label(glimit)}"
            )
    return None


#: How the message of a job sent back to the queue by a preemption begins.
PREEMPTED = "preempted for "


@dataclass
class Place:
    """A pool a queued job may start in: its name, the ledger as the pool sees it,
    the job's node groups there and the pool's backend kind."""

    pool: str
    ledger: Ledger
    node_groups: list[int] | None = None
    kind: str = ""


def _full(full: list[tuple[str, str]]) -> str:
    if len(full) == 1:
        return full[0][1]
    return "; ".join(f"pool {pool}: {why}" for pool, why in full)


def _overflow(pool: str, full: list[tuple[str, str]]) -> str:
    """Why a job starts in a later pool: the ones before it had no room."""
    if not full:
        return ""
    before = ", ".join(p for p, _ in full)
    return f"starting on pool {pool}: pool {before} had no room ({full[0][1].split(':')[0]})"


def submit_order(job: dict) -> tuple:
    return (-job["priority"], job["submitted"], job["id"])


class JobQueue:
    def __init__(self, engine: Engine, order: Callable[[list[dict]], Callable] | None = None):
        self.engine = engine
        self.rows = JobStore(engine)
        #: Given the queued rows, the sort key to order them by (read once per pass).
        self.order = order or (lambda _rows: submit_order)

    # -- rows (the queries: gpulab.db.jobs.JobStore) ----------------------------------------
    def add(self, job: dict, most_queued: int | None = None) -> dict:
        """The new row; :class:`~gpulab.db.jobs.QueueFull` when its user already has
        ``most_queued`` jobs queued."""
        self.rows.add(job, most_queued)
        return self.get(job["id"])

    def get(self, job_id: str) -> dict | None:
        return self.rows.get(job_id)

    def queued_of(self, user: str) -> int:
        return self.rows.queued_of(user)

    def list(self, user: str | None = None, states: tuple[str, ...] | None = None) -> list[dict]:
        return self.rows.list(user, states)

    def newest(self, user: str | None, n: int) -> list[dict]:
        """The ``n`` jobs submitted last (of ``user`` where given), newest first."""
        return self.rows.newest(user, n)

    def update(self, job_id: str, **values) -> None:
        self.rows.update(job_id, **values)

    def finish(self, job_id: str, state: str, message: str = "", **values) -> bool:
        """Move a job to a terminal state once; ``False`` if it already was in one."""
        return self.rows.finish(job_id, state, message, **values)

    # -- order -----------------------------------------------------------------------
    def queued(self) -> list[dict]:
        """Queued jobs, the next to start first."""
        rows = self.rows.list(states=("queued",))
        return sorted(rows, key=self.order(rows))

    def positions(self) -> dict[str, int]:
        """Queued job id -> its place in the queue (1 = the next to start)."""
        return {job["id"]: i for i, job in enumerate(self.queued(), 1)}

    def position(self, job_id: str) -> int | None:
        """1 for the next job to start; None when the job is not queued."""
        return self.positions().get(job_id)

    def admit(
        self,
        ledger: Ledger,
        groups: Mapping[str, Mapping[str, set[str]]],
        members: Callable[[dict], list[tuple[str, int]]],
        node_groups: Callable[[dict], list[int] | None] = lambda job: None,
        places: Callable[[dict], list[Place]] | None = None,
    ) -> tuple[list[tuple[dict, list[dict]]], dict | None]:
        """Start what fits, in order: ``(job, allocation rows)`` for each admitted, and
        the job that found no room (the head of what waits), if any.

        ``groups`` maps each queued job's user to their quota groups; ``members``
        gives a job's ``(owner, milli)`` per rank; ``node_groups`` its ranks' node
        ranks when they must land on distinct nodes (see ``Ledger.allocate_gang``).
        ``places`` gives the pools a job may run in, in the order to try them (the
        first with room takes it; its name goes in the row's ``pool``); without it,
        ``ledger`` itself. Admitted jobs are marked ``running`` here, in the same pass,
        so no other pass admits them again.
        """
        admitted = []
        blocked = None
        for job in self.queued():
            tries = places(job) if places else [Place("", ledger, node_groups(job))]
            if not tries:  # its pools are gone (the site changed): it holds up no one
                self._wait(job, "no pool of this site can run it now; cancel it and submit again")
                continue
            full: list[tuple[str, str]] = []
            try:
                for place in tries:
                    try:
                        rows = place.ledger.allocate_gang(
                            job["user"],
                            "job",
                            members(job),
                            groups.get(job["user"], {}),
                            place.node_groups,
                        )
                        break
                    except NoCapacity as e:
                        full.append((place.pool, str(e)))
                else:
                    never = [
                        p.pool
                        for p in tries
                        if not p.ledger.could_place_when_empty(members(job), p.node_groups)
                    ]
                    if len(never) == len(tries):
                        # Not even with every GPU free (its pools shrank since it was
                        # queued): waiting at the head, it would hold up every job behind.
                        named = ", ".join(p for p in never if p)
                        where = f" (pool {named} as it is now)" if named else ""
                        self._wait(
                            job,
                            f"no pool here could place it even with every GPU free{where}; "
                            "cancel it and submit a smaller one",
                        )
                        continue
                    self._wait(job, "waiting for free GPUs: " + _full(full))
                    blocked = job
                    break
            except QuotaExceeded as e:
                self._wait(job, f"waiting for quota: {e}")
                continue
            self.start(job["id"], place.pool, place.kind, _overflow(place.pool, full))
            admitted.append((self.get(job["id"]), rows))
        return admitted, blocked

    def start(self, job_id: str, pool: str = "", kind: str = "", message: str = "") -> None:
        """Mark a job whose slices are placed (in ``pool``, of backend ``kind``) as
        running; ``message`` says why there, when the pool is not its first choice."""
        values = {"pool": pool, "backend": kind} if pool else {}
        self.update(
            job_id, state="running", started=utcnow(), message=message or "starting", **values
        )

    def _wait(self, job: dict, reason: str) -> None:
        if job["message"].startswith(PREEMPTED):
            return  # says what it waits for and where it resumes: more than the reason
        if job["message"] != reason:
            self.update(job["id"], message=reason)
