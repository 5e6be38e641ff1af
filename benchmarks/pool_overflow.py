"""A job that overflows to the Slurm pool against one on the box: submit -> first step.

The site is the one ``gpulab slurm-sandbox up --hybrid`` writes: two pools, the box
(this machine, simulated GPUs) first and a 2-node Slurm sandbox second. The service
is the real one, in this process (``tests/support/service.py``), running as root, so
the jobs run as the user's own Unix account. Each measured job is the same small
training job (1 rank, a quarter GPU, no ``pool`` or ``backend``: the site's ``auto``):

- box: the box is empty, so ``auto`` places the job there (local torchrun);
- overflow: a filler job (``"pool": "box"``) holds every box GPU, so ``auto`` finds
  no room on the box and sends the job to the Slurm pool (sbatch, srun, torchrun).

Time to first step is from just before ``POST /jobs`` to the time stamp of the
rank's first ``report()`` record (``GET /jobs/{id}/metrics``): the queue, the choice
of pool, the backend's start and the rank's imports and rendezvous. The two kinds
alternate round by round so drift on a shared machine hits both alike; one warm-up
job on each pool (the account's creation, cold imports) is not counted. Prints both
medians, the ratio overflow / box and the difference (goal: overflow adds <= 5 s).

Needs root, Debian's slurm-wlm + munge, and a service with pools
(``c.InventorySettings.pools``); without them it says so and measures nothing.

    .venv/bin/python benchmarks/pool_overflow.py [--rounds 5] [--box-gpus 1xA100-80GB] [--quick]
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
from datetime import datetime
from pathlib import Path

from gpulab.backend import slurm_sandbox
from gpulab.hub_ext.slurm_cli import config_text

# The in-process service is a test helper (a fake hub API beside the real service).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from support.service import running_service  # noqa: E402

#: The measured job: the rank's first report() is the first step.
WORKLOAD = """
import torch
from gpulab.training import setup, report
ctx = setup()
model = ctx.wrap(torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    report(loss=loss.item(), samples=32)
"""
#: Holds the box's GPUs until it is cancelled.
FILLER = """
import time
while True:
    time.sleep(1)
"""
TERMINAL = ("succeeded", "failed", "cancelled")
GOAL_S = 5.0


class Bench:
    def __init__(self, svc, token: str, box_gpus: int):
        self.svc, self.token, self.box_gpus = svc, token, box_gpus

    async def call(self, method: str, path: str, **kw) -> dict:
        r = await self.svc.request(method, path, self.token, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:500]}")
        return r.json() if r.content else {}

    async def wait(self, job_id: str, states, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while (job := await self.call("GET", f"/jobs/{job_id}"))["state"] not in states:
            if time.monotonic() > deadline:
                logs = (await self.svc.request("GET", f"/jobs/{job_id}/logs", self.token)).text
                raise RuntimeError(f"job {job_id} not {states} after {timeout}s:\n{logs[-2000:]}")
            await asyncio.sleep(0.1)
        return job

    async def box_free_milli(self) -> int:
        pools = {p["name"]: p for p in (await self.call("GET", "/pools"))["pools"]}
        return sum(f["milli"] * f.get("count", 1) for f in pools["box"].get("free", []))

    async def fill_box(self) -> str:
        job = await self.call(
            "POST",
            "/jobs",
            json={
                "code": FILLER,
                "pool": "box",
                "nodes": 1,
                "nproc_per_node": self.box_gpus,
                "gpu_milli": 1000,
            },
        )
        await self.wait(job["id"], ("running", *TERMINAL))
        return job["id"]

    async def empty_box(self, filler: str) -> None:
        await self.call("DELETE", f"/jobs/{filler}")
        await self.wait(filler, TERMINAL)
        deadline = time.monotonic() + 60
        while await self.box_free_milli() < 1000 * self.box_gpus:
            if time.monotonic() > deadline:
                raise RuntimeError("the box's slices were not freed 60 s after its filler ended")
            await asyncio.sleep(0.1)

    async def first_step(self, want_pool: str) -> dict:
        """One measured job: seconds from submit to its first report(), and where it ran."""
        body = {"code": WORKLOAD, "nodes": 1, "nproc_per_node": 1, "gpu_milli": 250}
        t0 = time.time()
        job = await self.call("POST", "/jobs", json=body)
        deadline = time.monotonic() + 300
        while not (records := (await self.call("GET", f"/jobs/{job['id']}/metrics"))["records"]):
            state = (await self.call("GET", f"/jobs/{job['id']}"))["state"]
            if state in TERMINAL or time.monotonic() > deadline:
                done = await self.wait(job["id"], TERMINAL, timeout=5)
                raise RuntimeError(f"job {job['id']} reported no step: {done.get('message')}")
            await asyncio.sleep(0.05)
        # While it runs the job says where it went and why (at the end: "succeeded").
        why = (await self.call("GET", f"/jobs/{job['id']}")).get("message", "")
        done = await self.wait(job["id"], TERMINAL)
        if done["state"] != "succeeded":
            raise RuntimeError(f"job {job['id']} {done['state']}: {done.get('message')}")
        if done.get("pool") != want_pool:
            raise RuntimeError(
                f"job {job['id']} ran on pool {done.get('pool')!r}, not {want_pool!r}: "
                f"{done.get('message')}"
            )
        started = done.get("started")
        return {
            "pool": done["pool"],
            "first_step_s": round(records[0]["time"] - t0, 3),
            # From submit to the service's start of the backend (queue, choice of pool,
            # sbatch): the rest of first_step_s is the backend's and the rank's.
            "started_s": round(datetime.fromisoformat(started).timestamp() - t0, 3)
            if started
            else None,
            "slurm_job_id": done.get("slurm_job_id"),
            "message": why,
        }

    async def overflow(self) -> dict:
        filler = await self.fill_box()
        try:
            return await self.first_step("slurm")
        finally:
            await self.empty_box(filler)


async def bench(args, tmp: Path, state: dict) -> dict | None:
    config = config_text(state, hybrid=True)
    async with running_service(tmp / "service", config, simulate=args.box_gpus) as svc:
        r = await svc.request("GET", "/pools")
        names = [p["name"] for p in r.json().get("pools", [])] if r.status_code == 200 else []
        if names != ["box", "slurm"]:
            print(
                f"this service has no pools box, slurm (GET /pools: {r.status_code} "
                f"{r.text[:200]}): c.InventorySettings.pools is not built yet; nothing measured",
                file=sys.stderr,
            )
            return None
        box_gpus = sum(int(part.split("x", 1)[0]) for part in args.box_gpus.split(","))
        b = Bench(svc, svc.create_user("alice"), box_gpus)
        warm = {"box": await b.first_step("box"), "slurm": await b.overflow()}
        print(f"warm-up (not counted): {json.dumps(warm)}", flush=True)
        results: dict[str, list] = {"box": [], "overflow": []}
        for i in range(args.rounds):
            # Alternate which goes first, so a trend in the machine's load hits both.
            kinds = ("box", "overflow") if i % 2 == 0 else ("overflow", "box")
            for kind in kinds:
                run = b.first_step("box") if kind == "box" else b.overflow()
                results[kind].append(await run)
            print(
                f"round {i + 1}: box {results['box'][-1]['first_step_s']:.2f} s, "
                f"overflow {results['overflow'][-1]['first_step_s']:.2f} s",
                flush=True,
            )
        return results


def table(results: dict) -> str:
    rows = [
        f"{'job':9s} {'round':>5s} {'pool':6s} {'first step s':>13s} {'started s':>10s}  slurm job"
    ]
    for kind in ("box", "overflow"):
        for i, r in enumerate(results[kind]):
            started = "-" if r["started_s"] is None else f"{r['started_s']:.2f}"
            rows.append(
                f"{kind:9s} {i + 1:5d} {r['pool']:6s} {r['first_step_s']:13.2f} {started:>10s}  "
                f"{r['slurm_job_id'] or '-'}"
            )
    box = statistics.median(r["first_step_s"] for r in results["box"])
    over = statistics.median(r["first_step_s"] for r in results["overflow"])
    verdict = "within" if over - box <= GOAL_S else "over"
    rows += [
        f"median time to first step: box {box:.2f} s, overflow to slurm {over:.2f} s",
        f"overflow / box = {over / box:.2f}x; overflow adds {over - box:+.2f} s "
        f"({verdict} the goal of <= {GOAL_S:.0f} s)",
    ]
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="measured jobs of each kind")
    p.add_argument("--box-gpus", default="1xA100-80GB", help="the box's simulated GPUs")
    p.add_argument("--quick", action="store_true", help="1 round (the test's run)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    if os.geteuid() != 0 or not shutil.which("slurmctld") or not shutil.which("munged"):
        print("needs root and Debian's slurm-wlm + munge for the sandbox", file=sys.stderr)
        return 2
    # /var/tmp, 0755: the jobs run as the user's account, which must reach the munge
    # socket, slurm.conf and its job dirs (/tmp's pytest dirs are 0700).
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-overflow-", dir="/var/tmp"))
    os.chmod(tmp, 0o755)
    sandbox = tmp / "slurm"
    try:
        state = slurm_sandbox.start(sandbox, nodes=2, gpus_spec="gpu:2,shard:40")
        results = asyncio.run(bench(args, tmp, state))
    finally:
        slurm_sandbox.stop(sandbox)
        shutil.rmtree(tmp, ignore_errors=True)
    if results is None:
        return 2
    print(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
