"""Autoscaling an endpoint under a step load, against fixed 1 and fixed 3 replicas.

Starts a real hub (``gpulab up``, simulated GPUs), and as a user deploys the same
MLP three times, one after the other (one deployment at a time): with 1 replica,
with 3 replicas, and autoscaled (``--min``..``--max`` replicas, ``target_inflight``
calls in flight per replica, ``scale_down_delay_s``). Each gets the same step load
through its endpoint URL under the hub: closed-loop clients sending one-row JSON
requests, 8 clients for T1 s (phase A), 64 for T2 s (phase B), 8 for T3 s (phase C),
after a short warmup.

A thread polls ``GET /deployments/NAME`` every second for ``replicas`` (wanted
now, all versions), ``replicas_ready`` and ``versions``. Per configuration it
prints throughput and p50/p99 per phase, the replicas over time, and the
slice-seconds used from the start of phase A to the end of phase C
(∫ replicas × gpu_milli/1000 dt from the polls, and as a cross-check the
service's own ``GET /usage?group_by=kind``, kind ``deployment``); then the
autoscaled one against fixed 3. The issue's goal: p99 within 1.3x of fixed 3
at <= 0.6x its slice-seconds.

Even an autoscaler that follows the load exactly holds 3 replicas through phase B
and the scale-down delay after it, so the slice-seconds it can reach are bounded
below by the load's shape: (T1·1 + (T2 + delay)·3 + (T3 − delay)·1) / (3·(T1+T2+T3))
of fixed 3 with min 1 (0.56x for the defaults 40/40/80 s and a 15 s delay; 40/60/60 s
with a 20 s delay could not go below 0.67x). The report prints that bound.

On a CPU-only machine the replicas share its cores (the GPUs are simulated), so
more replicas add little capacity there: read the p99 columns with that in mind.

    python benchmarks/serving_autoscale.py [--phases 40,40,80] [--clients 8,64,8]
        [--min 1] [--max 3] [--target-inflight 16] [--scale-down-delay 15]
        [--hub URL --token TOKEN]

``--hub`` (with a user's ``--token``) measures on a hub already running instead of
starting one: its test uses the suite's shared hub.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import math
import os
import sys
import tempfile
import threading
import time

import numpy as np
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _hub import percentile, serving_hub  # noqa: E402
from serving_batching import load, oip_request  # noqa: E402

PHASES = "ABC"


class Poller(threading.Thread):
    """``GET /deployments/NAME`` every `interval` s: (time, replicas, ready, versions)."""

    def __init__(self, api: str, token: str, name: str, interval: float = 1.0):
        super().__init__(daemon=True)
        self.url = f"{api}/deployments/{name}"
        self.headers = {"Authorization": f"token {token}"}
        self.interval = interval
        self.samples: list[tuple[float, int, int, list]] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def poll(self) -> dict | None:
        try:
            r = requests.get(self.url, headers=self.headers, timeout=10)
        except requests.RequestException as e:
            self.errors.append(str(e))
            return None
        if r.status_code != 200:
            self.errors.append(f"{r.status_code} {r.text[:200]}")
            return None
        dep = r.json()
        versions = [
            (v.get("version"), v.get("weight"), v.get("replicas"), v.get("replicas_ready"))
            for v in dep.get("versions") or []
        ]
        self.samples.append(
            (
                time.time(),
                int(dep.get("replicas") or 0),
                int(dep.get("replicas_ready") or 0),
                versions,
            )
        )
        return dep

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            self.poll()
            self.done.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def stop(self) -> None:
        self.done.set()
        self.join(15)

    def integral(self, t0: float, t1: float) -> float:
        """∫ replicas dt over [t0, t1], each sample held until the next one."""
        total = 0.0
        for i, (t, n, _, _) in enumerate(self.samples):
            end = self.samples[i + 1][0] if i + 1 < len(self.samples) else t1
            lo, hi = max(t, t0), min(end, t1)
            if hi > lo:
                total += n * (hi - lo)
        return total

    def mean(self, t0: float, t1: float) -> float:
        return self.integral(t0, t1) / (t1 - t0) if t1 > t0 else float("nan")

    def timeline(self, t0: float, marks: list[tuple[float, str]]) -> str:
        """``Ts:wanted(ready)`` at each change, seconds from `t0`, with the phase
        boundaries (``|B@40s``) marked."""
        out, last = ["A@0s"], None
        marks = list(marks)
        before = [s for s in self.samples if s[0] < t0]
        if before:
            last = before[-1][1:3]
            out.append(f"0s:{last[0]}({last[1]})")
        for t, n, ready, _ in self.samples:
            if t < t0:
                continue
            while marks and marks[0][0] <= t:
                at, label = marks.pop(0)
                out.append(f"|{label}@{at - t0:.0f}s")
            if (n, ready) != last:
                out.append(f"{t - t0:.0f}s:{n}({ready})")
                last = (n, ready)
        out += [f"|{label}@{at - t0:.0f}s" for at, label in marks]
        return " ".join(out)


def wait_ready(client, name: str, need: int, timeout: float = 300) -> dict:
    """Until `need` replicas answer (for 0: until the deployment has settled)."""
    deadline = time.monotonic() + timeout
    dep = {}
    while time.monotonic() < deadline:
        dep = client.get_deployment(name)
        if dep["state"] == "failed":
            raise RuntimeError(f"{name} failed: {dep.get('message')}")
        ready = dep.get("replicas_ready") or 0
        if (ready >= need > 0) or (need == 0 and dep["state"] != "starting"):
            return dep
        time.sleep(0.5)  # polling starting processes, not a race
    raise RuntimeError(f"{name}: {need} replica(s) not ready after {timeout}s: {dep}")


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def usage_seconds(client, t0: float, t1: float) -> float | None:
    """GPU-seconds of kind ``deployment`` in [t0, t1] as the service counts them."""
    try:
        rows = client.usage(since=iso(t0), until=iso(t1), group_by="kind")["rows"]
    except Exception as e:  # a cross-check only: say why and carry on
        print(f"usage API: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    for row in rows:
        if row.get("kind") == "deployment":
            if row.get("milli_gpu_seconds") is not None:
                return row["milli_gpu_seconds"] / 1000
            return row["gpu_hours"] * 3600
    return 0.0


@contextlib.contextmanager
def running_hub(url: str, token: str, work: str, dims: list[int]):
    """A hub already running at ``url`` as :func:`serving_hub` yields one: ``(hub,
    client, token, model_dir)``, the MLP of ``dims`` built in ``work``. Nothing is
    stopped on exit but the deployments, which each configuration stops itself."""
    from types import SimpleNamespace

    from serving_batching import build_model

    from gpulab.client import Client

    hub = SimpleNamespace(url=url.rstrip("/"), api=f"{url.rstrip('/')}/services/gpulab/api/v1")
    model_dir = os.path.join(work, "mlp")
    build_model(dims, model_dir)
    yield hub, Client(hub.api, token=token), token, model_dir


def run_config(hub, client, token, model_dir, label, name, spec, need, args, bodies) -> dict:
    """Deploy, warm up, drive the three phases, measure, stop."""
    print(f"{label}: deploying {spec}", file=sys.stderr, flush=True)
    created = time.time()
    client.create_deployment(model_dir, {"name": name, **spec})
    dep = wait_ready(client, name, need)
    print(
        f"{label}: {dep.get('replicas_ready')} replica(s) ready after {time.time() - created:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    model = (dep.get("model") or {}).get("name") or name  # the service names it after the endpoint
    url = f"{hub.url}{dep['path']}/v2/models/{model}/infer"
    failures = collections.Counter()
    signed = [(b, {**h, "Authorization": f"token {token}"}) for b, h in bodies]
    poller = Poller(hub.api, token, name)
    poller.start()
    try:
        if args.warmup > 0:
            asyncio.run(load(url, signed, args.clients[0], duration=args.warmup))
        phases = []
        for phase, clients, seconds in zip(PHASES, args.clients, args.phases, strict=True):
            t0 = time.time()
            took, latencies, errors = asyncio.run(
                load(url, signed, clients, duration=seconds, failures=failures)
            )
            t1 = time.time()
            phases.append(
                {
                    "phase": phase,
                    "clients": clients,
                    "t0": t0,
                    "t1": t1,
                    "throughput": len(latencies) / took,
                    "latencies": latencies,
                    "errors": errors,
                }
            )
            print(
                f"{label}: phase {phase} ({clients} clients): "
                f"{len(latencies) / took:.0f} req/s, p99 {percentile(latencies, 99) * 1e3:.0f} ms, "
                f"{errors} errors",
                file=sys.stderr,
                flush=True,
            )
        start, end = phases[0]["t0"], phases[-1]["t1"]
        used = usage_seconds(client, start, end)
    finally:
        poller.stop()
        try:
            client.stop_deployment(name)
        except Exception as e:
            print(f"{label}: stopping {name}: {e}", file=sys.stderr)
    for p in phases:
        p["replicas"] = poller.mean(p["t0"], p["t1"])
        p["p50"] = percentile(p["latencies"], 50)
        p["p99"] = percentile(p["latencies"], 99)
    all_latencies = [x for p in phases for x in p["latencies"]]
    versions = sorted({v[0] for s in poller.samples for v in s[3] if v[0] is not None})
    return {
        "label": label,
        "phases": phases,
        "p99": percentile(all_latencies, 99),
        "slice_seconds": poller.integral(start, end) * args.gpu_milli / 1000,
        "usage_seconds": used,
        "timeline": poller.timeline(
            start, [(p["t0"], p["phase"]) for p in phases[1:]] + [(end, "end")]
        ),
        "versions": versions,
        "poll_errors": poller.errors,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="40,40,80", help="seconds of phases A,B,C")
    parser.add_argument("--clients", default="8,64,8", help="clients in phases A,B,C")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds, phase A's clients")
    parser.add_argument("--min", type=int, default=1, help="autoscaled: min_replicas")
    parser.add_argument("--max", type=int, default=3, help="autoscaled: max_replicas")
    parser.add_argument("--target-inflight", type=float, default=16.0)
    parser.add_argument("--scale-down-delay", type=float, default=15.0)
    parser.add_argument("--fixed", default="1,3", help="fixed replica counts to compare")
    parser.add_argument("--gpu-milli", type=int, default=250)
    parser.add_argument("--dims", default="512,4096,4096,10")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-latency-ms", type=float, default=5.0)
    parser.add_argument("--hub", help="a running hub's URL: measure there, start none")
    parser.add_argument("--token", help="with --hub: an API token of the user who deploys")
    args = parser.parse_args(argv)
    if bool(args.hub) != bool(args.token):
        parser.error("--hub and --token go together")
    args.phases = [float(x) for x in args.phases.split(",")]
    args.clients = [int(x) for x in args.clients.split(",")]
    fixed = [int(x) for x in args.fixed.split(",") if x]
    if len(args.phases) != 3 or len(args.clients) != 3:
        parser.error("--phases and --clients take three values (phases A, B, C)")

    dims = [int(d) for d in args.dims.split(",")]
    rng = np.random.default_rng(0)
    bodies = [oip_request(rng.standard_normal(dims[0], dtype=np.float32), False) for _ in range(64)]
    unit = {
        "gpu_milli": args.gpu_milli,
        "max_batch_size": args.max_batch_size,
        "max_latency_ms": args.max_latency_ms,
    }
    configs = [(f"fixed {n}", f"fixed{n}", {"replicas": n, **unit}, n) for n in fixed]
    configs.append(
        (
            f"autoscaled {args.min}..{args.max}",
            "auto",
            {
                "min_replicas": args.min,
                "max_replicas": args.max,
                "target_inflight": args.target_inflight,
                "scale_down_delay_s": args.scale_down_delay,
                **unit,
            },
            args.min,
        )
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-autoscale-") as work:
        where = (
            running_hub(args.hub, args.token, work, dims) if args.hub else serving_hub(work, dims)
        )
        with where as (hub, client, token, model_dir):
            for label, name, spec, need in configs:
                results.append(
                    run_config(hub, client, token, model_dir, label, name, spec, need, args, bodies)
                )

    report(results, args, dims)
    return 0


def report(results: list[dict], args, dims: list[int]) -> None:
    print(
        f"MLP {','.join(map(str, dims))}, one-row JSON requests through the hub, closed loop: "
        + ", ".join(
            f"phase {p} {c} clients {s:g} s"
            for p, c, s in zip(PHASES, args.clients, args.phases, strict=True)
        )
        + f"; {args.gpu_milli / 1000:g} GPU per replica, max batch {args.max_batch_size}, "
        f"{args.max_latency_ms:g} ms; autoscaled: target_inflight {args.target_inflight:g}, "
        f"scale_down_delay_s {args.scale_down_delay:g}"
    )
    print(
        f"{'configuration':18} {'phase':>7} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'errors':>6} {'replicas':>8}"
    )
    for r in results:
        for p in r["phases"]:
            print(
                f"{r['label']:18} {p['phase'] + ' ' + str(p['clients']):>7} {p['throughput']:7.0f} "
                f"{p['p50'] * 1e3:8.1f} {p['p99'] * 1e3:8.1f} {p['errors']:6d} "
                f"{p['replicas']:8.2f}"
            )
        used = "-" if r["usage_seconds"] is None else f"{r['usage_seconds']:.1f}"
        print(
            f"{r['label']:18} {'all':>7} {'':7} {'':8} {r['p99'] * 1e3:8.1f}   "
            f"slice-seconds {r['slice_seconds']:.1f} (polls), {used} (GET /usage)"
        )
    for r in results:
        extra = f"; versions {r['versions']}" if r["versions"] else ""
        print(f"replicas wanted(ready) over time, {r['label']}: {r['timeline']}{extra}")
        for (status, answer), n in r["failures"].most_common(3):
            print(f"  {n} failed calls: {status} {answer}")
        if r["poll_errors"]:
            print(f"  {len(r['poll_errors'])} failed polls, first: {r['poll_errors'][0]}")
    auto = results[-1]
    base = next((r for r in results if r["label"] == "fixed 3"), None)
    if base is None:
        print("no fixed 3 configuration to compare with")
        return
    print(
        f"slice-seconds an autoscaler that followed the load exactly (with the delay) would "
        f"use: {ideal_share(args):.2f}x of fixed 3"
    )
    p99 = auto["p99"] / base["p99"]
    slices = auto["slice_seconds"] / base["slice_seconds"]
    per_phase = ", ".join(
        f"{a['phase']} {a['p99'] / b['p99']:.2f}x"
        for a, b in zip(auto["phases"], base["phases"], strict=True)
    )
    print(
        f"{auto['label']} / fixed 3: p99 {p99:.2f}x (goal <= 1.3x: "
        f"{'met' if p99 <= 1.3 else 'not met'}; per phase {per_phase}), slice-seconds "
        f"{slices:.2f}x (goal <= 0.6x: {'met' if slices <= 0.6 else 'not met'})"
    )


def ideal_share(args) -> float:
    """The autoscaled configuration's least slice-seconds against fixed 3, given the
    load (one call in flight per client) and the scale-down delay."""

    def need(clients: int) -> int:
        return min(max(math.ceil(clients / args.target_inflight), args.min, 1), args.max)

    (t1, t2, t3), (c1, c2, c3) = args.phases, args.clients
    delay = min(args.scale_down_delay, t3)
    held = t1 * need(c1) + t2 * need(c2) + delay * max(need(c2), need(c3)) + (t3 - delay) * need(c3)
    return held / (3 * (t1 + t2 + t3))


if __name__ == "__main__":
    sys.exit(main())
