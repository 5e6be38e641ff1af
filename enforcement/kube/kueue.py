"""Kueue: which pods wait in a queue, and which may be preempted.

Jobs and deployments carry ``kueue.x-k8s.io/queue-name`` (the namespace's
LocalQueue) and ``kueue.x-k8s.io/priority-class`` (a WorkloadPriorityClass),
so Kueue admits them by quota and may preempt the lower ones. Notebook
servers never enter a queue: a person is waiting on them. They carry the
``gpulab-notebook`` PriorityClass instead, above every job's, so no job's
preemption can take their node away.
"""

from __future__ import annotations

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
NOTEBOOK_PRIORITY_CLASS = "gpulab-notebook"
OWNER_KINDS = ("server", "job", "deployment")


def queue_patch(
    owner_kind: str,
    queue: str | None = None,
    priority: str | None = None,
    notebook_priority_class: str | None = NOTEBOOK_PRIORITY_CLASS,
) -> dict:
    """``{"labels", "priority_class_name"}`` for a pod (template) of ``owner_kind``."""
    if owner_kind not in OWNER_KINDS:
        raise ValueError(f"owner_kind must be one of {', '.join(OWNER_KINDS)}, got {owner_kind!r}")
    if owner_kind == "server":
        return {"labels": {}, "priority_class_name": notebook_priority_class or None}
    labels = {}
    if queue:
        labels[QUEUE_LABEL] = queue
        if priority:
            labels[PRIORITY_LABEL] = priority
    return {"labels": labels, "priority_class_name": None}
