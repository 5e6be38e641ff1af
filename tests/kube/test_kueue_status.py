"""What gpulab reads from Kueue's Workload of a queued Job (the conditions as Kueue
v0.14.0 wrote them on the live cluster, test_live_cluster_kueue.py), and that a
queued Job is made suspended (no webhook needed to keep it in the queue)."""

from __future__ import annotations

from gpulab.backend.kubernetes.job import make_job
from gpulab.backend.kubernetes.jobset import make_jobset
from gpulab.backend.kubernetes.kueue_status import queue_state
from gpulab.backend.kubernetes.pods import JobOptions
from gpulab.backend.spec import JobSpec

PENDING = {
    "type": "QuotaReserved",
    "status": "False",
    "reason": "Pending",
    "message": "couldn't assign flavors to pod set main: insufficient unused quota for cpu "
    "in flavor gpulab-test-flavor, 50m more needed",
}
ADMITTED = {"type": "Admitted", "status": "True", "reason": "Admitted"}
PREEMPTED = {
    "type": "Evicted",
    "status": "True",
    "reason": "Preempted",
    "message": "Preempted to accommodate a workload (UID: 1, JobUID: 2) due to "
    "prioritization in the ClusterQueue",
}


def workload(*conditions):
    return {"status": {"conditions": list(conditions)}}


def test_a_waiting_job_says_what_kueue_lacks():
    state = queue_state("gpulab", True, [workload(PENDING)])
    assert state["admitted"] is False and state["reason"] == "Pending"
    assert state["message"] == f"waiting in Kueue queue gpulab: {PENDING['message']}"


def test_an_admitted_running_job_has_no_message():
    state = queue_state("gpulab", False, [workload(ADMITTED)])
    assert state["admitted"] is True and "message" not in state


def test_a_preempted_job_says_by_whom_until_admitted_again():
    state = queue_state("gpulab", True, [workload(PREEMPTED, PENDING)])
    assert state["preempted"] is True and not state["admitted"]
    assert state["message"].startswith("preempted by Kueue in queue gpulab: Preempted to")
    readmitted = dict(PREEMPTED, status="False")
    assert queue_state("gpulab", False, [workload(readmitted, ADMITTED)])["preempted"] is False


def test_a_job_kueue_has_not_seen_yet_waits():
    state = queue_state("gpulab", True, [])
    assert state["message"] == "waiting in Kueue queue gpulab: Kueue has no Workload for it yet"


def test_a_queued_job_is_made_suspended_and_an_unqueued_one_is_not():
    spec = JobSpec(
        code="pass", nodes=1, id="abcd1234", user="tester", backend="kubernetes", image="img"
    )
    queued = JobOptions(
        jobs_root="/jobs", jobs_pvc="gpulab-jobs", labels={"kueue.x-k8s.io/queue-name": "gpulab"}
    )
    assert make_job(spec, queued)["spec"]["suspend"] is True
    assert (
        "suspend"
        not in make_job(spec, JobOptions(jobs_root="/jobs", jobs_pvc="gpulab-jobs"))["spec"]
    )
    # A JobSet in a queue too (Kueue's JobSet integration starts it the same way).
    assert make_jobset(spec, queued)["spec"]["suspend"] is True
    assert (
        "suspend"
        not in make_jobset(spec, JobOptions(jobs_root="/jobs", jobs_pvc="gpulab-jobs"))["spec"]
    )
