"""Where a queued Job stands in Kueue: waiting for quota, admitted, or preempted.

A Job in a Kueue queue stays suspended until Kueue admits its Workload (the object
Kueue makes for it, labelled ``kueue.x-k8s.io/job-uid``). While it waits, the Job's
own status says nothing (no pods, no conditions): why it waits is on the Workload.
A preempted Job is suspended again (its pods deleted) and its Workload carries
``Evicted`` with reason ``Preempted`` until Kueue admits it again. These pure
functions read that for :meth:`KubernetesBackend.poll`, so a user sees "waiting in
queue gpulab: insufficient unused quota for cpu ..." rather than a silent "running".
"""

from __future__ import annotations

WORKLOAD_GROUP = "kueue.x-k8s.io"
WORKLOAD_VERSION = "v1beta1"
WORKLOAD_PLURAL = "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def _conditions(obj: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def queue_state(queue: str, suspended: bool, workloads: list[dict]) -> dict:
    """``{"queue", "admitted", "preempted", "reason", "message"}`` of a Job in Kueue
    queue ``queue`` (``suspended``: the Job's ``spec.suspend``; ``workloads``: its
    Workloads, normally one)."""
    state = {"queue": queue, "admitted": not suspended, "preempted": False}
    if not workloads:
        if suspended:
            state["message"] = f"waiting in Kueue queue {queue}: Kueue has no Workload for it yet"
        return state
    conds = _conditions(workloads[0])
    admitted = conds.get("Admitted", {}).get("status") == "True"
    state["admitted"] = admitted and not suspended
    evicted = conds.get("Evicted", {})
    if evicted.get("status") == "True" and evicted.get("reason") == "Preempted":
        state["preempted"] = True
        state["reason"] = "Preempted"
        state["message"] = (
            f"preempted by Kueue in queue {queue}: {evicted.get('message', '')}; "
            "it waits to be admitted again"
        )
        return state
    if state["admitted"]:
        return state
    reserved = conds.get("QuotaReserved", {})
    why = reserved.get("message") or "not admitted yet"
    state["reason"] = reserved.get("reason") or "Pending"
    state["message"] = f"waiting in Kueue queue {queue}: {why}"
    return state
