"""Helpers for job tests against a real hub: submit, wait, read a job's files."""

from __future__ import annotations

from support.wait import wait_until

from gpulab.client.states import JOB_TERMINAL as TERMINAL


def submit(hub, token: str, code: str, **fields):
    return hub.gpulab("POST", "/jobs", token=token, json={"code": code, **fields})


def wait_job(hub, token: str, job_id: str, states=TERMINAL, timeout: float = 300) -> dict:
    def reached():
        job = hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
        return job if job["state"] in states else None

    def detail():
        job = hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
        logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=token).text
        return f"{job}\n{logs[-3000:]}\n{hub.log_tail()}"

    return wait_until(reached, f"job {job_id} {tuple(states)}", timeout, detail=detail)


def wait_metrics(hub, token: str, job_id: str, min_records: int, timeout: float = 300) -> list:
    def enough():
        m = hub.gpulab("GET", f"/jobs/{job_id}/metrics", token=token).json()
        if len(m["records"]) >= min_records:
            return m["records"]
        if m["state"] in TERMINAL:
            raise AssertionError(f"job ended with {len(m['records'])} records")
        return None

    return wait_until(enough, f"{min_records} metrics records of job {job_id}", timeout)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
