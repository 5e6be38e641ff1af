"""Helpers for job tests against a real hub: submit, wait, read a job's files."""

from __future__ import annotations

import time

TERMINAL = ("succeeded", "failed", "cancelled")


def submit(hub, token: str, code: str, **fields):
    return hub.gpulab("POST", "/jobs", token=token, json={"code": code, **fields})


def wait_job(hub, token: str, job_id: str, states=TERMINAL, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
        if job["state"] in states:
            return job
        time.sleep(0.5)
    logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=token).text
    raise TimeoutError(f"job {job_id} not {states} after {timeout}s: {job}\n{logs[-3000:]}\n"
                       f"{hub.log_tail()}")


def wait_metrics(hub, token: str, job_id: str, min_records: int, timeout: float = 300) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = hub.gpulab("GET", f"/jobs/{job_id}/metrics", token=token).json()
        if len(m["records"]) >= min_records:
            return m["records"]
        if m["state"] in TERMINAL:
            raise AssertionError(f"job ended with {len(m['records'])} records")
        time.sleep(0.5)
    raise TimeoutError(f"fewer than {min_records} metrics records after {timeout}s")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
