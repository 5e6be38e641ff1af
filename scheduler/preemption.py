"""Choosing whom to preempt so that a request of a higher class can be placed.

Victims are *holders*: preemptible work that holds slices, released together
(a job's ranks are one holder). Among the holders the caller allows (lower
class, or borrowers when the requester reclaims its guarantee) we look for the
set that

1. loses the least work: the sum of each victim's GPU-seconds since its last
   checkpoint (:attr:`Holder.at_risk`); work that checkpoints on SIGTERM loses
   little, but a victim that cannot still loses this much;
2. frees no more than needed: every victim is necessary (a last pass drops any
   the request fits without);
3. leaves the least fragmentation: among equal losses, the plan that frees the
   fewest milli-GPU, so less of the freed room is left over in pieces.

Single-node requests (a server, a replica, one trace task) look at the few
nodes where the cheapest room could be made and pick the best of those plans;
a gang spread over nodes falls back to one greedy plan over all holders. The
ledger (live allocations) and ``benchmarks/priority_replay.py`` (1,213 nodes)
call the same :func:`choose_victims`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .policy import Cluster, PlacementPolicy, Request


@dataclass(frozen=True)
class Holder:
    """Preemptible work and the slices it would give back."""

    key: str  # the job id
    user: str
    priority: int  # its class value
    slices: tuple[tuple[int, int, int], ...]  # (node index, GPU slot, milli)
    at_risk: float  # GPU-seconds lost if it stopped now (since its last checkpoint)
    started: float = 0.0  # when it started running (epoch seconds)

    @property
    def milli(self) -> int:
        return sum(m for *_, m in self.slices)

    @property
    def nodes(self) -> set[int]:
        return {n for n, _, _ in self.slices}


@dataclass(frozen=True)
class Plan:
    victims: tuple[Holder, ...]

    @property
    def at_risk(self) -> float:
        return sum(v.at_risk for v in self.victims)

    @property
    def freed_milli(self) -> int:
        return sum(v.milli for v in self.victims)

    def cost(self) -> tuple:
        return (round(self.at_risk, 6), self.freed_milli, len(self.victims))


def placeable(cluster: Cluster, requests: Sequence[Request], policy: PlacementPolicy) -> bool:
    """Would every request fit, one after the other, in ``cluster`` as it is?"""
    trial = cluster.copy() if len(requests) > 1 else cluster
    for request in requests:
        placement = policy.place(trial, request)
        if placement is None:
            return False
        if len(requests) > 1:
            trial.apply(placement, request)
    return True


def _freed(cluster: Cluster, victims: Sequence[Holder]) -> Cluster:
    out = cluster.copy()
    for v in victims:
        for node, slot, milli in v.slices:
            out.gpu_free[node, slot] += milli
    return out


def _greedy(
    cluster: Cluster,
    requests: Sequence[Request],
    holders: Sequence[Holder],
    policy: PlacementPolicy,
) -> Plan | None:
    """Add holders cheapest first until the requests fit; then drop the unneeded."""
    order = sorted(holders, key=lambda h: (h.at_risk, -h.started, h.key))
    trial = cluster.copy()
    chosen: list[Holder] = []
    for h in order:
        for node, slot, milli in h.slices:
            trial.gpu_free[node, slot] += milli
        chosen.append(h)
        if placeable(trial, requests, policy):
            break
    else:
        return None
    # Most costly first: dropping it saves the most, if the rest still make room.
    for h in sorted(chosen, key=lambda h: (-h.at_risk, -h.milli)):
        rest = [v for v in chosen if v is not h]
        if rest and placeable(_freed(cluster, rest), requests, policy):
            chosen = rest
    return Plan(tuple(chosen))


def _cheapest_nodes(
    cluster: Cluster, request: Request, by_node: dict[int, list[Holder]], count: int
) -> list[int]:
    """The ``count`` nodes where making room for ``request`` looks cheapest.

    An estimate per GPU slot: its free milli plus its holders' milli, cheapest
    holder first, until the request fits (or, for whole GPUs, the slot is empty).
    """
    mask = cluster.model_mask(request) & cluster.gpu_exists
    scores = []
    for node, holders in by_node.items():
        per_slot: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for h in holders:
            for n, slot, milli in h.slices:
                if n == node:
                    per_slot[slot].append((h.at_risk, milli))
        slot_costs = []
        for slot in np.flatnonzero(mask[node]):
            free = int(cluster.gpu_free[node, slot])
            need = request.gpu_milli if request.num_gpu <= 1 else 1000
            cost = 0.0
            for risk, milli in sorted(per_slot.get(int(slot), [])):
                if free >= need:
                    break
                free += milli
                cost += risk
            if free >= need:
                slot_costs.append(cost)
        wanted = max(request.num_gpu, 1)
        if len(slot_costs) >= wanted:
            scores.append((sum(sorted(slot_costs)[:wanted]), node))
    return [node for _, node in sorted(scores)[:count]]


def choose_victims(
    cluster: Cluster,
    requests: Sequence[Request],
    holders: Sequence[Holder],
    policy: PlacementPolicy,
    nodes_tried: int = 4,
) -> Plan | None:
    """The victims to preempt so ``requests`` fit, or None when no set would do.

    ``cluster`` is the free view now (holders' slices counted as held);
    ``holders`` are only those the requester may preempt.
    """
    if not holders or not requests:
        return None
    if not placeable(_freed(cluster, holders), requests, policy):
        return None  # even taking everything would not make room
    plans: list[Plan] = []
    if len(requests) == 1:
        by_node: dict[int, list[Holder]] = defaultdict(list)
        for h in holders:
            for node in h.nodes:
                by_node[node].append(h)
        for node in _cheapest_nodes(cluster, requests[0], by_node, nodes_tried):
            plan = _greedy(cluster, requests, by_node[node], policy)
            if plan is not None:
                plans.append(plan)
    if not plans:
        plan = _greedy(cluster, requests, holders, policy)
        if plan is not None:
            plans.append(plan)
    return min(plans, key=Plan.cost) if plans else None
