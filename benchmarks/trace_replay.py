"""Replay the Alibaba GPU-sharing trace (FGD paper protocol) against a placement policy.

    python benchmarks/trace_replay.py \\
        --nodes ../shared/traces/alibaba-gpu-v2023/openb_node_list_gpu_node.csv \\
        --pods  ../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv \\
        --policy gpulab --seeds 42-51 [--anchor fgd] [--json] [--jobs 2]

Prints, per arrival level (% of GPU capacity asked so far), the unallocated
GPU % and the fragmented GPU %, each the mean over the seeds, then the
decision latency (p50/p99 of every ``place()`` call) and the failed tasks.
With ``--anchor NAME`` it also replays that policy on the same seeds and
prints the ratio of unallocated GPU (policy / anchor) per level: below 1 means
less GPU wasted than the anchor. ``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import numpy as np

from gpulab.scheduler.policy import policy_names
from gpulab.scheduler.trace import ReplayResult, load_nodes, load_tasks, replay


def parse_seeds(text: str) -> list[int]:
    """``42-51`` or ``42,45,47`` (or a mix) -> the seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    if not seeds:
        raise argparse.ArgumentTypeError(f"no seeds in {text!r}; write e.g. 42-51")
    return seeds


def run(args: argparse.Namespace, policy: str) -> dict:
    nodes, pods = load_nodes(args.nodes), load_tasks(args.pods)
    one = partial(replay, nodes, pods, policy, ratio=args.inflate, limit=args.limit)
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, args.seeds))
    else:
        results = [one(seed) for seed in args.seeds]
    return summarise(policy, results)


def summarise(policy: str, results: list[ReplayResult]) -> dict:
    levels = sorted(set.intersection(*(set(r.unallocated_pct) for r in results)))
    latency = np.concatenate([r.decision_ms for r in results])
    cpu = np.concatenate([r.decision_cpu_ms for r in results])
    return {
        "policy": policy,
        "seeds": [r.seed for r in results],
        "unallocated_pct": {
            lv: float(np.mean([r.unallocated_pct[lv] for r in results])) for lv in levels
        },
        "fragmented_pct": {
            lv: float(np.mean([r.fragmented_pct[lv] for r in results])) for lv in levels
        },
        "decision_ms": {
            "p50": float(np.percentile(latency, 50)),
            "p99": float(np.percentile(latency, 99)),
        },
        # Thread CPU time of the same calls: the policy's own cost, unaffected
        # by other processes competing for the cores.
        "decision_cpu_ms": {
            "p50": float(np.percentile(cpu, 50)),
            "p99": float(np.percentile(cpu, 99)),
        },
        "failed_tasks": float(np.mean([r.failed_tasks for r in results])),
        "tasks": float(np.mean([r.tasks for r in results])),
    }


def print_table(summary: dict, anchor: dict | None) -> None:
    print(
        f"policy {summary['policy']}  seeds {summary['seeds'][0]}-{summary['seeds'][-1]}"
        f"  ({len(summary['seeds'])} runs, {summary['tasks']:.0f} tasks each)"
    )
    head = f"{'arrived %':>10} {'unallocated %':>14} {'fragmented %':>13}"
    if anchor:
        head += f" {anchor['policy'] + ' unalloc %':>18} {'ratio':>6}"
    print(head)
    for lv, unalloc in summary["unallocated_pct"].items():
        line = f"{lv:>10} {unalloc:>14.2f} {summary['fragmented_pct'][lv]:>13.2f}"
        if anchor and lv in anchor["unallocated_pct"]:
            ref = anchor["unallocated_pct"][lv]
            line += f" {ref:>18.2f} {unalloc / ref if ref else float('nan'):>6.3f}"
        print(line)
    d, c = summary["decision_ms"], summary["decision_cpu_ms"]
    print(
        f"decision ms (wall): p50 {d['p50']:.3f}  p99 {d['p99']:.3f}   (CPU time): p50 {c['p50']:.3f}  p99 {c['p99']:.3f}"
    )
    print(f"failed tasks (mean per run): {summary['failed_tasks']:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", required=True, help="openb_node_list_*.csv")
    parser.add_argument("--pods", required=True, help="openb_pod_list_*.csv")
    parser.add_argument("--policy", required=True, help=f"one of: {', '.join(policy_names())}")
    parser.add_argument(
        "--inflate", type=float, default=1.3, help="workload as a multiple of GPU capacity (1.3)"
    )
    parser.add_argument(
        "--seeds", type=parse_seeds, default=parse_seeds("42-51"), help="e.g. 42-51"
    )
    parser.add_argument("--anchor", help="also replay this policy and print the ratio")
    parser.add_argument("--jobs", type=int, default=1, help="seeds replayed in parallel")
    parser.add_argument(
        "--limit", type=int, help="stop each replay after this many tasks (smoke tests)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    for name in filter(None, (args.policy, args.anchor)):
        if name not in policy_names():
            parser.error(f"unknown policy {name!r}; registered: {', '.join(policy_names())}")

    summary = run(args, args.policy)
    anchor = run(args, args.anchor) if args.anchor else None
    if args.json:
        if anchor:
            summary["anchor"] = anchor
        json.dump(summary, sys.stdout)
        print()
    else:
        print_table(summary, anchor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
