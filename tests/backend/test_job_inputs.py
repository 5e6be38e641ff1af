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
