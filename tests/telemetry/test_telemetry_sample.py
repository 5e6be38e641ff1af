"""A whole node sample on this machine, and the payload checks for the service."""

import json
import subprocess
import sys

from gpulab.telemetry.collect import NodeSampler
from gpulab.telemetry.sample import validate_sample


def test_a_sample_of_this_machine_is_complete_json(tmp_path):
    sampler = NodeSampler(cache_dir=str(tmp_path / "cache"))
    sample = json.loads(json.dumps(sampler.sample()))
    sampler.close()
    assert validate_sample(sample) == []
    assert set(sample) >= {"version", "ts", "node", "gpus", "nics", "rdma", "cache", "missing"}
    assert "nic" not in sample["missing"]
    assert sample["nics"], "this machine has at least one interface besides lo"
    assert "no dataset cache" in sample["missing"]["cache"]
    assert sample["cache"] is None


def test_cache_counters_written_by_another_process_are_read(tmp_path):
    shard = tmp_path / "shard.bin"
    shard.write_bytes(b"y" * 5000)
    cache_dir = str(tmp_path / "cache")
    code = (
        "import sys, gpulab.cache as c\n"
        "for _ in range(4):\n"
        "    c.open(sys.argv[1], cache_dir=sys.argv[2]).close()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(shard), cache_dir], check=True, timeout=60)

    sample = NodeSampler(cache_dir=cache_dir).sample()
    assert "cache" not in sample["missing"]
    cache = sample["cache"]
    assert (cache["hits"], cache["misses"]) == (3, 1)
    assert cache["hit_ratio"] == 0.75
    assert cache["bytes_from_remote"] == 5000 and cache["used"] == 5000


def test_a_broken_sampler_costs_only_its_own_source():
    class Broken:
        def sample(self):
            raise RuntimeError("boom")

    class Fine:
        def sample(self):
            return [{"device": "eth9", "rx_bytes": 1, "tx_bytes": 2}]

    sample = NodeSampler(node="n", samplers={"gpu": Broken(), "nic": Fine()}).sample()
    assert sample["missing"] == {"gpu": "sampler failed: RuntimeError('boom')"}
    assert sample["nics"][0]["device"] == "eth9"


def test_validate_sample_names_each_problem():
    assert validate_sample([]) == ["a sample must be a JSON object"]
    problems = validate_sample(
        {
            "version": 2,
            "ts": "now",
            "node": "",
            "gpus": {},
            "nics": [],
            "rdma": [1],
            "cache": 3,
            "missing": {"gpu": 1},
        }
    )
    assert problems == [
        "version must be 1",
        "ts must be unix seconds (a number)",
        "node must be a non-empty string",
        "gpus must be a list of objects",
        "rdma must be a list of objects",
        "cache must be an object or null",
        "missing must map source names to reasons (strings)",
    ]
