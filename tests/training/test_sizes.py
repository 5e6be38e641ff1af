"""One size rule for every size gpulab reads (gpulab.training.sizes).

K/M/G/T alone and KiB/MiB/GiB/TiB (and Kubernetes' Ki/Mi/Gi/Ti) are powers of 1024;
KB/MB/GB/TB powers of 1000. The all-reduce probe and the dataset cache both use it.
"""

import subprocess
import sys

import pytest

from gpulab.cache.settings import default_capacity_bytes
from gpulab.cache.settings import parse_size as cache_size
from gpulab.training.sizes import parse_size

# Every size the docs and docstrings show today, and what it means.
DOCUMENTED = {
    "65536": 65536,
    "64K": 64 * 2**10,
    "256K": 256 * 2**10,
    "1M": 2**20,
    "16M": 16 * 2**20,
    "64M": 64 * 2**20,
    "256M": 256 * 2**20,
    "1G": 2**30,
    "1MiB": 2**20,
    "2GiB": 2 * 2**30,
    "20GiB": 20 * 2**30,
    "200GiB": 200 * 2**30,
    "1.5TiB": 3 * 2**39,
    "500MB": 500 * 10**6,
    "500GB": 500 * 10**9,
    "1073741824": 2**30,
}


@pytest.mark.parametrize(("text", "expected"), DOCUMENTED.items())
def test_documented_sizes(text, expected):
    assert parse_size(text) == expected
    assert cache_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16m", 16 * 2**20),
        (" 16 M ", 16 * 2**20),
        ("16Mi", 16 * 2**20),
        ("16mib", 16 * 2**20),
        ("16MB", 16 * 10**6),
        ("16mb", 16 * 10**6),
        ("2T", 2 * 2**40),
        ("2TB", 2 * 10**12),
        ("1Ki", 1024),
        ("1KB", 1000),
        ("12B", 12),
        ("0.5K", 512),
        ("0", 0),
        (4096, 4096),
    ],
)
def test_the_rule(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "", "1.5.3", "16X", "-1", "16 MBB", "M", "1e6", -5])
def test_bad_sizes_say_what_to_write(text):
    with pytest.raises(ValueError, match="expected bytes like|cannot be negative"):
        parse_size(text)


def test_cache_capacity_must_be_positive(monkeypatch):
    with pytest.raises(ValueError, match="positive"):
        cache_size("0")
    monkeypatch.setenv("GPULAB_CACHE_CAPACITY_BYTES", "20G")
    assert default_capacity_bytes() == 20 * 2**30
    monkeypatch.setenv("GPULAB_CACHE_CAPACITY_BYTES", "lots")
    with pytest.raises(ValueError, match="GPULAB_CACHE_CAPACITY_BYTES.*20GiB"):
        default_capacity_bytes()


def test_probe_sizes_are_whole_float32s():
    from gpulab.training.allreduce_probe import parse_size as probe_size

    assert probe_size("16M") == 16 * 2**20
    assert probe_size("1KB") == 1000 and probe_size("10") == 8
    with pytest.raises(ValueError, match="at least 4 bytes"):
        probe_size("3")
    with pytest.raises(ValueError, match="expected bytes"):
        probe_size("lots")


def test_the_parser_needs_no_torch():
    # Magics and the dataset cache import it; a size must not cost a torch import.
    code = (
        "import sys; import gpulab.training.sizes, gpulab.cache.settings; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
