"""Making room: claims for a slice, the victims chosen for them, and placing the claim.

When a server, an endpoint's replicas or a job of a higher class cannot be
placed, :meth:`Preemption.make_room` looks for victims: first other users' idle
servers (a request of the servers' class or higher may hibernate them: their
kernels' variables are saved, no work is lost), then the preemptible jobs it may
take from (:func:`eligible`), with the scheduler's
:func:`~gpulab.scheduler.preemption.choose_victims`. Each victim is asked to
checkpoint and stop (:meth:`.stops.JobStops.preempt`); the request becomes a
*claim*. The job loop requeues victims as they stop and then places the claim
(:meth:`Preemption.settle`), before any queued job can take the room. The
spawner and ``%deploy`` see the claim as "freeing a slice" until it is placed.

Claims are kept on the victims' rows (``preempting``), so a restarted service
finishes what it started.

Who may take from whom (the rules of Kueue and KAI-Scheduler):

- a higher class takes from lower classes, as long as the victim's owner is
  borrowing (above their guarantee) or is the requester themselves;
- a user within their guarantee reclaims from borrowers of the same or lower class.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping

from gpulab.scheduler.elastic import is_surplus, shrink_targets, surplus_holders
from gpulab.scheduler.ledger import NoCapacity, OwnerConflict
from gpulab.scheduler.policy import Request
from gpulab.scheduler.preemption import Holder, Plan, choose_victims, placeable
from gpulab.scheduler.quota import QuotaExceeded, Quotas
from gpulab.scheduler.slices import MILLI_PER_GPU, shape_of
from gpulab.service.jobs.book import JobBook
from gpulab.service.jobs.elastic import Resizes
from gpulab.service.jobs.stops import JobStops
from gpulab.service.sharing import groups_by_user

log = logging.getLogger("gpulab.service.jobs.preemption")

#: About how long an elastic job pauses to change size (a step boundary, a
#: checkpoint, a restart): what shrinking costs, per GPU it keeps.
RESIZE_PAUSE_S = 10.0
#: How long a claim may wait after its grace period before it is given up
#: (a victim that will not die; the requester asks again and gets a new plan).
CLAIM_SLACK_S = 60.0
#: How long preemption waits for users' servers to say whether they are idle: it
#: asks with the job queue's lock held, so a server that hangs must not hold it long
#: (and is not asked again for 10 minutes). An ask is six calls through the hub and
#: the server (a token made, checked and revoked): 3 s was too short on a loaded host.
IDLE_ASK_S = 10.0


@dataclasses.dataclass
class Claim:
    kind: str  # server, deployment or job
    user: str
    members: list[tuple[str, int]]  # (owner, milli), as the ledger takes them
    value: int  # the requester's class value
    what: str  # for messages, without names: "an interactive server"
    victims: list[str]  # job ids
    deadline: float  # epoch seconds: the victims' grace ends
    pool: str = ""  # the pool whose GPUs it is placed on ("" = any: before pools)
    servers: list[str] = dataclasses.field(default_factory=list)  # idle servers hibernating
    #: Elastic jobs shrinking for it: job id -> the nodes it goes on with.
    shrinks: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.members[0][0])

    def message(self) -> str:
        left = max(0, round(self.deadline - time.time()))
        parts = []
        if self.servers:
            n = len(self.servers)
            parts.append(
                f"{n} idle server{'s' if n != 1 else ''} {'are' if n != 1 else 'is'} hibernating"
            )
        if self.shrinks:
            n = len(self.shrinks)
            parts.append(
                f"{n} elastic job{'s' if n != 1 else ''} {'are' if n != 1 else 'is'} shrinking"
            )
        if self.victims:
            n = len(self.victims)
            parts.append(
                f"{n} batch job{'s' if n != 1 else ''} "
                f"{'are' if n != 1 else 'is'} saving a checkpoint"
            )
        return f"freeing a slice: {' and '.join(parts)} to make room (up to {left} s more)"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Claim:
        d = dict(data)
        d["members"] = [tuple(m) for m in d["members"]]
        return cls(**d)


def requests_of(members: list[tuple[str, int]]) -> list[Request]:
    out = []
    for _, milli in members:
        if milli:
            shape = shape_of(milli)
            out.append(Request(gpu_milli=shape.milli_per_gpu, num_gpu=shape.num_gpus))
    return out


def eligible(
    victim: Mapping,
    victim_value: int,
    user: str,
    value: int,
    reclaiming: bool,
    borrowing: Callable[[str], bool],
) -> bool:
    """May a request of ``user`` at class ``value`` take ``victim`` (a job row)?"""
    if not victim["preemptible"] or victim.get("preempting") or victim.get("resizing"):
        return False
    if victim_value < value and (victim["user"] == user or borrowing(victim["user"])):
        return True
    return (
        reclaiming
        and victim_value <= value
        and victim["user"] != user
        and borrowing(victim["user"])
    )


class Preemption:
    """The service's part that frees slices for others: claims, their victims, and
    placing a claim once its victims have stopped.

    Built by the job manager from what it needs, by name: its victims are the running jobs
    of ``book``, which it stops through ``stops`` (checkpoint and requeue) or
    shrinks through ``resizes`` (elastic jobs), and idle servers, which
    ``hibernations`` puts to sleep first. The job loop calls :meth:`settle` between
    its passes; what a placed claim starts is the hook its kind registered in
    :attr:`on_placed` when it was built (jobs, endpoints).
    """

    def __init__(
        self,
        *,
        ledger,
        priorities,
        grace_seconds: float,
        group_settings: Callable[[], Awaitable[dict]],
        groups_of: Callable[[str], Awaitable[dict]],
        pools: Mapping[str, str],
        book: JobBook,
        stops: JobStops,
        resizes: Resizes,
        hibernations=None,
    ):
        self.ledger = ledger
        self.priorities = priorities
        self.grace_seconds = grace_seconds
        self.group_settings = group_settings
        self.groups_of = groups_of
        #: The pool a slice of each owner kind (ledger.OWNER_KINDS) is made room in.
        self.pools = dict(pools)
        self.book = book
        self.stops = stops
        self.resizes = resizes
        #: Idle servers come first: it lists them and hibernates one (its kernels'
        #: variables saved, nothing lost) before any batch job is stopped. None: none.
        self.hibernations = hibernations
        #: The claims waiting for their victims (the book's: moves add their own).
        self.claims: dict[tuple[str, str], Claim] = book.claims
        #: Called with (claim, ledger rows) when a claim of that kind is placed;
        #: each kind's part registers its hook once, when it is built.
        self.on_placed: dict[str, Callable] = {}

    # -- restarting ----------------------------------------------------------------
    def restore(self) -> None:
        """Claims of victims still stopping when the service stopped."""
        for job in self.book.queue.list(states=("running",)):
            if job.get("preempting"):
                claim = Claim.from_json(job["preempting"]["claim"])
                self.claims.setdefault(claim.key, claim)

    def pending(self, kind: str, owner: str) -> Claim | None:
        return self.claims.get((kind, owner))

    # -- choosing ------------------------------------------------------------------
    async def make_room_for(self, user: str, kind: str, members: list[tuple[str, int]]):
        """Preempt for a server's or an endpoint's slices that found no room in the
        pool they go to: the claim, or None when nothing the kind's class may preempt
        would make room."""
        klass = self.priorities.of_kind(kind)
        what = {"server": "server", "deployment": "endpoint"}.get(kind, kind)
        async with self.book.lock:
            return await self.make_room(
                kind,
                user,
                members,
                klass.value,
                f"{article(klass.name)} {what}",
                self.pools[kind],
            )

    async def make_room(
        self,
        kind: str,
        user: str,
        members: list[tuple[str, int]],
        value: int,
        what: str,
        pool: str = "",
    ) -> Claim | None:
        """Preempt victims in ``pool`` for a request that found no room there; None if
        none would do.

        Call with the job manager's lock held.
        """
        key = (kind, members[0][0])
        if key in self.claims:
            return self.claims[key]
        held = await self.ledger.aio.run(self.ledger.list, owner_kind=kind, owner=members[0][0])
        if held:
            return None  # its claim was placed while this waited for the lock
        settings = await self.group_settings()
        idle = await self.idle_servers(user, value)
        plan = await self.ledger.aio.run(
            self._plan, user, members, value, groups_by_user(settings), pool, idle
        )
        if plan is None:
            return None
        chosen = [v.key for v in plan.victims]
        stopped = [k for k in chosen if k not in idle and not is_surplus(k)]
        claim = Claim(
            kind,
            user,
            list(members),
            value,
            what,
            stopped,
            time.time() + self.grace_seconds,
            pool,
            [k for k in chosen if k in idle],
            # A job stopped whole needs no shrinking too.
            {j: n for j, n in shrink_targets(chosen).items() if j not in stopped},
        )
        self.claims[key] = claim
        for owner in claim.servers:
            await self.hibernations.hibernate_for_others(idle[owner], f"{what} of {user}")
        for job_id, nodes in list(claim.shrinks.items()):
            if not await self.resizes.shrink(job_id, nodes, f"{what} needed a GPU", key):
                del claim.shrinks[job_id]  # it changed meanwhile; the claim waits less
        for victim in claim.victims:
            await self.stops.preempt(victim, claim)
        log.info(
            "Preempting %s for %s of %s (%.0f GPU-seconds at risk, %d milli freed)",
            ", ".join(claim.servers + list(claim.shrinks) + claim.victims),
            what,
            user,
            plan.at_risk,
            plan.freed_milli,
        )
        return claim

    async def idle_servers(self, user: str, value: int) -> dict:
        """Other users' idle servers a request of class ``value`` may hibernate (by
        their ledger owner): for a class at least the servers' own, since
        hibernating loses no work; idle for ``hibernate_for_others_seconds``."""
        h = self.hibernations
        if h is None or h.for_others_seconds <= 0:
            return {}
        if value < self.priorities.of_kind("server").value:
            return {}
        found = await h.idle_servers(h.for_others_seconds, timeout=IDLE_ASK_S)
        return {s.owner: s for s in found if s.user != user}

    def _plan(
        self,
        user: str,
        members: list[tuple[str, int]],
        value: int,
        groups_by_user: Mapping[str, dict[str, set[str]]],
        pool: str = "",
        idle: Mapping | None = None,
    ) -> Plan | None:
        # Victims only in the pool: slices freed elsewhere would not help.
        ledger = self.ledger.pool(pool or None)
        quotas: Quotas = ledger.quotas
        requests = requests_of(members)
        if not requests:
            return None
        usage = ledger.usage()
        total = sum(m for _, m in members)
        reclaiming = quotas.within_guarantee(user, total, usage, groups_by_user.get(user, {}))

        def borrowing(u: str) -> bool:
            return quotas.borrowing(u, usage, groups_by_user.get(u, {}))

        cluster, slots = ledger.cluster(ledger.allocated_by_gpu())
        if placeable(cluster, requests, ledger.policy):
            return None  # room came while this waited (a victim gone): stop no one
        where = {g.uuid: (i, j) for i, node in enumerate(slots) for j, g in enumerate(node)}
        by_job: dict[str, list[dict]] = defaultdict(list)
        for a in ledger.list(owner_kind="job"):
            by_job[a["owner"].split("/", 1)[0]].append(a)
        priorities = self.priorities
        holders, surplus = [], []
        now = time.time()
        for job in self.book.queue.list(states=("running",)):
            backend = self.book.backend_of(job)
            rows = by_job.get(job["id"])
            if backend is None or not backend.can_preempt or not rows:
                continue
            if any(a["gpu_uuid"] not in where for a in rows):
                continue  # on a GPU the inventory no longer lists: freeing it helps no one
            victim_value = priorities.value(job["priority_class"], "job")
            whole = rows
            if victim_value <= value and self.resizes.resizable(job):
                # Its part above MIN is borrowed: the same class or higher takes it back.
                surplus += surplus_holders(
                    job["id"],
                    job["user"],
                    victim_value,
                    self._node_slices(job, rows, where),
                    job["min_nodes"],
                    RESIZE_PAUSE_S,
                    _epoch(job["started"]),
                )
                # Stopping it frees the rest: its MIN nodes (the holders above have
                # the others; one slot in two holders would count as freed twice).
                keep = job["min_nodes"] * job["nproc_per_node"]
                whole = [a for a in rows if int(a["owner"].rsplit("/", 1)[1]) < keep]
            if not eligible(job, victim_value, user, value, reclaiming, borrowing):
                continue
            holders.append(
                Holder(
                    key=job["id"],
                    user=job["user"],
                    priority=victim_value,
                    slices=tuple((*where[a["gpu_uuid"]], a["milli"]) for a in whole),
                    at_risk=self.at_risk(job, rows, now),
                    started=_epoch(job["started"]),
                )
            )
        # Shrinking elastic jobs first, then idle servers: neither loses work (a
        # shrunk job only pauses; a hibernated server's user must wake it), so
        # batch jobs are stopped only when those alone cannot make room.
        if surplus:
            plan = choose_victims(cluster, requests, surplus, ledger.policy)
            if plan is not None:
                return plan
        servers = []
        for owner, server in (idle or {}).items():
            rows = ledger.list(owner_kind="server", owner=owner)
            if not rows or any(a["gpu_uuid"] not in where for a in rows):
                continue
            slices = tuple((*where[a["gpu_uuid"]], a["milli"]) for a in rows)
            servers.append(Holder(owner, server.user, -1, slices, at_risk=0.0, started=now))
        if servers:
            plan = choose_victims(cluster, requests, surplus + servers, ledger.policy)
            if plan is not None:
                return plan
        return choose_victims(cluster, requests, surplus + servers + holders, ledger.policy)

    @staticmethod
    def _node_slices(job: Mapping, rows: list[dict], where: Mapping) -> list[tuple]:
        """An elastic job's slices per node, ``(node index, GPU slot, milli)``."""
        per_node: dict[int, list] = defaultdict(list)
        for a in rows:
            rank = int(a["owner"].rsplit("/", 1)[1])
            per_node[rank // job["nproc_per_node"]].append((*where[a["gpu_uuid"]], a["milli"]))
        return [tuple(per_node.get(n, ())) for n in range(job["nodes"])]

    def at_risk(self, job: Mapping, rows: list[dict], now: float) -> float:
        """GPU-seconds of the job's work since its last checkpoint (or its start)."""
        since = _epoch(job["started"])
        latest = self.book.jobdir(job).checkpoint()
        if latest and isinstance(latest.get("time"), (int, float)):
            since = max(since, float(latest["time"]))
        return max(0.0, now - since) * sum(a["milli"] for a in rows) / MILLI_PER_GPU

    # -- placing -------------------------------------------------------------------
    async def settle(self) -> None:
        """Place every claim whose victims have all stopped (in the job loop)."""
        running = {j["id"]: j for j in self.book.queue.list(states=("running",))}
        for key, claim in list(self.claims.items()):
            waiting = [v for v in claim.victims if v in running and running[v].get("preempting")]
            waiting += [j for j in claim.shrinks if j in running and running[j].get("resizing")]
            if self.hibernations is not None:
                waiting += [s for s in claim.servers if self.hibernations.busy(s)]
            if waiting:
                if time.time() > claim.deadline + CLAIM_SLACK_S:
                    log.warning("Giving up claim %s: victims %s did not stop", key, waiting)
                    del self.claims[key]
                continue
            del self.claims[key]
            await self._place(claim)

    async def _place(self, claim: Claim) -> None:
        try:
            rows = await self.ledger.pool(claim.pool or None).aio.allocate_gang(
                claim.user, claim.kind, claim.members, await self.groups_of(claim.user)
            )
        except (NoCapacity, QuotaExceeded, OwnerConflict) as e:
            # The room went elsewhere or the request changed: the requester asks again.
            log.warning("Could not place the claim of %s %s: %s", claim.kind, claim.key[1], e)
            return
        hook = self.on_placed.get(claim.kind)
        if hook is not None:
            await hook(claim, rows)


def article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _epoch(iso: str | None) -> float:
    return dt.datetime.fromisoformat(iso).timestamp() if iso else time.time()
