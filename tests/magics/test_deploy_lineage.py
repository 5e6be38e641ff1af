"""``%deploy --list --lineage``: one short line per endpoint version, and the tags the
magics keep per model object (the end-to-end path: tests/deploy/test_lineage_notebook.py)."""

import gc
from types import SimpleNamespace

import torch
from test_deploy_list import endpoint, version

from gpulab.magics import lineage as tags
from gpulab.magics.deploy_list import lineage_line, list_html, list_table
from gpulab.magics.lineage import from_job, lineage_of, quantized, remember

JOB = {
    "id": "3f2a9c1e0b7d",
    "code_hash": "1a2b3c4d5e6f" + "0" * 52,
    "datasets": [{"name": "toy", "version": "9f8e7d6c5b4a" + "1" * 52}],
}


def lineage(job=JOB, scheme="int8-dynamic"):
    return {
        "created": "2026-12-04T16:45:03+00:00",
        "created_by": "ada",
        "job": job,
        "quantization": {"scheme": scheme} if scheme else None,
    }


def test_each_version_says_its_job_code_data_and_quantization():
    v1 = version(1, 80, lineage=lineage())
    v2 = version(2, 20, lineage=lineage(job=None, scheme=None))
    deps = [endpoint("sentiment", versions=[v1, v2])]
    assert lineage_line(v1) == (
        "v1 · job 3f2a9c1e0b7d · code 1a2b3c4d5e6f · data toy@9f8e7d6c5b4a · int8-dynamic"
        " · by ada 2026-12-04T16:45"
    )
    assert lineage_line(v2).startswith("v2 · not from a gpulab job · not quantized")
    text = list_table(deps, lineage=True)
    assert lineage_line(v1) in text and lineage_line(v2) in text
    assert "job 3f2a9c1e0b7d" not in list_table(deps)  # only when asked
    assert "job 3f2a9c1e0b7d" in list_html(deps, lineage=True)
    no_data = version(1, 100, lineage=lineage(job={**JOB, "datasets": []}))
    assert "no cached data read" in lineage_line(no_data)


def test_a_tag_follows_the_object_and_its_quantized_copy():
    model = torch.nn.Linear(2, 2)
    assert lineage_of(model) is None
    assert remember(model, from_job({**JOB, "datasets": [{**JOB["datasets"][0], "shards": 2}]}))
    assert lineage_of(model)["job"] == JOB  # only name and version of each dataset
    assert not remember(3, {})  # nothing to tag: never a wrong answer later
    report = SimpleNamespace(
        scheme="int8-dynamic",
        engine="torch-ao",
        device="cpu",
        size_before=100,
        size_after=30,
        latency_before_s=0.002,
        latency_after_s=0.001,
        speedup=2.0,
        max_abs_error=0.01,
        relative_error=float("nan"),
    )
    tag = quantized(lineage_of(model), report)
    assert tag["job"] == JOB and tag["quantization"]["scheme"] == "int8-dynamic"
    assert tag["quantization"]["latency_before_ms"] == 2.0
    assert tag["quantization"]["relative_error"] is None  # JSON has no NaN
    assert quantized(None, report)["job"] is None
    key = id(model)
    del model
    gc.collect()
    assert key not in tags._tags  # gone with its model: a new object never inherits it
