"""What a job's folder keeps of its submission: the variables once, in vars.pkl.

spec.json is read at every poll of a running job (each second): it held the
variables again as base64, up to 345 MB parsed and checked on the service's event
loop per poll."""

from __future__ import annotations

import base64
import json

from gpulab.backend import jobdir as jobdir_mod
from gpulab.backend.jobdir import JobDir
from gpulab.backend.spec import JobSpec


def test_the_variables_are_kept_once_and_spec_json_stays_small(tmp_path):
    data = b"\x80pickled" * 100_000
    spec = JobSpec.from_dict({"code": "print(x)", "vars_b64": base64.b64encode(data).decode()})
    jd = JobDir(str(tmp_path), "j1")
    jd.write_inputs(spec)
    assert open(jd.p("vars.pkl"), "rb").read() == data
    stored = json.load(open(jd.p("spec.json")))
    assert stored["vars_b64"] == "" and stored["code"] == "print(x)"
    assert jd.spec().vars_b64 == ""  # what a poll reads
    assert (tmp_path / "j1" / "spec.json").stat().st_size < 4096


def test_a_spec_rewritten_in_the_folder_does_not_change_who_or_what_the_job_is(tmp_path):
    """On Kubernetes a job's pods may run as the service's account and write its
    folder: a spec.json naming another job's id made cancelling it delete the other
    job's Kubernetes Job, and a FIFO in its place would block the service."""
    import os
    from types import SimpleNamespace

    from gpulab.service.jobs.book import JobBook

    jd = JobDir(str(tmp_path), "mine")
    jd.write_inputs(JobSpec.from_dict({"code": "x", "gpu_milli": 250, "user": "alice"}))
    forged = {**json.load(open(jd.p("spec.json"))), "id": "victim", "user": "bob"}
    forged |= {"gpu_milli": 8000, "nproc_per_node": 8, "nodes": 8, "min_nodes": 1, "max_nodes": 16}
    forged |= {"priority_class": "urgent", "priority": 100, "preemptible": False}
    forged |= {"checkpoint_dir": str(tmp_path / "victim" / "checkpoints")}
    json.dump(forged, open(jd.p("spec.json"), "w"))
    jobdir_mod._SPECS.clear()  # as after a restart: the folder is read  # noqa: SLF001
    row = {"id": "mine", "user": "alice", "gpu_milli": 250, "nproc_per_node": 1, "nodes": 1}
    row |= {"priority": 0, "priority_class": "batch", "preemptible": True}
    row |= {"min_nodes": None, "max_nodes": None}
    book = SimpleNamespace(jobdir=lambda job: JobDir(str(tmp_path), job["id"]))
    spec = JobBook.spec(book, row)
    assert (spec.id, spec.user, spec.gpu_milli, spec.nproc_per_node) == ("mine", "alice", 250, 1)
    assert (spec.nodes, spec.max_nodes, spec.priority_class, spec.priority) == (1, 0, "batch", 0)
    assert spec.preemptible is True
    assert spec.checkpoint_dir == jd.p("checkpoints")

    os.unlink(jd.p("spec.json"))
    os.mkfifo(jd.p("spec.json"))
    assert jd.read_json("spec.json", "none") == "none"  # at once, not waiting for a writer
    os.unlink(jd.p("spec.json"))
    os.symlink("/etc/hostname", jd.p("spec.json"))
    assert jd.read_json("spec.json", "none") == "none"


def test_a_spec_rewritten_in_the_folder_is_not_parsed_again_at_each_poll(tmp_path):
    """A job's pods (Kubernetes) may pad spec.json to its read limit (~109 MiB of
    valid JSON), which each poll parsed on the service's loop: what the service wrote
    is what it reads, and the folder is read once (after a restart)."""
    jd = JobDir(str(tmp_path), "padded")
    jd.write_inputs(JobSpec.from_dict({"code": "print(1)", "user": "alice", "nodes": 2}))
    padded = json.load(open(jd.p("spec.json"))) | {"nodes": 1}
    with open(jd.p("spec.json"), "w") as f:
        f.write(json.dumps(padded) + " " * (8 << 20))
    parses = []
    real_loads = json.loads
    jobdir_mod.json.loads = lambda text: parses.append(len(text)) or real_loads(text)
    try:
        for _ in range(3):
            assert JobDir(str(tmp_path), "padded").spec().nodes == 2
        assert parses == []
        jd.write_spec({**jd.spec().to_dict(), "nodes": 3})  # the service's own change
        assert jd.spec().nodes == 3
        jobdir_mod._SPECS.clear()  # a restart  # noqa: SLF001
        assert [jd.spec().nodes for _ in range(3)] == [3, 3, 3]
        assert len(parses) == 1
    finally:
        jobdir_mod.json.loads = real_loads
