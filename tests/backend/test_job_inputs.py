"""What a job's folder keeps of its submission: the variables once, in vars.pkl.

spec.json is read at every poll of a running job (each second): it held the
variables again as base64, up to 345 MB parsed and checked on the service's event
loop per poll."""

from __future__ import annotations

import base64
import json

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
