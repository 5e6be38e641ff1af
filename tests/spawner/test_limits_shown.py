"""What a user is told about their slice's enforcement and limits: the spawn
form per size, ``%gpulab`` in the server, both from the same figures."""

from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.slice_env import slice_env
from gpulab.magics.status import slice_status
from gpulab.spawner.form import render_form

GIB = 2**30
AVAILABILITY = {
    "sizes": [
        {"milli": 0, "label": "No GPU", "available": True, "count": 0, "reason": ""},
        {"milli": 250, "label": "1/4 GPU", "available": True, "count": 4, "reason": ""},
        {"milli": 1000, "label": "1 GPU", "available": True, "count": 1, "reason": ""},
    ],
    "held_milli": 0,
}


def test_limits_grow_with_the_slice_and_never_fall_below_the_floors():
    limits = AccountLimits(
        cpu_per_gpu=8, memory_per_gpu=64 * GIB, cpu_floor=1, memory_floor=4 * GIB
    )
    assert (limits.limits(0, 4).cpu_cores, limits.limits(0, 4).memory_bytes) == (1, 4 * GIB)
    assert (limits.limits(250, 4).cpu_cores, limits.limits(250, 4).memory_bytes) == (2, 16 * GIB)
    assert limits.limits(1000, 4).cpu_cores == 8
    # A job node with 2 ranks of no GPU: twice the floors.
    assert limits.limits(0, 4, ranks=2).memory_bytes == 8 * GIB


def test_the_spawn_form_says_what_each_size_is_held_to():
    limits = AccountLimits(cpu_per_gpu=8, memory_per_gpu=64 * GIB)
    texts = {s["milli"]: f"cgroup v1: {s['milli']}" for s in AVAILABILITY["sizes"]}
    form = render_form(AVAILABILITY, demo=False, limits=texts)
    assert form.count('class="text-muted gpulab-limits"') == 3
    assert "cgroup v1: 250" in form
    assert "gpulab-limits" not in render_form(AVAILABILITY, demo=False)
    assert limits.cgroups().describe(limits.limits(250, 4))  # never empty


def test_gpulab_status_names_the_mechanism_and_the_limits():
    alloc = [{"gpu_uuid": "GPU-1", "milli": 250, "memory_mib": 20000}]
    env = {
        **slice_env(alloc, simulated=False, mps_dir=None),
        "GPULAB_LIMITS": "cgroup v1: 2 CPUs, 16 GiB, devices: /dev/nvidia0",
    }
    status = slice_status(env)
    assert "Held by: PyTorch allocator limit: advice only" in status
    assert "Limits: cgroup v1: 2 CPUs, 16 GiB, devices: /dev/nvidia0" in status
    mig = slice_env([{"gpu_uuid": "MIG-1", "milli": 250, "memory_mib": 20000}], False, None)
    assert "held by the hardware" in slice_status(mig)
    sim = slice_env(alloc, simulated=True, mps_dir=None)
    assert "Held by: none: a simulated GPU" in slice_status(sim)


def test_the_forms_words_for_limits_name_no_mechanism():
    from gpulab.enforcement.limits import Limits, limits_in_words

    held = Limits(cpu_cores=2, memory_bytes=16 * GIB, devices=("/dev/nvidia0",), pids=4096)
    assert limits_in_words(held) == (
        "up to 2 CPUs, 16 GiB of memory and 4096 processes; only its own GPU"
    )
    assert limits_in_words(Limits(0.5, None, ())) == "up to 0.5 CPU; no GPU device"
    assert limits_in_words(Limits(None, None, None)) == "CPU and memory not limited"
