"""A job's folder is written by its ranks: on Kubernetes its pods (any uid, the
folder mounted writable), locally the ranks of the service's own account. What
they put there must not lead the service to another job's files, nor make it
read without end."""

import json
import os

import pytest

from gpulab.backend.jobdir import JobDir, LogTail
from gpulab.backend.spec import JobSpec, SpecError


@pytest.fixture
def jobs(tmp_path):
    """A victim job with an --out value and a log, and an attacker's job beside it."""
    victim = JobDir(str(tmp_path), "victim")
    for sub in ("out", "logs", "metrics"):
        os.makedirs(victim.p(sub))
    (tmp_path / "victim" / "out" / "value.pkl").write_bytes(b"the victim's model")
    (tmp_path / "victim" / "logs" / "rank0.log").write_text("the victim's secret\n")
    (tmp_path / "victim" / "metrics" / "rank0.jsonl").write_text('{"loss": 1}\n')
    mine = JobDir(str(tmp_path), "mine")
    os.makedirs(mine.path)
    return victim, mine


def test_a_folder_linked_to_another_jobs_is_not_followed(jobs):
    """``rm -r out; ln -s ../victim/out out``: GET /jobs/<own>/out streamed the
    victim's value (O_NOFOLLOW held for the last component only)."""
    victim, mine = jobs
    for sub in ("out", "logs", "metrics"):
        os.symlink(os.path.join("..", "victim", sub), mine.p(sub))
    assert mine.out_path() is None
    with pytest.raises(OSError):
        mine.open_user("out/value.pkl")
    with pytest.raises(OSError):
        mine.read_user("logs/rank0.log")
    assert mine.metrics(0) == ([], 0) and mine.last_metric(0) is None
    assert not any("victim" in line for line in LogTail(mine).read(final=True))
    with pytest.raises(OSError):  # nor is a file made through it
        mine.open_user("logs/node0.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert os.listdir(victim.p("logs")) == ["rank0.log"]
    with pytest.raises(PermissionError):
        mine.open_user("../victim/out/value.pkl")

    # The job's own folders and files are read as before.
    for sub in ("out", "logs"):
        os.unlink(mine.p(sub))
        os.makedirs(mine.p(sub))
    with open(mine.p("out", "value.pkl"), "wb") as f:
        f.write(b"mine")
    assert mine.out_path() == mine.p("out", "value.pkl")
    assert mine.read_user("out/value.pkl") == b"mine"
    os.close(mine.open_user("logs/node0.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT))
    assert os.path.isfile(mine.p("logs", "node0.log"))


def test_a_huge_json_file_of_the_service_is_not_read_whole(jobs, monkeypatch):
    """``truncate -s 50G launch.json`` (no disk) in a pod made every poll read it
    whole on the service's loop: past the limit the file is refused unread. (Files
    here are valid JSON a little past the limit, so a whole read shows as success.)"""
    from gpulab.backend import jobdir

    _, mine = jobs
    mine.write_json("launch.json", {"kind": "Job", "pad": "x" * (1 << 20)})  # > 1 MiB
    assert mine.read_json("launch.json", {}) == {}
    mine.write_json("launch.json", {"kind": "Job"})
    assert mine.read_json("launch.json") == {"kind": "Job"}

    # spec.json's limit is far larger (it holds the code and the environment).
    env = {f"V{i}": "x" * (32 << 10) for i in range(64)}  # 2 MiB, a valid spec
    mine.write_json("spec.json", JobSpec(code="print(1)", id="mine", env=env).to_dict())
    assert mine.spec().env == env
    monkeypatch.setattr(jobdir, "SPEC_READ_BYTES", 1 << 20, raising=False)
    jobdir._SPECS.clear()  # a restart: the folder is read again  # noqa: SLF001
    with pytest.raises(SpecError, match="at most 1 MiB"):
        mine.spec()


def test_an_allreduce_result_is_read_from_the_jobs_own_out_folder(jobs):
    """The probe's result goes on the dashboard's Network tab under the job's id: a
    link to another job's ``out/`` recorded that job's result as this one's."""
    from gpulab.service.telemetry.allreduce import AllreduceRecords

    victim, mine = jobs
    # A valid result of 2 ranks: busbw = algbw * 2(n-1)/n.
    result = {"size_bytes": 1 << 26, "world_size": 2, "algbw_bytes_per_second": 1e9}
    result |= {"busbw_bytes_per_second": 1e9, "backend": "gloo"}
    with open(victim.p("out", "allreduce.json"), "w") as f:
        json.dump(result, f)
    os.symlink(os.path.join("..", "victim", "out"), mine.p("out"))
    recorded = []
    records = AllreduceRecords("node0", type("T", (), {"add_allreduce": recorded.append})())
    job = {"id": "mine", "user": "mallory", "nodes": 1, "nproc_per_node": 2}
    assert records.from_job(job, mine) is None
    assert recorded == []
    assert "all-reduce result not recorded" in open(mine.p("events.log")).read()
    # Its own result, in its own folder, is recorded.
    os.unlink(mine.p("out"))
    os.makedirs(mine.p("out"))
    with open(mine.p("out", "allreduce.json"), "w") as f:
        json.dump(result, f)
    assert records.from_job(job, mine) is not None
    assert [r["world_size"] for r in recorded] == [2]
