"""Spawn-to-ready time for 10 users: gpulab's spawner against a plain hub.

Both hubs are `gpulab up` on this machine with the same proxy, single-user
command and JupyterLab; the anchor swaps in JupyterHub's
SimpleLocalProcessSpawner (no slice: no allocation, no availability check, no
enforcement environment). 10 users spawn at once through the REST API; time is
from the POST to the hub reporting the server ready. Hubs alternate for
--rounds rounds, so drift on a shared machine hits both alike.

    python benchmarks/spawn_ready.py [--users 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _hub import RunningHub, percentile

PLAIN = (
    'c.JupyterHub.spawner_class = "simple"\n'
    'c.SimpleLocalProcessSpawner.home_dir_template = "{home}/{{username}}"\n'
)


def spawn_all(hub: RunningHub, users: list[str], options: dict) -> list[float]:
    for u in users:
        hub.hub_api("POST", f"/users/{u}")

    def one(u):
        t0 = time.perf_counter()
        r = hub.spawn(u, options)
        r.raise_for_status()
        hub.wait_server(u)
        return time.perf_counter() - t0

    with ThreadPoolExecutor(len(users)) as pool:
        times = list(pool.map(one, users))
    for u in users:
        hub.hub_api("DELETE", f"/users/{u}/server")
    for u in users:
        hub.wait_server(u, ready=False)
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    results: dict[str, list[float]] = {"gpulab": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        hubs = {
            "gpulab": RunningHub(tmp / "gpulab", simulate="3xA100-80GB"),
            "plain": RunningHub(
                tmp / "plain",
                simulate="3xA100-80GB",
                config=PLAIN.format(home=tmp / "plain" / "home"),
            ),
        }
        try:
            for r in range(args.rounds):
                for name, hub in hubs.items():
                    users = [f"{name}{r}x{i}" for i in range(args.users)]
                    opts = {"gpu_milli": 250} if name == "gpulab" else {}
                    results[name] += spawn_all(hub, users, opts)
        finally:
            for hub in hubs.values():
                hub.stop()
    print(f"spawn-to-ready, {args.users} users at once, {args.rounds} rounds (seconds)")
    print(f"{'':34}{'median':>8}{'p90':>8}{'max':>8}")
    for name, label in (
        ("gpulab", "gpulab (1/4 GPU each)"),
        ("plain", "SimpleLocalProcessSpawner (anchor)"),
    ):
        t = results[name]
        print(f"{label:34}{statistics.median(t):8.2f}{percentile(t, 90):8.2f}{max(t):8.2f}")
    ratio = statistics.median(results["gpulab"]) / statistics.median(results["plain"])
    print(f"ratio gpulab/anchor (median): {ratio:.2f}x")


if __name__ == "__main__":
    main()
