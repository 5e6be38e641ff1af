"""The Slurm backend against the local backend: time to first step, step time.

The same small training job (an MLP, 2 nodes x 1 rank, gloo on CPU here) runs
through :class:`gpulab.backend.local.LocalBackend` (two torchrun agents on this
machine) and :class:`gpulab.backend.slurm.SlurmBackend` (one ``sbatch``
allocation on a 2-node Slurm sandbox: ``srun`` -> launcher -> torchrun per node,
each node a network namespace of this machine). Rank 0 appends each step's
wall-clock time to a file, so both are timed by the same code:

- time to first step: from ``backend.start()`` to the end of step 0 (for Slurm:
  sbatch, scheduling, srun, the launchers, torchrun's rendezvous, imports);
- step time: mean step-to-step interval after the first 10 steps.

Runs alternate (``--rounds``) so drift on a shared machine hits both alike. Prints
a table and the ratios Slurm / local (aim: step time <= 1.05x). Needs root and
Debian's slurm-wlm + munge; starts its own sandbox unless ``--slurm-conf`` names one.

    python benchmarks/slurm_overhead.py [--rounds 3] [--steps 150] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _workload import WORKLOAD, step_times

from gpulab.backend import slurm_sandbox
from gpulab.backend.local import LocalBackend
from gpulab.backend.slurm import SlurmBackend
from gpulab.backend.slurm_site import SlurmSite
from gpulab.backend.spec import JobSpec


def summarise(t0: float, times_file: Path) -> dict:
    stamps, gaps = step_times(times_file)
    return {
        "first_step_s": round(stamps[0] - t0, 3),
        "step_ms": round(1000 * statistics.mean(gaps), 2),
        "steps": len(stamps),
    }


async def run_job(backend, steps: int, tmp: Path) -> dict:
    times = tmp / f"times-{uuid.uuid4().hex[:6]}.txt"
    spec = JobSpec(
        code=WORKLOAD,
        nodes=2,
        nproc_per_node=1,
        backend=backend.name,
        env={"BENCH_TIMES": str(times), "BENCH_STEPS": str(steps)},
    )
    spec.id, spec.user = uuid.uuid4().hex[:12], "bench"
    spec.validate()
    jd = backend.jobdir(spec.id)
    os.makedirs(jd.path)
    spec.checkpoint_dir = jd.p("checkpoints")
    jd.write_inputs(spec)
    t0 = time.time()
    await backend.start(spec, [])
    deadline = time.monotonic() + 900
    while (status := await backend.poll(spec)).state == "running":
        if time.monotonic() > deadline:
            await backend.cancel(spec)
            raise RuntimeError(f"{backend.name} job {spec.id} did not end")
        await asyncio.sleep(0.2)
    if status.state != "succeeded":
        raise RuntimeError(f"{backend.name} job failed: {status.message}")
    return summarise(t0, times)


def table(results: dict) -> str:
    rows = [f"{'backend':8s} {'round':>5s} {'first step s':>13s} {'step ms':>9s} {'steps':>6s}"]
    for name in ("local", "slurm"):
        for i, r in enumerate(results[name]):
            rows.append(
                f"{name:8s} {i + 1:5d} {r['first_step_s']:13.2f} {r['step_ms']:9.2f} "
                f"{r['steps']:6d}"
            )
    for metric, label in (("first_step_s", "time to first step"), ("step_ms", "step time")):
        paired = [
            s[metric] / lo[metric] for s, lo in zip(results["slurm"], results["local"], strict=True)
        ]
        best = min(r[metric] for r in results["slurm"]) / min(r[metric] for r in results["local"])
        aim = "  (aim <= 1.05)" if metric == "step_ms" else ""
        rows.append(
            f"{label:18s} slurm/local = {best:.3f} best-of-{len(paired)}, "
            f"{statistics.median(paired):.3f} median of paired rounds{aim}"
        )
    return "\n".join(rows)


async def bench(args, tmp: Path, slurm_conf: str) -> dict:
    jobs = tmp / "jobs"
    jobs.mkdir()
    local = LocalBackend(str(jobs))
    slurm = SlurmBackend(str(jobs), site=SlurmSite(slurm_conf=slurm_conf))
    results: dict[str, list] = {"local": [], "slurm": []}
    for i in range(args.rounds):
        # Alternate which goes first, so a trend in the machine's load hits both.
        order = (local, slurm) if i % 2 == 0 else (slurm, local)
        for backend in order:
            results[backend.name].append(await run_job(backend, args.steps, tmp))
        print(
            f"round {i + 1}: local {results['local'][-1]}  slurm {results['slurm'][-1]}",
            flush=True,
        )
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--quick", action="store_true", help="1 round of 25 steps (the test's run)")
    p.add_argument("--slurm-conf", help="an existing Slurm (2+ nodes) instead of a sandbox")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 1, 25
    if not args.slurm_conf and (os.geteuid() != 0 or not shutil.which("slurmctld")):
        print("needs root and slurm-wlm + munge for the sandbox", file=sys.stderr)
        return 2
    # Users' accounts are not involved: both backends run the ranks as this process.
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-slurm-bench-", dir="/var/tmp"))
    os.chmod(tmp, 0o755)
    sandbox = tmp / "sandbox"
    try:
        conf = args.slurm_conf
        if not conf:
            slurm_sandbox.start(sandbox, nodes=2, gpus_spec="")
            conf = slurm_sandbox.env(sandbox)["SLURM_CONF"]
        results = asyncio.run(bench(args, tmp, conf))
    finally:
        if not args.slurm_conf:
            slurm_sandbox.stop(sandbox)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
