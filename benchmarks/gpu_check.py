"""gpulab's GPU paths, checked on a real GPU machine in one run: ``make gpu-check``.

Prints a markdown table ``check | result | figure | note``:

* the NVML inventory against ``nvidia-smi --query-gpu=uuid,name,memory.total``;
* every enforcement mechanism this machine offers (MIG, an MPS daemon's memory
  limit, HAMi-core's ``libvgpu.so``, PyTorch's allocator cap): a child process
  in a 1/4 slice asks for 1/2 of the card's memory and must be refused, and a
  control child without a cap must get it;
* the device cgroup: a group holding one card cannot open another
  (``n/a: one GPU`` on a one-card machine), a group without a GPU opens none;
* a 2-rank NCCL ``all_reduce`` job under torchrun (bytes and time);
* fp8 quantization (``gpulab.serving.quantize``) of a small MLP;
* a model replica (``python -m gpulab.serving.server``, started the way the
  local serving backend does) on a 1/4 slice, called once;
* a language model through the OpenAI gateway (a real hub on this machine's GPUs,
  half a GPU, the engine the replica chooses: vLLM where it is installed) against
  ``vllm serve`` alone with the same memory share: 16 streaming clients, tokens/s
  (``benchmarks/llm_serving.py --only gateway,vllm-serve --real-gpus``).

Every check runs its GPU work in child processes with a timeout of its own,
all within one deadline (``--deadline``, default 450 s). Nothing needs the
network. Without an NVIDIA driver every row says ``skipped: no NVIDIA driver``
and the script exits 0 at once; with one it exits 1 if a row is FAIL or error.
The script changes nothing it does not put back: MIG mode is only read, an
MPS daemon it starts lives in a private pipe directory and is stopped.

    python benchmarks/gpu_check.py [--deadline 450] [--only inventory,nccl]
    python benchmarks/gpu_check.py --plumbing   # the checks' machinery on CPU (tests)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20
NO_DRIVER = "skipped: no NVIDIA driver"
HAMI_PATHS = ("/usr/local/vgpu/libvgpu.so", "/usr/local/lib/libvgpu.so", "/usr/lib/libvgpu.so")


@dataclass
class Row:
    check: str
    result: str
    figure: str = ""
    note: str = ""


def ensure_gpulab_importable() -> None:
    """On a bare checkout (no ``pip install -e .``), map ``gpulab`` to the repository
    for this process and its children, through a symlink on ``PYTHONPATH``."""
    try:
        import gpulab.enforcement.limits  # noqa: F401

        return
    except ImportError:
        pass
    shim = tempfile.mkdtemp(prefix="gpulab-shim-")
    os.symlink(ROOT, os.path.join(shim, "gpulab"))
    sys.path.insert(0, shim)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))


# -- the clock and the children -----------------------------------------------------------
class Clock:
    def __init__(self, deadline_s: float):
        self.end = time.monotonic() + deadline_s

    def budget(self, wanted: float) -> float:
        """``wanted`` seconds, or what is left of the overall deadline (minus a margin)."""
        return max(1.0, min(wanted, self.end - time.monotonic() - 5))

    @property
    def out(self) -> bool:
        return time.monotonic() > self.end - 10


def run_child(
    argv: list[str], timeout: float, env: dict | None = None, **kwargs
) -> tuple[int | None, str]:
    """(exit code or None on timeout, stdout+stderr) of a child in a session of its own."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out + f"\n[timed out after {timeout:.0f}s]"


def tail(text: str, n: int = 160) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:n].replace("|", "/")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child, without anything that changes a slice's enforcement."""
    drop = (
        "CUDA_VISIBLE_DEVICES",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "LD_PRELOAD",
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_SM_LIMIT",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CUDA_MPS_")}
    env.update(extra)
    return env


