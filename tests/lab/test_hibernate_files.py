"""The server extension's part of hibernation on disk: old hibernations go, oldest
first, to keep a user's total under the cap; the new one always stays."""

from __future__ import annotations

import os

from gpulab.lab.hibernate import KEEP, prune


def make(root, hid: str, size: int, age: int) -> None:
    folder = root / hid
    folder.mkdir()
    (folder / "0.state").write_bytes(b"x" * size)
    then = 1_700_000_000 - age
    os.utime(folder, (then, then))


def test_oldest_go_first_until_under_the_cap(tmp_path):
    make(tmp_path, "h-000001", 400, age=300)
    make(tmp_path, "h-000002", 400, age=200)
    make(tmp_path, "h-000003", 400, age=100)
    make(tmp_path, "h-000004", 400, age=0)  # the new one
    (tmp_path / "not-a-hibernation").mkdir()
    assert prune(str(tmp_path), "h-000004", cap=1000) == ["h-000002", "h-000001"]
    assert sorted(os.listdir(tmp_path)) == ["h-000003", "h-000004", "not-a-hibernation"]


def test_the_new_one_stays_even_alone_over_the_cap(tmp_path):
    make(tmp_path, "h-00000a", 10, age=100)
    make(tmp_path, "h-00000b", 5000, age=0)
    assert prune(str(tmp_path), "h-00000b", cap=1000) == ["h-00000a"]
    assert os.listdir(tmp_path) == ["h-00000b"]


def test_at_most_keep_hibernations(tmp_path):
    for n in range(KEEP + 2):
        make(tmp_path, f"h-{n:06x}", 1, age=100 - n)
    removed = prune(str(tmp_path), f"h-{KEEP + 1:06x}", cap=10**9)
    assert removed == ["h-000001", "h-000000"]
    assert len(os.listdir(tmp_path)) == KEEP
