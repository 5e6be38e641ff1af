"""NVML: the no-driver path for real, GPU paths against a real GPU or the NVML twin."""

import json
import os
import pwd
import subprocess
import sys
import uuid

import pynvml
import pytest
from fake_nvml import FakeDevice, FakeNvml, a100_mig_3g20gb
from support.wait import wait_until

from gpulab.enforcement.accounts import UserAccounts
from gpulab.telemetry.collect import NodeSampler
from gpulab.telemetry.nvml import NvmlSampler
from gpulab.telemetry.procs import jupyterhub_user, real_uid, unix_user
from gpulab.telemetry.sample import SourceMissing

GiB = 2**30


def driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_GPU = driver_present()


@pytest.mark.skipif(HAS_GPU, reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_reason_says_so():
    with pytest.raises(SourceMissing) as missing:
        NvmlSampler().sample()
    assert "no NVIDIA driver" in missing.value.reason
    assert "NVMLError_LibraryNotFound" in missing.value.reason

    sample = NodeSampler(samplers={"gpu": NvmlSampler()}).sample()
    assert sample["gpus"] == []
    assert sample["missing"]["gpu"] == missing.value.reason


@pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU and driver (none here)")
def test_real_gpus_are_sampled():
    sampler = NvmlSampler()
    try:
        gpus = sampler.sample()
    finally:
        sampler.close()
    assert gpus, "NVML started but listed no GPU"
    for gpu in gpus:
        assert gpu["uuid"].startswith("GPU-")
        assert gpu["memory_total_bytes"] > 0
        assert 0 <= (gpu["utilization_ratio"] or 0) <= 1
        json.dumps(gpu)


def test_a_driver_that_is_not_loaded():
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(SourceMissing, match=r"driver not loaded \(NVMLError_DriverNotLoaded\)"):
        NvmlSampler(fake).sample()


def test_processes_are_mapped_to_jupyterhub_users_through_proc(hub_user_process):
    parent, child = hub_user_process
    assert jupyterhub_user(parent) == "alice"
    assert jupyterhub_user(child) == "alice"  # inherited through the parent
    assert jupyterhub_user(os.getpid()) == os.environ.get("JUPYTERHUB_USER")
    assert jupyterhub_user(2**22 + 12345) is None  # no such process


def boards(parent_pid, child_pid):
    whole = FakeDevice(
        "GPU-aaaa",
        "NVIDIA H200",
        141 * GiB,
        30 * GiB,
        gpu_util=75,
        mem_util=20,
        temperature=55,
        power_mw=None,
        energy_mj=5_000_000,
        processes=[(parent_pid, 10 * GiB), (child_pid, 20 * GiB), (2**22 + 12345, None)],
    )
    mig = {
        0: a100_mig_3g20gb(processes=[(child_pid, 4 * GiB)]),
        2: FakeDevice(
            "MIG-2222",
            "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
            5 * GiB,
            0,
            gpu_util=None,
            mem_util=None,
            temperature=None,
            power_mw=None,
            energy_mj=None,
            gpu_instance_id=9,
            compute_instance_id=0,
        ),
    }
    partitioned = FakeDevice(
        "GPU-bbbb", "NVIDIA A100-SXM4-40GB", 40 * GiB, 4 * GiB, gpu_util=10, temperature=35, mig=mig
    )
    return [whole, partitioned]


def test_gpus_mig_devices_and_errors_per_call(hub_user_process):
    fake = FakeNvml(boards(*hub_user_process))
    gpus = NvmlSampler(fake).sample()
    json.dumps(gpus)

    whole, partitioned = gpus
    assert whole["uuid"] == "GPU-aaaa" and whole["index"] == 0
    assert whole["utilization_ratio"] == 0.75
    assert whole["memory_used_bytes"] == 30 * GiB
    assert whole["energy_joules"] == 5000.0
    # One unsupported call costs only its own field.
    assert whole["power_watts"] is None
    assert whole["errors"] == {
        "power_watts": "NVMLError_NotSupported",
        "processes": "NVMLError_NotSupported",
        # This stand-in has no event or ECC functions (tests/support/fake_nvml.py has).
        "xids": "NVMLError_FunctionNotFound",
        "ecc_uncorrected_errors_total": "NVMLError_FunctionNotFound",
    }
    assert whole["xids"] is None and whole["ecc_uncorrected_errors_total"] is None
    assert whole["lost"] is False
    users = {p["pid"]: p["user"] for p in whole["processes"]}
    parent, child = hub_user_process
    assert users[parent] == users[child] == "alice"
    assert users[2**22 + 12345] is None
    assert whole["mig_enabled"] is False and whole["mig"] == []

    assert partitioned["mig_enabled"] is True
    assert [m["uuid"] for m in partitioned["mig"]] == ["MIG-1111", "MIG-2222"]
    first = partitioned["mig"][0]
    assert first["profile"] == "3g.20gb"
    assert (first["gpu_instance_id"], first["compute_instance_id"]) == (1, 0)
    assert first["utilization_ratio"] is None
    assert first["errors"]["utilization_ratio"] == "NVMLError_NotSupported"
    assert first["processes"][0]["user"] == "alice"


def test_nvml_that_breaks_between_samples_recovers():
    fake = FakeNvml(boards(os.getpid(), os.getpid()))
    sampler = NvmlSampler(fake)
    assert len(sampler.sample()) == 2
    fake.count_error = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(SourceMissing, match="NVMLError_GpuIsLost"):
        sampler.sample()
    assert fake.shutdowns == 1
    fake.count_error = None
    assert len(sampler.sample()) == 2
    assert fake.started == 2  # started afresh


def test_a_process_naming_itself_in_any_bytes_does_not_stop_the_sample(tmp_path):
    """A process names itself with prctl(PR_SET_NAME) in any bytes; its stat line is
    read as bytes (a strict decode raised out of the whole GPU sample)."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes, os, sys; ctypes.CDLL(None).prctl(15, b'\\xff\\xfe)x', 0, 0, 0); "
            "pid = os.fork()\n"
            "if pid == 0: os.environ.pop('JUPYTERHUB_USER', None); print(os.getpid(), flush=True); "
            "sys.stdin.read()\n"
            "else: os.waitpid(pid, 0)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "JUPYTERHUB_USER": "alice"},
    )
    try:
        grandchild = int(child.stdout.readline())
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            assert b"\xff\xfe)x" in f.read()
        # The walk passes through the oddly named parent to the name it holds.
        assert jupyterhub_user(grandchild) == "alice"
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_claimed_user_is_believed_only_as_far_as_the_account_allows(tmp_path):
    proc = tmp_path / "proc"
    me = os.getuid()

    def fake(pid: int, user: bytes, uid: int = me) -> int:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "environ").write_bytes(b"PATH=/bin\0JUPYTERHUB_USER=" + user + b"\0")
        (proc / str(pid) / "status").write_bytes(
            f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n".encode()
        )
        (proc / str(pid) / "stat").write_bytes(f"{pid} (x) S 1 1".encode())
        return pid

    assert jupyterhub_user(fake(10, b"alice"), str(proc)) == "alice"
    assert jupyterhub_user(fake(11, b"A" * 256), str(proc)) is None  # no hub name is that long
    assert unix_user(10, str(proc)) == pwd.getpwuid(me).pw_name  # from status, not the folder


@pytest.mark.skipif(os.geteuid() != 0, reason="making an account needs root")
def test_a_gpulab_account_cannot_put_its_gpu_memory_under_another_users_name(tmp_path):
    accounts = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    mallory = f"m{uuid.uuid4().hex[:8]}"
    account = accounts.ensure(mallory)
    try:
        for claimed, seen in (("bob", None), (mallory, mallory)):
            p = subprocess.Popen(
                ["sleep", "60"],
                env={"JUPYTERHUB_USER": claimed, "PATH": os.environ["PATH"]},
                **account.popen_kwargs(),
            )
            try:
                wait_until(lambda p=p: real_uid(p.pid) == account.uid, "the process as the account")
                assert jupyterhub_user(p.pid) == seen
                assert unix_user(p.pid) == account.name
            finally:
                p.kill()
                p.wait()
    finally:
        subprocess.run(["userdel", account.name], capture_output=True)
