"""Limits of a slice: proportional to the slice, never below the floors (pure)."""

import pytest

from gpulab.enforcement.gpu_nodes import (
    DeviceNode,
    denied_nodes,
    mig_access_minors,
    parse_device_minor,
    parse_mig_minors,
    parse_proc_devices,
)
from gpulab.enforcement.limits import (
    GIB,
    MIB,
    Limits,
    format_limits,
    host_share_per_gpu,
    limits_for_slice,
)


def test_a_quarter_slice_gets_a_quarter_of_the_per_gpu_share():
    assert limits_for_slice(
        250,
        cpu_per_gpu=8,
        memory_per_gpu=64 * GIB,
        cpu_floor=1,
        memory_floor=2 * GIB,
        gpu_devices=("/dev/nvidia0",),
    ) == Limits(cpu_cores=2.0, memory_bytes=16 * GIB, devices=("/dev/nvidia0",))


def test_two_whole_gpus_get_twice_the_share():
    assert limits_for_slice(
        2000, 8, 64 * GIB, 1, 2 * GIB, ("/dev/nvidia0", "/dev/nvidia1")
    ) == Limits(cpu_cores=16.0, memory_bytes=128 * GIB, devices=("/dev/nvidia0", "/dev/nvidia1"))


def test_a_tenth_falls_back_to_the_floors_where_the_share_is_smaller():
    assert limits_for_slice(100, 6, 16 * GIB, 1, 2 * GIB, ("/dev/nvidia3",)) == Limits(
        cpu_cores=1.0, memory_bytes=2 * GIB, devices=("/dev/nvidia3",)
    )
    # Above the floor the share stands, to the millicore.
    assert limits_for_slice(100, 12.5, 64 * GIB, 1, 2 * GIB, ()) == Limits(
        cpu_cores=1.25, memory_bytes=6871947673, devices=()
    )


def test_a_server_without_gpu_gets_the_floors_and_no_gpu_device():
    assert limits_for_slice(0, 8, 64 * GIB, 1.5, 3 * GIB, ()) == Limits(
        cpu_cores=1.5, memory_bytes=3 * GIB, devices=()
    )


def test_no_per_gpu_setting_leaves_that_resource_unlimited():
    assert limits_for_slice(500, None, None, 1, 2 * GIB, None) == Limits(None, None, None)
    assert limits_for_slice(500, 0, 32 * GIB, 1, 2 * GIB, None) == Limits(
        cpu_cores=None, memory_bytes=16 * GIB, devices=None
    )
    assert Limits(None, None, None).unlimited


def test_bad_values_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="gpu_milli"):
        limits_for_slice(-1, 8, GIB)
    with pytest.raises(ValueError, match="cpu_cores"):
        Limits(cpu_cores=0, memory_bytes=None, devices=None)
    with pytest.raises(ValueError, match="1 MiB"):
        Limits(cpu_cores=None, memory_bytes=1000, devices=None)
    with pytest.raises(ValueError, match="/dev"):
        Limits(cpu_cores=None, memory_bytes=None, devices=("nvidia0",))


def test_the_host_is_shared_among_its_gpus_keeping_a_tenth_of_memory():
    assert host_share_per_gpu(64, 1000 * GIB, 8) == (8.0, 112.5 * GIB)
    assert host_share_per_gpu(10, 100 * GIB, 3) == (3.333, 32212254720)
    assert host_share_per_gpu(16, 64 * GIB, 0) == (None, None)


def test_limits_read_as_a_short_line():
    assert (
        format_limits(Limits(2.0, 8 * GIB, ("/dev/nvidia0",)))
        == "2 CPUs, 8 GiB, devices: /dev/nvidia0"
    )
    assert format_limits(Limits(0.5, 512 * MIB, ())) == "0.5 CPU, 512 MiB, devices: no GPU"
    assert (
        format_limits(Limits(1.25, 3 * GIB // 2, None)) == "1.25 CPUs, 1.5 GiB, devices not limited"
    )
    assert (
        format_limits(Limits(None, None, None))
        == "CPU not limited, memory not limited, devices not limited"
    )


PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
136 pts
195 nvidia-frontend
226 drm
235 nvidia-caps
509 nvidia-uvm

Block devices:
  8 sd
259 blkext
"""

MIG_MINORS = """config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu1/gi1/access 147
gpu1/gi1/ci0/access 148
"""


def test_proc_files_are_read_to_device_numbers():
    assert parse_proc_devices(PROC_DEVICES) == {
        "mem": 1,
        "/dev/vc/0": 4,
        "pts": 136,
        "nvidia-frontend": 195,
        "drm": 226,
        "nvidia-caps": 235,
        "nvidia-uvm": 509,
    }
    info = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 17\nDevice Minor: \t 2\n"
    assert parse_device_minor(info) == 2
    assert parse_device_minor("Model: x\n") is None
    minors = parse_mig_minors(MIG_MINORS)
    assert mig_access_minors(minors, 0) == [3, 4, 12, 13]
    assert mig_access_minors(minors, 0, gi=1, ci=0) == [12, 13]
    assert mig_access_minors(minors, 1, gi=1) == [147]


def test_a_slice_is_denied_every_other_card_and_keeps_the_control_nodes():
    host = [
        DeviceNode("c", 195, 0, "/dev/nvidia0"),
        DeviceNode("c", 195, 1, "/dev/nvidia1"),
        DeviceNode("c", 226, 1, "/dev/dri/card1"),
        DeviceNode("c", 195, 255, "/dev/nvidiactl", shared=True),
        DeviceNode("c", 509, 0, "/dev/nvidia-uvm", shared=True),
    ]
    # /dev/nvidia0 need not exist here: its numbers follow from its name.
    assert [n.path for n in denied_nodes(host, ("/dev/nvidia0",))] == [
        "/dev/nvidia1",
        "/dev/dri/card1",
    ]
    assert [n.rule for n in denied_nodes(host, ())] == [
        "c 195:0 rwm",
        "c 195:1 rwm",
        "c 226:1 rwm",
        "c 195:255 rwm",
        "c 509:0 rwm",
    ]


def test_work_without_a_slice_opens_no_card_where_the_cards_are_real(tmp_path):
    """A CPU-only job (or server, or replica) on a host with real cards is denied every
    GPU device node, not left unlimited (``None`` let it open every card)."""
    from types import SimpleNamespace

    from gpulab.backend.local import LocalBackend
    from gpulab.backend.spec import JobSpec
    from gpulab.enforcement.gpu_nodes import no_gpu_unless

    assert no_gpu_unless([], real_cards=True) == ()
    assert no_gpu_unless([], real_cards=False) is None  # simulated: nothing to open
    asked = {}

    class Limits:
        def group(self, account, unit, milli, gpu_count, ranks=1, gpu_devices=None):
            asked["devices"] = gpu_devices

    backend = LocalBackend(str(tmp_path / "jobs"), real_gpus=True)
    backend.limits = Limits()  # the accounts' limits, as the service gives them as root
    spec = JobSpec(code="print(1)", gpu_milli=0, id="cpuonly1", user="alice")
    backend._node_group(spec, SimpleNamespace(name="gpulab-alice"), 0, [])  # noqa: SLF001
    assert asked["devices"] == ()
