"""A job's log of 200 MB, read by the real service in this process.

``?tail=5`` reads the file from its end (the service's peak memory grows by far
less than the log), off the event loop (another user's request meanwhile is
answered), and a read without ``tail`` is bounded too. The job is a real one
(a sleeping CPU rank); its log is made big by appending to it as its owner would.
"""

import asyncio
import os

import pytest
from hubproc import fresh_user, let_accounts_reach
from support.service import running_service
from support.wait import wait_until_async

MB = 10**6
SLEEP = {"code": "import time\ntime.sleep(600)", "name": "sleeper"}


def _peak_rss_reset() -> None:
    # Resets VmHWM, the peak resident set size of this process (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _grow(path: str, size: int) -> None:
    """Append ``size`` bytes of numbered lines, then five last lines, fast (to the
    agent's own file: its writer appends there too)."""
    block = b"".join(b"filler %08d %s\n" % (i, b"x" * 80) for i in range(100_000))
    with open(path, "ab") as f:
        for _ in range(size // len(block)):
            f.write(block)
        f.write(b"".join(b"last %d\n" % i for i in range(1, 6)))


@pytest.mark.slow
async def test_a_200_mb_log_is_read_from_the_end_off_the_event_loop(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc", simulate="1xA100-80GB") as svc:
        alice, bob = svc.create_user(fresh_user("alice")), svc.create_user(fresh_user("bob"))
        r = await svc.request("POST", "/jobs", token=alice, json=SLEEP)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        async def started():
            job = (await svc.request("GET", f"/jobs/{job_id}", token=alice)).json()
            return job if job["state"] != "queued" else None

        job = await wait_until_async(started, f"job {job_id} to start")
        assert job["state"] == "running", job
        jd = svc.app.jobs.jobdir({"id": job_id, "backend": "local"})
        log = jd.p("logs", "node0.log")
        # The agent's log, once the backend made it (the job's account's).
        await wait_until_async(lambda: os.path.exists(jd.p("launch.json")), "the job's launch")
        _grow(log, 210 * MB)
        assert os.path.getsize(log) > 200 * MB

        _peak_rss_reset()
        before = _peak_rss()
        tail, other = await asyncio.gather(
            svc.request("GET", f"/jobs/{job_id}/logs?tail=5", token=alice),
            svc.request("GET", "/inventory", token=bob),
        )
        grown = _peak_rss() - before
        assert tail.status_code == 200, tail.text
        assert tail.text.splitlines() == [f"[node0] last {i}" for i in range(1, 6)]
        assert other.status_code == 200 and other.json()["nodes"]
        # The log is 200 MB; a tail read holds a few blocks of it.
        assert grown < 20 * MB, f"peak RSS grew {grown / MB:.0f} MB for a tail of 5 lines"
        print(f"tail=5 of a {os.path.getsize(log) / MB:.0f} MB log: peak RSS +{grown / MB:.1f} MB")

        # All of it, no tail: at most 8 MiB, and a line saying what was skipped.
        _peak_rss_reset()
        before = _peak_rss()
        whole = await svc.request("GET", f"/jobs/{job_id}/logs", token=alice)
        grown = _peak_rss() - before
        assert whole.status_code == 200
        lines = whole.text.splitlines()
        assert len(whole.content) <= 9 * 2**20
        assert lines[-1] == "[node0] last 5"
        skipped = [line for line in lines if line.startswith("[node0] [gpulab] ")]
        assert len(skipped) == 1 and skipped[0].endswith("MiB of this log skipped")
        assert grown < 100 * MB, f"peak RSS grew {grown / MB:.0f} MB for a bounded read"
        print(f"whole read of the same log: peak RSS +{grown / MB:.1f} MB")
        assert (await svc.request("DELETE", f"/jobs/{job_id}", token=alice)).status_code == 200


@pytest.mark.slow
async def test_a_finished_jobs_log_of_150000_lines_is_read_to_its_traceback(tmp_path):
    """One read's budget is 100,000 lines: an answer reads on to the end of the log."""
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc", simulate="1xA100-80GB") as svc:
        alice = svc.create_user(fresh_user("alice"))
        code = (
            "import sys\n"
            "sys.stdout.write(''.join(f'line {i}\\n' for i in range(150_000)))\n"
            "raise RuntimeError('the very end')\n"
        )
        r = await svc.request("POST", "/jobs", token=alice, json={"code": code})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        async def ended():
            job = (await svc.request("GET", f"/jobs/{job_id}", token=alice)).json()
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None

        assert (await wait_until_async(ended, f"job {job_id} to end"))["state"] == "failed"
        r = await svc.request("GET", f"/jobs/{job_id}/logs", token=alice, params={"rank": 0})
        assert r.status_code == 200
        lines = r.text.splitlines()
        assert "[r0] line 149999" in lines
        assert any("RuntimeError: the very end" in line for line in lines[-5:]), lines[-5:]
