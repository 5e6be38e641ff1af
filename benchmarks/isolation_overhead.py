"""What separating users costs: per-user accounts against one account, side by side.

Two `gpulab up` hubs on this machine, run as root, the same in all but one
setting: the first gives every user a Unix account of their own (the default
as root: `useradd` on first use, servers, ranks and replicas started as that
account inside a cgroup); the anchor sets `c.UserAccounts.enabled = False`,
so everything runs as the hub's own account. Rounds alternate between hubs so
drift on a shared machine hits both alike.

- spawn-to-ready: N new users spawn a 1/4 GPU server at once, from the POST to
  the hub reporting the server ready (a new user each time, so every spawn
  includes making the account);
- job start: a 1-rank CPU job, from the POST to its rank's first line of
  output (its cell prints the time it started).

    python benchmarks/isolation_overhead.py [--users 5] [--jobs 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _hub import RunningHub, percentile
from spawn_ready import spawn_all

ONE_ACCOUNT = "c.UserAccounts.enabled = False\n"
CELL = "import time\nprint('STARTED', time.time(), flush=True)\n"


def job_start(hub: RunningHub, token: str) -> float:
    t0 = time.time()
    job = hub.gpulab("POST", "/jobs", token=token, json={"code": CELL, "name": "start"}).json()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for line in hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=token).text.splitlines():
            if "STARTED " in line:
                return float(line.split("STARTED ", 1)[1]) - t0
        time.sleep(0.05)
    raise RuntimeError(f"job {job['id']} never started:\n{hub.log_tail()}")


def table(title: str, results: dict[str, list[float]]) -> float:
    print(title)
    print(f"{'':36}{'median':>8}{'p90':>8}{'max':>8}")
    for name, label in (("accounts", "per-user accounts"), ("one", "one account (anchor)")):
        t = results[name]
        print(f"{label:36}{statistics.median(t):8.2f}{percentile(t, 90):8.2f}{max(t):8.2f}")
    return statistics.median(results["accounts"]) - statistics.median(results["one"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=5)
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: per-user accounts need it")
    spawn = {"accounts": [], "one": []}
    start = {"accounts": [], "one": []}
    stamp = int(time.time()) % 100000
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        hubs = {
            "accounts": RunningHub(tmp / "accounts", simulate="4xA100-80GB"),
            "one": RunningHub(tmp / "one", simulate="4xA100-80GB", config=ONE_ACCOUNT),
        }
        try:
            tokens = {name: hub.create_user("bench") for name, hub in hubs.items()}
            for r in range(args.rounds):
                for name, hub in hubs.items():
                    users = [f"b{stamp}{name[0]}{r}x{i}" for i in range(args.users)]
                    spawn[name] += spawn_all(hub, users, {"gpu_milli": 250})
                    start[name] += [job_start(hub, tokens[name]) for _ in range(args.jobs)]
        finally:
            for hub in hubs.values():
                hub.stop()
    table(f"spawn-to-ready, {args.users} new users at once, {args.rounds} rounds (seconds)", spawn)
    ratio = statistics.median(spawn["accounts"]) / statistics.median(spawn["one"])
    print(f"ratio accounts/anchor (median): {ratio:.2f}x\n")
    extra = table(
        f"job start, POST to the rank's first line, {args.jobs} jobs x "
        f"{args.rounds} rounds (seconds)",
        start,
    )
    print(f"as the user minus as the service (median): {extra:+.2f} s")


if __name__ == "__main__":
    main()
