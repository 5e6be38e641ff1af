"""The allocation ledger: who holds which share of which GPU.

Every placement is one database transaction: lock, read what is held, ask the
policy where the request goes, insert, commit. A crash before the commit leaves
nothing; after it, the allocation is on disk. Requests are idempotent per
owner (``owner_kind`` + ``owner``): asking again for an owner that already
holds a slice returns what it holds, so a client that retries after losing the
answer (the service died mid-request) never gets a second slice.

The queries are :class:`gpulab.db.ledger.LedgerStore`'s; this module decides (where
a slice goes, whether the quota allows it) inside the store's transaction.

The calls block (on the database's write lock, at worst for SQLite's 30 s
timeout); code on an event loop awaits them through :attr:`Ledger.aio`.

A *cordoned* GPU (:meth:`Ledger.cordon`: an XID, ECC errors, lost, or an admin's
choice; table ``gpulab_gpu_cordons``) takes no new slice: every placement, and what
``availability``/``free_sizes`` count, sees it as full. What it already holds stays
until its owner moves or stops. Cordoning a GPU with MIG on cordons its MIG devices.
"""

from __future__ import annotations

import copy
import functools
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Engine

from gpulab.db.engine import utcnow
from gpulab.db.ledger import LedgerStore

from .async_ledger import AsyncLedger
from .inventory import Gpu
from .policy import Cluster, PlacementPolicy, Request
from .quota import Quotas
from .slices import MILLI_PER_GPU, label, plural, shape_of

OWNER_KINDS = ("server", "job", "deployment")

# Resources the ledger does not track are set to this on every node.
_UNTRACKED = np.iinfo(np.int64).max // 4


class NoCapacity(Exception):
    """No GPU has room for the request right now."""


class OwnerConflict(Exception):
    """The owner already holds a slice of a different size."""


class UnknownGpu(LookupError):
    """No GPU (or MIG parent) of the inventory has that UUID."""


@dataclass(frozen=True)
class SizeAvailability:
    milli: int
    label: str
    count: int  # how many of this size could be placed right now
    reason: str | None  # why none can, when count == 0

    def to_dict(self) -> dict:
        return {
            "milli": self.milli,
            "label": self.label,
            "count": self.count,
            "available": self.count > 0,
            "reason": self.reason,
        }


