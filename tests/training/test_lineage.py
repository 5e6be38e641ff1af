"""Lineage facts a rank records: the fingerprints, and the shards read through the cache.

The dataset version is the documented formula (SHA-256 over the sorted
``url<TAB>size`` lines), recomputed here by hand; the recording runs in a process
of its own with ``GPULAB_JOB_DIR`` set, as in a rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from gpulab.training.lineage import (
    code_hash,
    dataset_name,
    dataset_version,
    datasets_read,
    reads_file,
)


def by_hand(shards) -> str:
    lines = sorted(f"{url}\t{size}\n" for url, size in set(shards))
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def test_a_dataset_version_is_its_sorted_shards_and_sizes():
    shards = [("s3://b/train-1.tar", 20), ("s3://b/train-0.tar", 10)]
    version = dataset_version(shards)
    assert version == by_hand(shards) and len(version) == 64
    # Order and repeats (ranks, epochs) do not change it; a size or a shard does.
    assert dataset_version(list(reversed(shards)) + shards) == version
    assert dataset_version([("s3://b/train-1.tar", 21), ("s3://b/train-0.tar", 10)]) != version
    assert dataset_version(shards[:1]) != version


def test_the_code_hash_is_the_cells_sha256():
    cell = "import torch\nmodel = torch.nn.Linear(2, 2)"
    assert code_hash(cell) == hashlib.sha256(cell.encode()).hexdigest() == code_hash(cell.encode())


def test_default_names_say_what_the_urls_share():
    assert dataset_name(["https://h/d/train-0.tar", "https://h/d/train-1.tar"]) == (
        "https://h/d/train-*"
    )
    assert dataset_name(["https://h/one.tar"]) == "https://h/one.tar"


def test_ranks_notes_merge_into_one_version_per_dataset():
    lines = [
        json.dumps({"dataset": "toy", "url": "u0", "size": 3}),
        json.dumps({"dataset": "toy", "url": "u1", "size": 4}),  # rank 1's half
        json.dumps({"dataset": "toy", "url": "u0", "size": 3}),  # again: next epoch
        json.dumps({"dataset": "eval", "url": "e0", "size": 5}),
        "not json",
        json.dumps({"dataset": "toy"}),
        '{"dataset": "toy", "url": "u9", "size": Infinity}',  # a rank's file: anything
        "[" * 5000,
    ]
    assert datasets_read(lines) == [
        {"name": "eval", "version": by_hand([("e0", 5)]), "shards": 1, "bytes": 5},
        {"name": "toy", "version": by_hand([("u0", 3), ("u1", 4)]), "shards": 2, "bytes": 7},
    ]


RANK = """
import gpulab.cache
from gpulab.cache import CachedDataset
ds = CachedDataset(SHARDS, name="toy", cache_dir=CACHE, prefetch=1)
assert [len(b) for b in ds] == [3, 5]
assert len(ds[0]) == 3  # read again: noted once
gpulab.cache.open(SHARDS[1], cache_dir=CACHE).close()
"""


def run_rank(tmp_path, env_extra: dict) -> None:
    shards = []
    for name, size in (("a.bin", 3), ("b.bin", 5)):
        (tmp_path / name).write_bytes(b"x" * size)
        shards.append(str(tmp_path / name))
    code = f"SHARDS = {shards!r}\nCACHE = {str(tmp_path / 'cache')!r}\n" + RANK
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_JOB_DIR"}
    subprocess.run([sys.executable, "-c", code], check=True, env={**env, **env_extra}, timeout=60)
    return shards


def test_a_rank_notes_the_shards_it_reads_through_the_cache(tmp_path):
    job = tmp_path / "job"
    shards = run_rank(tmp_path, {"GPULAB_JOB_DIR": str(job), "RANK": "1"})
    lines = (job / reads_file(1)).read_text().splitlines()
    assert len(lines) == 3  # each shard of the dataset once, and the file opened alone
    assert datasets_read(lines) == [  # by name: the file's path sorts first
        {"name": shards[1], "version": by_hand([(shards[1], 5)]), "shards": 1, "bytes": 5},
        {
            "name": "toy",
            "version": by_hand([(shards[0], 3), (shards[1], 5)]),
            "shards": 2,
            "bytes": 8,
        },
    ]


def test_outside_a_job_nothing_is_written(tmp_path):
    run_rank(tmp_path, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin", "cache"]
