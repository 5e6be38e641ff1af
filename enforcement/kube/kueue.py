"""Kueue and PriorityClasses: which pods wait in a queue, and which may be preempted.

Jobs and deployments carry ``kueue.x-k8s.io/queue-name`` (the namespace's
LocalQueue) and ``kueue.x-k8s.io/priority-class`` (a WorkloadPriorityClass),
so Kueue admits them by quota and may preempt the lower ones. Notebook
servers never enter a queue: a person is waiting on them. They carry the
``gpulab-notebook`` PriorityClass instead, above every job's, so no job's
preemption can take their node away.

gpulab's priority classes (:mod:`gpulab.scheduler.priority`) map one to one
onto cluster objects named ``gpulab-<class>``: a PriorityClass (the pods'
``priorityClassName``, which the kube-scheduler preempts by) and, with Kueue,
a WorkloadPriorityClass of the same name and value (which Kueue preempts by).
The Helm chart creates both; :func:`class_patch` says what a pod of a class
carries. The ``interactive`` class is the notebook PriorityClass above.
"""

from __future__ import annotations

from gpulab.scheduler.priority import KIND_CLASS

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
NOTEBOOK_PRIORITY_CLASS = "gpulab-notebook"
OWNER_KINDS = ("server", "job", "deployment")
#: The cluster objects of class ``c`` are named ``CLASS_PREFIX + c`` (``gpulab-batch``).
CLASS_PREFIX = "gpulab-"
#: KAI-Scheduler's own switch (pods): ``preemptible`` or ``non-preemptible``. Without
#: it KAI takes a PriorityClass value >= 100 as non-preemptible.
KAI_PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"


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


def class_object_name(work_class: str, prefix: str = CLASS_PREFIX) -> str:
    """The PriorityClass (and WorkloadPriorityClass) of gpulab class ``work_class``:
    ``gpulab-batch-high``; empty when ``prefix`` is (no per-class objects)."""
    return f"{prefix}{work_class}" if prefix and work_class else ""


def class_patch(
    owner_kind: str,
    work_class: str | None = None,
    *,
    queue: str | None = None,
    priority: str | None = None,
    priority_class: str | None = None,
    prefix: str = CLASS_PREFIX,
    preemptible: bool | None = None,
    kai: bool = False,
    notebook_priority_class: str | None = NOTEBOOK_PRIORITY_CLASS,
) -> dict:
    """What a job's or a deployment's objects carry for gpulab class ``work_class``
    (default: the kind's, ``batch`` or ``serving``).

    ``{"labels", "pod_labels", "priority_class_name"}``: ``labels`` go on the
    owner (the Job, JobSet or Deployment: Kueue reads them there), ``pod_labels``
    on its pods only, ``priority_class_name`` is the pods' PriorityClass.

    Fixed names win over the class's own, as before classes existed:
    ``priority_class`` (a PriorityClass for every pod of this kind) over
    ``gpulab-<class>``, and ``priority`` (a WorkloadPriorityClass for every
    workload) over ``gpulab-<class>``. The WorkloadPriorityClass is named only
    with a ``queue`` (Kueue ignores work outside a queue). ``prefix=""`` turns
    the per-class names off (the cluster has no ``gpulab-<class>`` objects).

    With ``kai``, ``preemptible`` (True/False) becomes KAI-Scheduler's
    ``kai.scheduler/preemptibility`` pod label. Kueue has no such switch: it
    preempts by priority alone.
    """
    if owner_kind == "server":
        base = queue_patch("server", notebook_priority_class=notebook_priority_class)
        return {**base, "pod_labels": {}}
    work_class = work_class or KIND_CLASS.get(owner_kind, "")
    own = class_object_name(work_class, prefix)
    base = queue_patch(owner_kind, queue, priority or own or None)
    pod_labels = {}
    if kai and preemptible is not None:
        pod_labels[KAI_PREEMPTIBILITY_LABEL] = "preemptible" if preemptible else "non-preemptible"
    return {
        "labels": base["labels"],
        "pod_labels": pod_labels,
        "priority_class_name": priority_class or own or None,
    }