def _fits_per_node(cluster: Cluster, milli: int) -> np.ndarray:
    """(N,) how many slices of ``milli`` each node's free GPU could hold now."""
    shape = shape_of(milli)
    if shape.num_gpus == 1:
        free = np.where(cluster.gpu_exists, cluster.gpu_free, 0)
        return (free // shape.milli_per_gpu).sum(axis=1)
    whole = (cluster.gpu_free == MILLI_PER_GPU) & cluster.gpu_exists
    return whole.sum(axis=1) // shape.num_gpus


def none_fits(cluster: Cluster, milli: int) -> str:
    """Why no slice of ``milli`` fits now, with what would: the spawn form's reason."""
    if not cluster.gpu_exists.any():
        return "this node has no GPUs"
    shape = shape_of(milli)
    if shape.num_gpus == 1:
        best = int(np.where(cluster.gpu_exists, cluster.gpu_free, 0).max())
        if not best:
            return "every GPU is full"
        return f"no GPU has that much free; the most free on one is {label(best)}"
    most = int(((cluster.gpu_free == MILLI_PER_GPU) & cluster.gpu_exists).sum(axis=1).max())
    free_now = f"at most {most} is" if most else "none is"
    return (
        f"needs {plural(shape.num_gpus, 'whole GPU')} free on one node; "
        f"{free_now} free on any node now"
    )


class Ledger:
    def __init__(
        self,
        engine: Engine,
        gpus: Iterable[Gpu],
        policy: PlacementPolicy,
        quotas: Quotas | None = None,
    ):
        self.engine = engine
        self.rows = LedgerStore(engine)
        self.gpus = list(gpus)
        self.policy = policy
        self.quotas = quotas or Quotas()
        # In-process writers queue here before they queue on the database lock,
        # so threads of one service do not spin on SQLite's busy timeout.
        self._lock = threading.Lock()
        self._views: dict[str, Ledger] = {}

    @functools.cached_property
    def aio(self) -> AsyncLedger:
        """This ledger for the event loop: the same calls, awaited, on a few threads."""
        return AsyncLedger(self)

    def pool(self, name: str | None) -> Ledger:
        """The ledger as one pool of the site sees it (``None``: the whole site):
        placements, availability and free sizes count only the pool's GPUs, while
        quotas, cordons and what is held stay the site's (one quota over every pool).
        The view shares the database lock and threads."""
        if name is None:
            return self
        view = self._views.get(name)
        if view is None:
            view = copy.copy(self)
            view.gpus = [g for g in self.gpus if g.pool == name]
            view._views = {}
            view.__dict__["aio"] = self.aio.over(view)
            self._views[name] = view
        return view

    # -- reading ---------------------------------------------------------------
    def list(
        self, user: str | None = None, owner_kind: str | None = None, owner: str | None = None
    ) -> list[dict]:
        return self.rows.list(user, owner_kind, owner)

    def get(self, alloc_id: str) -> dict | None:
        return self.rows.get(alloc_id)

    def usage(self, conn=None) -> dict[str, int]:
        """Milli-GPU held per user."""
        return self.rows.held_by_user(conn)

    def allocated_by_gpu(self, conn=None) -> dict[str, int]:
        return self.rows.held_by_gpu(conn)

    def cordons(self, conn=None) -> dict[str, dict]:
        """Cordoned GPUs: UUID -> {"reason", "by", "since" (ISO 8601, UTC), "node"}."""
        return self.rows.cordons(conn)

    def cordon_of(self, gpu: Gpu, cordons: Mapping[str, dict]) -> dict | None:
        """The cordon that keeps ``gpu`` out of placement (its own or its MIG parent's)."""
        return cordons.get(gpu.uuid) or (cordons.get(gpu.mig_parent) if gpu.mig_parent else None)

    def _node_of(self, gpu_uuid: str) -> str:
        for gpu in self.gpus:
            if gpu_uuid in (gpu.uuid, gpu.mig_parent):
                return gpu.node
        raise UnknownGpu(
            f"no GPU {gpu_uuid} in the inventory; GET /api/v1/inventory lists the GPUs' UUIDs"
        )

    def cordon(self, gpu_uuid: str, reason: str, by: str) -> tuple[dict, bool]:
        """Take a GPU out of placement. Returns (its cordon, whether this call made it):
        a GPU already cordoned keeps its first reason. Raises :class:`UnknownGpu`."""
        node = self._node_of(gpu_uuid)
        with self._lock, self.rows.transaction() as conn:
            return self.rows.cordon(conn, gpu_uuid, node, reason, by)

    def uncordon(self, gpu_uuid: str) -> dict | None:
        """Return a GPU to placement; the cordon it had, or None if it had none.
        Raises :class:`UnknownGpu`."""
        self._node_of(gpu_uuid)
        with self._lock, self.rows.transaction() as conn:
            return self.rows.uncordon(conn, gpu_uuid)

    def cluster(
        self, held: Mapping[str, int], cordons: Mapping[str, dict] | None = None
    ) -> tuple[Cluster, list[list[Gpu]]]:
        """The free-resource view of the inventory, given milli held per GPU; a
        cordoned GPU (``cordons``, default: the ledger's now) has no room."""
        if cordons is None:
            cordons = self.cordons()
        by_node: dict[str, list[Gpu]] = defaultdict(list)
        for gpu in self.gpus:
            by_node[gpu.node].append(gpu)
        nodes = sorted(by_node)
        slots = [by_node[n] for n in nodes]
        cluster = Cluster.build(
            [
                (n, _UNTRACKED, _UNTRACKED, [g.model for g in s])
                for n, s in zip(nodes, slots, strict=False)
            ]
        )
        for i, node_gpus in enumerate(slots):
            for j, gpu in enumerate(node_gpus):
                if self.cordon_of(gpu, cordons) is None:
                    cluster.gpu_free[i, j] = MILLI_PER_GPU - held.get(gpu.uuid, 0)
                else:
                    cluster.gpu_free[i, j] = 0
        return cluster, slots

    def availability(
        self, user: str, sizes: Iterable[int], groups: Mapping[str, set[str]] | None = None
    ) -> list[SizeAvailability]:
        """For each size: how many could be placed now, or why none can."""
        groups = groups or {}
        held = self.allocated_by_gpu()
        usage = self.usage()
        cordons = self.cordons()
        cluster, _ = self.cluster(held, cordons)
        out_of_service = sum(1 for g in self.gpus if self.cordon_of(g, cordons) is not None)
        remaining = self.quotas.remaining(user, usage, groups)
        out = []
        for milli in sizes:
            if milli == 0:
                out.append(SizeAvailability(0, label(0), 1, None))
                continue
            fit = int(_fits_per_node(cluster, milli).sum())
            reason = None
            if fit == 0:
                reason = none_fits(cluster, milli)
                if out_of_service:
                    reason += (
                        f" ({out_of_service} of {plural(len(self.gpus), 'GPU')} cordoned: out of "
                        f"service until an admin uncordons them)"
                    )
            if remaining is not None:
                by_quota = remaining // milli
                fit = min(fit, by_quota)
                if by_quota == 0:
                    reason = f"over your quota ({label(remaining)} left)"
            out.append(SizeAvailability(milli, label(milli), fit, reason))
        return out

    def free_sizes(self, sizes: Iterable[int]) -> dict[str, list[dict]]:
        """Per node, how many of each size fit in the free GPU now (quotas aside)."""
        cluster, _ = self.cluster(self.allocated_by_gpu())
        out: dict[str, list[dict]] = {}
        counts = {m: _fits_per_node(cluster, m) for m in sizes if m}
        for i, node in enumerate(cluster.node_names):
            out[node] = [
                {"milli": m, "label": label(m), "count": int(c[i])} for m, c in counts.items()
            ]
        return out

    # -- writing ---------------------------------------------------------------
    def allocate(
        self,
        user: str,
        owner_kind: str,
        owner: str,
        milli: int,
        groups: Mapping[str, set[str]] | None = None,
    ) -> list[dict]:
        """Place ``milli`` for ``owner`` and record it; return its rows.

        Raises :class:`NoCapacity`, :class:`~.quota.QuotaExceeded` or
        :class:`OwnerConflict`; on any of them nothing is written.
        """
        return self.allocate_gang(user, owner_kind, [(owner, milli)], groups)

    def allocate_gang(
        self,
        user: str,
        owner_kind: str,
        members: list[tuple[str, int]],
        groups: Mapping[str, set[str]] | None = None,
        node_groups: list[int] | None = None,
    ) -> list[dict]:
        """Place several owners at once, all or none (the ranks of one job).

        Owners that already hold their slice keep it (idempotent retries).
        ``node_groups`` (one per member, e.g. each rank's node rank) keeps members of
        one group on one node and different groups on different nodes: a backend
        that runs each node rank on its own machine (Slurm) gets the nodes the
        ledger counted.
        """
        if owner_kind not in OWNER_KINDS:
            raise ValueError(f"owner_kind must be one of {OWNER_KINDS}, got {owner_kind!r}")
        with self._lock, self.rows.transaction() as conn:
            kept: list[dict] = []
            todo: list[tuple[str, int]] = []
            for owner, milli in members:
                existing = self.rows.owner_rows(conn, owner_kind, owner)
                if existing:
                    held = sum(r["milli"] for r in existing)
                    if held != shape_of(milli).total_milli or existing[0]["user"] != user:
                        raise OwnerConflict(
                            f"{owner_kind} {owner!r} already holds {held} milli-GPU; "
                            f"release it before asking for {milli}"
                        )
                    kept += existing
                elif milli:
                    todo.append((owner, milli))
            if not todo:
                return kept
            self.quotas.check(user, sum(m for _, m in todo), self.usage(conn), groups or {})
            cordons = self.cordons(conn)
            cluster, slots = self.cluster(self.allocated_by_gpu(conn), cordons)
            group_of = dict(zip((o for o, _ in members), node_groups or (), strict=False))
            group_node = {
                group_of[r["owner"]]: cluster.node_names.index(r["node"])
                for r in kept
                if r["owner"] in group_of and r["node"] in cluster.node_names
            }
            placed, missing = self._place(cluster, todo, group_of, group_node)
            if missing is not None:
                raise NoCapacity(
                    self._no_capacity_message(cluster, missing, len(todo), len(cordons))
                )
            now = utcnow()
            rows = []
            for owner, shape, placement in placed:
                for g in placement.gpus:
                    gpu = slots[placement.node][g]
                    rows.append(
                        {
                            "id": uuid.uuid4().hex[:16],
                            "user": user,
                            "owner_kind": owner_kind,
                            "owner": owner,
                            "node": gpu.node,
                            "gpu_uuid": gpu.uuid,
                            "gpu_index": gpu.index,
                            "milli": shape.milli_per_gpu,
                            "memory_mib": gpu.memory_mib * shape.milli_per_gpu // MILLI_PER_GPU,
                            "created": now,
                        }
                    )
            self.rows.insert(conn, rows)
        return kept + [{**r, "created": r["created"].isoformat()} for r in rows]

    def could_place_when_empty(
        self, members: list[tuple[str, int]], node_groups: list[int] | None = None
    ) -> bool:
        """Whether :meth:`allocate_gang` could place ``members`` on these GPUs with
        nothing held and nothing cordoned. A gang that could not would wait at the head
        of the queue for ever, and every job behind it with it."""
        cluster, _ = self.cluster({}, {})
        group_of = dict(zip((o for o, _ in members), node_groups or (), strict=False))
        _, missing = self._place(cluster, [(o, m) for o, m in members if m], group_of, {})
        return missing is None

    def _place(
        self,
        cluster: Cluster,
        todo: list[tuple[str, int]],
        group_of: Mapping[str, int],
        group_node: dict[int, int],
    ) -> tuple[list, int | None]:
        """Place each ``(owner, milli)`` in turn as the policy chooses, taking its room
        from ``cluster``: ``([(owner, shape, placement)], None)``, or the milli of the
        first that fits nowhere in place of None."""
        placed = []
        for owner, milli in todo:
            shape = shape_of(milli)
            request = Request(gpu_milli=shape.milli_per_gpu, num_gpu=shape.num_gpus)
            group = group_of.get(owner)
            view = cluster if group is None else _nodes_for(cluster, group, group_node)
            placement = self.policy.place(view, request)
            if placement is None:
                return placed, milli
            cluster.apply(placement, request)
            if group is not None:
                group_node[group] = placement.node
            placed.append((owner, shape, placement))
        return placed, None

    def _no_capacity_message(
        self, cluster: Cluster, milli: int, gang: int = 1, cordoned: int = 0
    ) -> str:
        if not cluster.gpu_exists.any():
            return "no GPUs are known to the scheduler; ask for gpu_milli=0 or add GPUs"
        best = int(cluster.gpu_free.max())
        whole = int(((cluster.gpu_free == MILLI_PER_GPU) & cluster.gpu_exists).sum())
        takes = "takes" if cordoned == 1 else "take"
        out = f" ({plural(cordoned, 'cordoned GPU')} {takes} no new work)" if cordoned else ""
        what = f"{gang} x {label(milli)}" if gang > 1 else label(milli)
        room = (
            f"the largest free share is {label(best)} and {plural(whole, 'GPU')} "
            f"{'is' if whole == 1 else 'are'} fully free"
            if best
            else "every GPU is full"
        )
        return (
            f"no GPU has room for {what} right now: {room}{out}; "
            f"pick a smaller slice or try again when others stop"
        )

    def release(self, owner_kind: str, owner: str) -> list[dict]:
        """Free everything ``owner`` holds; returns the released rows (maybe none)."""
        with self._lock, self.rows.transaction() as conn:
            return self.rows.release(conn, owner_kind, owner)

    def release_id(self, alloc_id: str) -> dict | None:
        """Free one allocation row (and the rest of its owner's rows)."""
        row = self.get(alloc_id)
        if row is None:
            return None
        self.release(row["owner_kind"], row["owner"])
        return row

    def reconcile(self, owner_kind: str, alive: set[str]) -> list[dict]:
        """Release every ``owner_kind`` allocation whose owner is not in ``alive``."""
        stale = {r["owner"] for r in self.list(owner_kind=owner_kind)} - alive
        released = []
        for owner in sorted(stale):
            released += self.release(owner_kind, owner)
        return released


def _nodes_for(cluster: Cluster, group: int, group_node: Mapping[int, int]) -> Cluster:
    """The cluster as a member of node group ``group`` may see it: only its group's
    node once the group has one, else only nodes no other group holds."""
    pinned = group_node.get(group)
    taken = {n for g, n in group_node.items() if g != group}
    view = cluster.copy()
    for n in range(len(view.node_names)):
        if (pinned is not None and n != pinned) or (pinned is None and n in taken):
            view.gpu_free[n, :] = 0
    return view