# -- the driver ------------------------------------------------------------------------------
@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int | None


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> tuple[list[Gpu] | None, str]:
    """The GPUs NVML sees, or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML: {type(exc).__name__}"
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                minor = pynvml.nvmlDeviceGetMinorNumber(h)
            except pynvml.NVMLError:
                minor = None
            gpus.append(
                Gpu(
                    i,
                    _s(pynvml.nvmlDeviceGetUUID(h)),
                    _s(pynvml.nvmlDeviceGetName(h)),
                    pynvml.nvmlDeviceGetMemoryInfo(h).total // MIB,
                    minor,
                )
            )
    finally:
        pynvml.nvmlShutdown()
    return gpus, ""


def parse_smi_csv(text: str) -> list[tuple[str, str, int]]:
    """``nvidia-smi --query-gpu=uuid,name,memory.total --format=csv,noheader,nounits``."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            rows.append((parts[0], parts[1], int(parts[2])))
    return rows


def check_inventory(gpus: list[Gpu], clock: Clock) -> Row:
    name = "NVML inventory vs nvidia-smi"
    if shutil.which("nvidia-smi") is None:
        return Row(name, "skipped: nvidia-smi not found", f"NVML: {len(gpus)} GPU(s)")
    code, out = run_child(
        ["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"],
        clock.budget(30),
    )
    if code != 0:
        return Row(name, "error", "", f"nvidia-smi: {tail(out)}")
    smi = parse_smi_csv(out)
    figure = f"{len(gpus)} GPU(s): " + ", ".join(f"{g.name} {g.memory_mib} MiB" for g in gpus)
    problems = []
    if [g.uuid for g in gpus] != [s[0] for s in smi]:
        problems.append(
            f"UUIDs differ: NVML {[g.uuid for g in gpus]}, nvidia-smi {[s[0] for s in smi]}"
        )
    for g, s in zip(gpus, smi, strict=False):
        if g.name != s[1]:
            problems.append(f"GPU {g.index} name {g.name!r} vs {s[1]!r}")
        if abs(g.memory_mib - s[2]) > max(2, s[2] // 50):
            problems.append(f"GPU {g.index} memory {g.memory_mib} vs {s[2]} MiB")
    diff = [
        f"GPU {g.index}: NVML {g.memory_mib} / nvidia-smi {s[2]} MiB"
        for g, s in zip(gpus, smi, strict=False)
        if g.memory_mib != s[2]
    ]
    return Row(name, "FAIL" if problems else "pass", figure, "; ".join(problems or diff))


# -- memory caps: a 1/4 slice asks for 1/2 of the card ----------------------------------------
ALLOC = r"""
import sys, torch
n, fraction = int(sys.argv[1]), float(sys.argv[2])
if fraction:
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
try:
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("ALLOCATED", n >> 20, "MiB")
except Exception as exc:
    first = (str(exc).strip().splitlines() or [""])[0][:120]
    # A refusal is an out-of-memory error (PyTorch's cap, or the driver's under MPS,
    # HAMi or MIG); anything else (a bad setting, no CUDA) is not a refusal.
    oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in first.lower()
    print("REFUSED" if oom else "ERROR", type(exc).__name__, first)
"""


def alloc_half(gpu: Gpu, env: dict, clock: Clock, fraction: float = 0.0) -> tuple[str, str]:
    """('ALLOCATED'|'REFUSED'|'ERROR'|'crashed', detail) for 1/2 of ``gpu`` in a child."""
    half = gpu.memory_mib * MIB // 2
    code, out = run_child(
        [sys.executable, "-c", ALLOC, str(half), str(fraction)], clock.budget(90), env=env
    )
    for line in out.splitlines():
        if line.startswith(("ALLOCATED", "REFUSED", "ERROR")):
            word, _, detail = line.partition(" ")
            return word, detail
    return "crashed", f"exit {code}: {tail(out)}"


def capped(
    name: str, gpu: Gpu, env: dict, clock: Clock, fraction: float = 0.0, note: str = ""
) -> Row:
    outcome, detail = alloc_half(gpu, env, clock, fraction)
    figure = f"asked {gpu.memory_mib // 2} MiB, cap {gpu.memory_mib // 4} MiB"
    if outcome == "REFUSED":
        return Row(name, "pass", figure, "; ".join(filter(None, [f"refused: {detail}", note])))
    if outcome == "ALLOCATED":
        return Row(
            name, "FAIL", figure, "; ".join(filter(None, ["the 1/2 allocation succeeded", note]))
        )
    return Row(name, "error", figure, f"{outcome}: {detail}")


def check_memory_caps(gpus: list[Gpu], clock: Clock) -> list[Row]:
    gpu = gpus[0]
    visible = {"CUDA_VISIBLE_DEVICES": gpu.uuid}
    rows = []
    outcome, detail = alloc_half(gpu, clean_env(**visible), clock)
    rows.append(
        Row(
            "no cap (control): 1/2 of the card",
            "pass" if outcome == "ALLOCATED" else "FAIL",
            f"asked {gpu.memory_mib // 2} MiB",
            detail if outcome != "ALLOCATED" else "",
        )
    )
    rows.append(
        capped(
            "PyTorch cap: PYTORCH_CUDA_ALLOC_CONF (what gpulab sets)",
            gpu,
            clean_env(**visible, PYTORCH_CUDA_ALLOC_CONF="per_process_memory_fraction:0.25"),
            clock,
            note="cooperative: the user can unset it",
        )
    )
    rows.append(
        capped(
            "PyTorch cap: set_per_process_memory_fraction(0.25)",
            gpu,
            clean_env(**visible),
            clock,
            fraction=0.25,
            note="cooperative: code outside PyTorch's allocator is not held",
        )
    )
    rows += check_mps(gpu, clock)
    rows.append(check_hami(gpu, clock))
    rows.append(check_mig(gpu, clock))
    return rows


def mps_control(cmd: str, env: dict, timeout: float = 20) -> tuple[int | None, str]:
    return run_child(["sh", "-c", f"echo '{cmd}' | nvidia-cuda-mps-control"], timeout, env=env)


def check_mps(gpu: Gpu, clock: Clock) -> list[Row]:
    name = "MPS: pinned-memory limit set by the daemon (1/4)"
    if shutil.which("nvidia-cuda-mps-control") is None:
        return [Row(name, "n/a: nvidia-cuda-mps-control not installed")]
    quarter = gpu.memory_mib // 4
    pipe = tempfile.mkdtemp(prefix="gpulab-mps-")
    # The daemon sees every card in PCI order (device 0 = NVML's GPU 0); its clients see
    # only the slice's card, by UUID.
    daemon_env = clean_env(
        CUDA_MPS_PIPE_DIRECTORY=os.path.join(pipe, "pipe"),
        CUDA_MPS_LOG_DIRECTORY=os.path.join(pipe, "log"),
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
    )
    env = dict(daemon_env, CUDA_VISIBLE_DEVICES=gpu.uuid)
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    code, out = run_child(["nvidia-cuda-mps-control", "-d"], clock.budget(20), env=daemon_env)
    if code != 0:
        shutil.rmtree(pipe, ignore_errors=True)
        return [Row(name, "error", "", f"cannot start a private MPS daemon: {tail(out)}")]
    try:
        code, out = mps_control(
            f"set_default_device_pinned_mem_limit {gpu.index} {quarter}M", daemon_env
        )
        if code != 0 or "error" in out.lower() or "invalid" in out.lower():
            return [Row(name, "error", "", f"set_default_device_pinned_mem_limit: {tail(out)}")]
        rows = [capped(name, gpu, env, clock, note="held by the MPS server, not the client")]
        raised = dict(env, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={gpu.memory_mib}M")
        row = capped("MPS: the client raises its own limit", gpu, raised, clock)
        row.note = (
            "the user cannot undo the daemon's limit"
            if row.result == "pass"
            else "the client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT overrides the daemon: "
            "a user can undo it"
            if row.result == "FAIL"
            else row.note
        )
        rows.append(row)
        return rows
    finally:
        mps_control("quit", daemon_env)
        shutil.rmtree(pipe, ignore_errors=True)


def check_hami(gpu: Gpu, clock: Clock) -> Row:
    name = "HAMi-core libvgpu.so (1/4)"
    lib = os.environ.get("GPULAB_HAMI_LIB") or next(
        (p for p in HAMI_PATHS if os.path.exists(p)), None
    )
    if not lib or not os.path.exists(lib):
        return Row(name, "n/a: libvgpu.so not found", "", "set GPULAB_HAMI_LIB=/path/to/libvgpu.so")
    env = clean_env(
        CUDA_VISIBLE_DEVICES=gpu.uuid,
        LD_PRELOAD=lib,
        CUDA_DEVICE_MEMORY_LIMIT=f"{gpu.memory_mib // 4}m",
        CUDA_DEVICE_SM_LIMIT="25",
    )
    return capped(
        name,
        gpu,
        env,
        clock,
        note="LD_PRELOAD: held unless the user's process unsets it (/etc/ld.so.preload holds it)",
    )


def check_mig(gpu: Gpu, clock: Clock) -> Row:
    name = "MIG instance"
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        try:
            current, _ = pynvml.nvmlDeviceGetMigMode(h)
        except pynvml.NVMLError_NotSupported:
            return Row(name, f"n/a: {gpu.name} has no MIG")
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return Row(
                name,
                "n/a: MIG mode is off",
                "",
                "turning it on resets the card; gpu-check leaves it as it is",
            )
        migs = []
        for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except pynvml.NVMLError:
                continue
            migs.append(
                (pynvml.nvmlDeviceGetMemoryInfo(m).total // MIB, _s(pynvml.nvmlDeviceGetUUID(m)))
            )
    finally:
        pynvml.nvmlShutdown()
    if not migs:
        return Row(name, "n/a: MIG on, no instances made")
    mem, uuid = min(migs)
    outcome, detail = alloc_half(gpu, clean_env(CUDA_VISIBLE_DEVICES=uuid), clock)
    figure = f"instance {mem} MiB, asked {gpu.memory_mib // 2} MiB"
    result = {"REFUSED": "pass", "ALLOCATED": "FAIL"}.get(outcome, "error")
    return Row(name, result, figure, "held by the hardware" if result == "pass" else detail)


# -- the device cgroup ------------------------------------------------------------------------
OPEN_NODES = r"""
import errno, json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        seen[path] = "opened"
    except OSError as exc:
        seen[path] = errno.errorcode.get(exc.errno, str(exc.errno))
try:
    import torch
    count = torch.cuda.device_count()
except Exception as exc:
    count = f"{type(exc).__name__}"
print("NODES", json.dumps({"open": seen, "cuda_devices": count}))
"""


def _in_group(group, argv: list[str], clock: Clock, env: dict) -> dict | str:
    argv, kwargs = group.launch(argv)
    code, out = run_child(argv, clock.budget(60), env, **kwargs)
    if code is None:
        return "timed out"
    for line in out.splitlines():
        if line.startswith("NODES "):
            return json.loads(line[6:])
    return tail(out)


def check_device_cgroup(gpus: list[Gpu], clock: Clock) -> list[Row]:
    from gpulab.enforcement.cgroups import Cgroups
    from gpulab.enforcement.limits import Limits

    hides, none = (
        "device cgroup hides other cards",
        "device cgroup: a group without GPU opens no card",
    )
    cg = Cgroups.detect()
    if cg.kind == "none" or (cg.kind == "cgroup2"):
        why = (
            cg.describe() if cg.kind == "none" else "cgroup v2 without systemd holds no device rule"
        )
        return [Row(hides, f"skipped: {why}"), Row(none, f"skipped: {why}")]
    nodes = [f"/dev/nvidia{g.minor}" for g in gpus if g.minor is not None]
    env = clean_env()
    rows = []
    tag = f"gpu-check-{os.getpid()}"
    if len(gpus) < 2:
        rows.append(Row(hides, "n/a: one GPU"))
    else:
        group = cg.create(f"{tag}/one-card", Limits(None, None, (nodes[0],)))
        try:
            seen = _in_group(group, [sys.executable, "-c", OPEN_NODES, *nodes], clock, env)
        finally:
            group.remove()
        if isinstance(seen, str):
            rows.append(Row(hides, "error", "", seen))
        else:
            ok = seen["open"][nodes[0]] == "opened" and all(
                seen["open"][n] == "EPERM" for n in nodes[1:]
            )
            rows.append(
                Row(
                    hides,
                    "pass" if ok else "FAIL",
                    f"CUDA sees {seen['cuda_devices']} of {len(gpus)}",
                    f"{cg.label}; " + ", ".join(f"{k}: {v}" for k, v in seen["open"].items()),
                )
            )
    group = cg.create(f"{tag}/no-gpu", Limits(None, None, ()))
    try:
        seen = _in_group(group, [sys.executable, "-c", OPEN_NODES, *nodes], clock, env)
    finally:
        group.remove()
    if isinstance(seen, str):
        rows.append(Row(none, "error", "", seen))
    else:
        ok = all(v == "EPERM" for v in seen["open"].values()) and seen["cuda_devices"] in (
            0,
            "RuntimeError",
        )
        rows.append(
            Row(
                none,
                "pass" if ok else "FAIL",
                f"CUDA sees {seen['cuda_devices']}",
                f"{cg.label}; " + ", ".join(f"{k}: {v}" for k, v in seen["open"].items()),
            )
        )
    return rows


# -- a 2-rank NCCL job ------------------------------------------------------------------------
ALLREDUCE = r"""
import json, os, time, torch, torch.distributed as dist
cuda = os.environ.get("GPULAB_CHECK_CPU") != "1"
rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
if cuda:
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
dist.init_process_group("nccl" if cuda else "gloo")
size = int(os.environ.get("GPULAB_CHECK_BYTES", 64 << 20))
buf = torch.ones(size // 4, dtype=torch.float32, device=device)
for _ in range(3):
    dist.all_reduce(buf)
if cuda:
    torch.cuda.synchronize()
iters = 10
dist.barrier()
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(buf)
if cuda:
    torch.cuda.synchronize()
seconds = (time.perf_counter() - t0) / iters
check = torch.full((4,), float(rank + 1), device=device)
dist.all_reduce(check)
ok = bool((check == sum(range(1, dist.get_world_size() + 1))).all())
if rank == 0:
    print("ALLREDUCE", json.dumps({"bytes": size, "seconds": seconds, "ok": ok,
                                    "backend": dist.get_backend(),
                                    "devices": torch.cuda.device_count() if cuda else 0}))
dist.destroy_process_group()
"""


def check_nccl(gpus: list[Gpu], clock: Clock, cpu: bool = False) -> Row:
    name = (
        "NCCL all_reduce, 2 ranks (torchrun)" if not cpu else "gloo all_reduce, 2 ranks (torchrun)"
    )
    with tempfile.TemporaryDirectory(prefix="gpulab-check-") as tmp:
        script = os.path.join(tmp, "allreduce.py")
        with open(script, "w") as f:
            f.write(ALLREDUCE)
        extra = {"GPULAB_CHECK_CPU": "1", "GPULAB_CHECK_BYTES": str(4 << 20)} if cpu else {}
        env = clean_env(NCCL_DEBUG="WARN", OMP_NUM_THREADS="1", **extra)
        code, out = run_child(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                script,
            ],
            clock.budget(150),
            env=env,
        )
    for line in out.splitlines():
        if line.startswith("ALLREDUCE "):
            r = json.loads(line[10:])
            busbw = r["bytes"] / r["seconds"] * 2 * (2 - 1) / 2 / 1e9  # algbw * 2(n-1)/n, n=2
            where = (
                "one card" if (not cpu and len(gpus) < 2) else "one card each" if not cpu else "CPU"
            )
            return Row(
                name,
                "pass" if r["ok"] else "FAIL",
                f"{r['bytes'] >> 20} MiB in {r['seconds'] * 1e3:.2f} ms ({busbw:.1f} GB/s busbw)",
                f"{r['backend']}, ranks on {where}" + ("" if r["ok"] else "; wrong sum"),
            )
    if not cpu and len(gpus) < 2 and "Duplicate GPU" in out:
        return Row(
            name,
            "n/a: one GPU",
            "",
            "NCCL refuses two ranks on one card (a 2-rank job needs its ranks on different cards)",
        )
    return Row(name, "error", "", f"exit {code}: {tail(out)}")


# -- fp8 quantization -------------------------------------------------------------------------
QUANTIZE = r"""
import json, sys, torch
from gpulab.serving.quantize import QuantizeError, quantize
torch.manual_seed(0)
device = sys.argv[2]
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).eval().to(device)
if device == "cuda":
    model = model.to(torch.bfloat16)
x = torch.randn(32, 1024, device=device, dtype=next(model.parameters()).dtype)
try:
    r = quantize(model, sys.argv[1], example=x, runs=20)
except QuantizeError as exc:
    print("QUANTIZE", json.dumps({"skipped": str(exc)}))
else:
    print("QUANTIZE", json.dumps({"engine": r.engine, "size_ratio": r.size_ratio, "speedup": r.speedup,
                                  "relative_error": r.relative_error, "device": r.device}))
"""


def check_quantize(scheme: str, clock: Clock, device: str = "cuda") -> Row:
    name = f"quantize {scheme} (MLP 1024-4096-1024)"
    code, out = run_child(
        [sys.executable, "-c", QUANTIZE, scheme, device], clock.budget(150), env=clean_env()
    )
    for line in out.splitlines():
        if line.startswith("QUANTIZE "):
            r = json.loads(line[9:])
            if "skipped" in r:
                return Row(name, f"skipped: {r['skipped'][:100]}")
            ok = r["relative_error"] < 0.15 and r["size_ratio"] > 1.2
            return Row(
                name,
                "pass" if ok else "FAIL",
                f"{r['size_ratio']:.2f}x smaller, {r['speedup']:.2f}x faster, "
                f"rel. error {r['relative_error']:.4f}",
                f"{r['engine']} on {r['device']}",
            )
    return Row(name, "error", "", f"exit {code}: {tail(out)}")


# -- a replica on a slice ---------------------------------------------------------------------
EXPORT = r"""
import sys, torch
from gpulab.serving.export import export_model
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
card = export_model(model, torch.randn(2, 16), sys.argv[1], name="gpucheck")
print("EXPORTED", card.name, card.inputs[0].name)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, token: str, body: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url,
        data=data,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def gpu_processes(gpu: Gpu) -> dict[int, int]:
    """pid -> MiB of the compute processes on ``gpu`` (NVML)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        return {
            p.pid: (p.usedGpuMemory or 0) // MIB
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        }
    except pynvml.NVMLError:
        return {}
    finally:
        pynvml.nvmlShutdown()


def check_replica(gpus: list[Gpu], clock: Clock, cpu: bool = False) -> Row:
    from gpulab.enforcement.cgroups import Cgroups
    from gpulab.enforcement.limits import GIB, limits_for_slice

    name = "replica on a 1/4 slice (OIP v2 infer)"
    tmp = tempfile.mkdtemp(prefix="gpulab-check-")
    model_dir = os.path.join(tmp, "model")
    code, out = run_child(
        [sys.executable, "-c", EXPORT, model_dir], clock.budget(120), env=clean_env()
    )
    exported = [ln.split() for ln in out.splitlines() if ln.startswith("EXPORTED ")]
    if code != 0 or not exported:
        shutil.rmtree(tmp, ignore_errors=True)
        return Row(name, "error", "", f"export: {tail(out)}")
    _, model, input_name = exported[0]
    token, port = "gpu-check-token", _free_port()
    # As backend/local_serving.py starts a replica: the slice's card and memory fraction.
    env = clean_env(
        HOME=tmp,
        PYTHONUNBUFFERED="1",
        GPULAB_SERVING_TOKEN=token,
        CUDA_VISIBLE_DEVICES="" if cpu else gpus[0].uuid,
    )
    if not cpu:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "per_process_memory_fraction:0.25"
    argv = [
        sys.executable,
        "-m",
        "gpulab.serving.server",
        "--model-dir",
        model_dir,
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-batch-size",
        "8",
        "--max-latency-ms",
        "2",
        "--max-queue",
        "64",
    ]
    cg = Cgroups.detect()
    gpu_devices = (
        None if cpu else tuple(f"/dev/nvidia{g.minor}" for g in gpus[:1] if g.minor is not None)
    )
    limits = limits_for_slice(250, cpu_per_gpu=4, memory_per_gpu=32 * GIB, gpu_devices=gpu_devices)
    group = cg.create(f"gpu-check-{os.getpid()}/replica", limits)
    argv, kwargs = group.launch(argv)
    log = open(os.path.join(tmp, "replica.log"), "w+")  # noqa: SIM115
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=tmp,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **kwargs,
    )
    base = f"http://127.0.0.1:{port}/v2"
    try:
        deadline = time.monotonic() + clock.budget(90)
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if _http(f"{base}/health/ready", token, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            log.seek(0)
            return Row(name, "error", "", f"not ready (exit {proc.poll()}): {tail(log.read())}")
        body = {
            "inputs": [
                {"name": input_name, "shape": [2, 16], "datatype": "FP32", "data": [0.5] * 32}
            ]
        }
        t0 = time.perf_counter()
        status, doc = _http(f"{base}/models/{model}/infer", token, body)
        ms = (time.perf_counter() - t0) * 1e3
        shape = doc.get("outputs", [{}])[0].get("shape")
        on_gpu = "" if cpu else gpu_processes(gpus[0]).get(proc.pid)
        where = (
            "CPU"
            if cpu
            else f"CUDA context {on_gpu} MiB"
            if on_gpu is not None
            else "no CUDA context: the server computes on CPU"
        )
        ok = status == 200 and shape == [2, 4]
        return Row(
            name,
            "pass" if ok else "FAIL",
            f"one call {ms:.1f} ms",
            f"{group.describe()}; {where}" + ("" if ok else f"; HTTP {status}, shape {shape}"),
        )
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        group.remove()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


LLM_ROW = "OpenAI gateway vs vllm serve alone, 16 streams"


def check_llm_gateway(clock: Clock) -> Row:
    """The gateway against vLLM's own server, same model and memory share (goal: the
    gateway's tokens/s at least 0.9x)."""
    if importlib.util.find_spec("vllm") is None:
        return Row(LLM_ROW, "skipped: vLLM not installed", "", "pip install vllm to compare")
    out_json = os.path.join(tempfile.mkdtemp(prefix="gpulab-check-llm-"), "llm.json")
    script = os.path.join(ROOT, "benchmarks", "llm_serving.py")
    argv = [sys.executable, script, "--only", "gateway,vllm-serve", "--real-gpus"]
    code, out = run_child([*argv, "--json", out_json], clock.budget(420), env=clean_env())
    try:
        with open(out_json) as f:
            results = json.load(f)["results"]
    except (OSError, ValueError, KeyError):
        return Row(LLM_ROW, "error", "", f"exit {code}: {tail(out)}")
    finally:
        shutil.rmtree(os.path.dirname(out_json), ignore_errors=True)
    gateway, alone = results.get("gateway"), results.get("vllm-serve")
    if not isinstance(gateway, dict) or not isinstance(alone, dict):
        why = gateway if isinstance(gateway, str) else alone
        return Row(LLM_ROW, "error", "", str(why)[:200])
    ratio = gateway["tok_s"] / alone["tok_s"]
    return Row(
        LLM_ROW,
        "pass" if ratio >= 0.9 else "FAIL",
        f"{gateway['tok_s']:.0f} vs {alone['tok_s']:.0f} tokens/s ({ratio:.2f}x)",
        "goal >= 0.9x; the replica's engine is what %deploy --list says",
    )


# -- the table --------------------------------------------------------------------------------
CHECKS = ("inventory", "memory", "devices", "nccl", "quantize", "replica", "llm")
ROW_NAMES = {
    "inventory": ["NVML inventory vs nvidia-smi"],
    "memory": ["memory caps: a 1/4 slice asks for 1/2 of the card"],
    "devices": [
        "device cgroup hides other cards",
        "device cgroup: a group without GPU opens no card",
    ],
    "nccl": ["NCCL all_reduce, 2 ranks (torchrun)"],
    "quantize": ["quantize fp8-dynamic", "quantize fp8-weight"],
    "replica": ["replica on a 1/4 slice (OIP v2 infer)"],
    "llm": [LLM_ROW],
}


def torch_without_cuda(clock: Clock) -> str:
    """Why this Python's torch cannot use the GPU, or "" when it can."""
    code, out = run_child(
        [
            sys.executable,
            "-c",
            "import torch; print('TORCH', torch.__version__, torch.cuda.is_available())",
        ],
        clock.budget(60),
        env=clean_env(),
    )
    found = [ln.split() for ln in out.splitlines() if ln.startswith("TORCH ")]
    if not found:
        return f"torch does not import: {tail(out)}"
    _, version, available = found[0]
    return "" if available == "True" else f"torch {version} here has no CUDA (a CPU build?)"


def table(rows: list[Row]) -> str:
    lines = ["| check | result | figure | note |", "|---|---|---|---|"]
    lines += [f"| {r.check} | {r.result} | {r.figure} | {r.note} |" for r in rows]
    return "\n".join(lines)


def run_checks(only: list[str], clock: Clock, plumbing: bool) -> list[Row]:
    rows: list[Row] = []
    if plumbing:
        # The checks' own machinery on CPU: torchrun, the quantizer, a replica.
        steps = {
            "nccl": lambda: [check_nccl([], clock, cpu=True)],
            "quantize": lambda: [check_quantize("int8-dynamic", clock, device="cpu")],
            "replica": lambda: [check_replica([], clock, cpu=True)],
        }
    else:
        gpus, why = nvml_gpus()
        if not gpus:
            note = why or "NVML sees no GPU"
            if shutil.which("nvidia-smi") is None:
                note += "; nvidia-smi not found"
            return [Row(n, NO_DRIVER, "", note) for c in only for n in ROW_NAMES[c]]
        no_cuda = torch_without_cuda(clock)
        if no_cuda:
            for check in ("memory", "nccl", "quantize"):
                if check in only:
                    rows += [Row(n, f"skipped: {no_cuda}") for n in ROW_NAMES[check]]
            only = [c for c in only if c not in ("memory", "nccl", "quantize")]
        steps = {
            "inventory": lambda: [check_inventory(gpus, clock)],
            "memory": lambda: check_memory_caps(gpus, clock),
            "devices": lambda: check_device_cgroup(gpus, clock),
            "nccl": lambda: [check_nccl(gpus, clock)],
            "quantize": lambda: [
                check_quantize("fp8-dynamic", clock),
                check_quantize("fp8-weight", clock),
            ],
            "replica": lambda: [check_replica(gpus, clock)],
            "llm": lambda: [check_llm_gateway(clock)],
        }
    for check in only:
        if check not in steps:
            continue
        if clock.out:
            rows += [Row(n, "skipped: out of time (--deadline)") for n in ROW_NAMES[check]]
            continue
        started = time.monotonic()
        try:
            made = steps[check]()
        except Exception as exc:  # one broken check must not hide the others
            made = [Row(ROW_NAMES[check][0], "error", "", f"{type(exc).__name__}: {exc}"[:200])]
        for row in made:
            print(
                f"[gpu-check] {row.check}: {row.result} ({time.monotonic() - started:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
        rows += made
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--deadline",
        type=float,
        default=450,
        help="seconds for the whole run; each check gets what is left (default 450)",
    )
    parser.add_argument(
        "--only",
        default=",".join(CHECKS),
        help=f"comma-separated checks to run, of {','.join(CHECKS)}",
    )
    parser.add_argument(
        "--plumbing",
        action="store_true",
        help="run the checks' machinery on CPU (gloo, int8, a CPU replica): tests the script",
    )
    args = parser.parse_args(argv)
    only = [c for c in args.only.split(",") if c]
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        parser.error(f"unknown checks {unknown}; choose from {', '.join(CHECKS)}")
    ensure_gpulab_importable()
    rows = run_checks(only, Clock(args.deadline), args.plumbing)
    print(table(rows), flush=True)
    bad = [r for r in rows if r.result in ("FAIL", "error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
