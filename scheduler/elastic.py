"""Elastic jobs as the preemption planner sees them: their part above MIN is borrowed.

An elastic job (``--nodes MIN:MAX``) holds MIN nodes it needs and, while room
was free, up to MAX - MIN more. Making room, the scheduler takes that surplus
first: shrinking a job by a node loses no work (the ranks save a checkpoint at
the step boundary and go on at the smaller size), it only pauses the job for its
restart, where stopping a job sends it back to the queue.

:func:`surplus_holders` turns a running elastic job into one
:class:`~gpulab.scheduler.preemption.Holder` per node above MIN, keyed
``<job id>#<node>``, for :func:`~gpulab.scheduler.preemption.choose_victims`;
:func:`shrink_targets` reads a plan back as the size each job shrinks to. The
service (live jobs) and ``benchmarks/priority_replay.py`` (the trace) call both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .preemption import Holder

#: Between a job's id and a node index in a surplus holder's key.
SEP = "#"


def surplus_holders(
    key: str,
    user: str,
    priority: int,
    node_slices: Sequence[tuple[tuple[int, int, int], ...]],
    min_nodes: int,
    pause_s: float,
    started: float = 0.0,
) -> list[Holder]:
    """One holder per node above ``min_nodes`` (``node_slices[k]``: node k's slices,
    ``(node index, GPU slot, milli)``).

    Its ``at_risk`` is what taking it costs the job: the GPUs it gives up (this
    node and those above it, which go with it) for ``pause_s``, about the time it
    takes to restart smaller. Nothing is redone: the ranks checkpoint at the step
    boundary. The top node costs least, so it goes first, and any shrink costs
    less than stopping a job that loses work since its last checkpoint.
    """
    held = [sum(m for *_, m in slices) / 1000 for slices in node_slices]
    out = []
    for node in range(min_nodes, len(node_slices)):
        out.append(
            Holder(
                key=f"{key}{SEP}{node}",
                user=user,
                priority=priority,
                slices=tuple(node_slices[node]),
                at_risk=pause_s * sum(held[node:]),
                started=started,
            )
        )
    return out


def shrink_targets(victim_keys: Iterable[str]) -> dict[str, int]:
    """The size each elastic job shrinks to, from a plan's victims' keys (other keys
    are ignored): below the lowest of its nodes chosen, so its nodes stay numbered
    0..n-1 (a chosen node frees the nodes above it too)."""
    out: dict[str, int] = {}
    for key in victim_keys:
        job, sep, node = key.rpartition(SEP)
        if sep and node.isdigit():
            out[job] = min(out.get(job, int(node)), int(node))
    return out


def is_surplus(key: str) -> bool:
    return SEP in key
