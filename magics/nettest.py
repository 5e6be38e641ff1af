"""``%gpulab nettest``: the all-reduce probe.

``nettest`` runs ``gpulab.training.allreduce_probe`` under a real torchrun on this
server (``--nproc`` processes; NCCL on CUDA, gloo otherwise) and prints algbw and
busbw (nccl-tests definitions). With ``--nodes N`` the probe runs across nodes
instead: a job named ``nettest`` goes through the service's jobs API (as
``%%train_distributed`` cells do), every rank calls ``allreduce_probe.run_probe``
in the job's process group, and rank 0's result comes back as the job's ``--out``
value. Only such a job's result is recorded for the dashboard's Network tab: the
service reads it from the job when the job succeeds (a number a user could post
would be shown to everyone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import time

from gpulab.client.states import JOB_TERMINAL as TERMINAL
from gpulab.client.units import gpu_label, noun, plural
from gpulab.training import env as rank_env

NETTEST_USAGE = (
    "%gpulab nettest [--size BYTES] [--iters N] [--nproc N] [--warmup N] "
    "[--nodes N [--gpu G] [--pool NAME] [--backend KIND]] [--timeout S] [--no-report]"
)
JOB_NAME = "nettest"
POLL_S = 0.5
#: The cell each rank of a ``--nodes`` probe runs; rank 0's ``result`` comes back.
JOB_CODE = """\
from gpulab.training import setup
from gpulab.training.allreduce_probe import RESULT_PREFIX, run_probe
import json
ctx = setup()
result = run_probe({size}, iters={iters}, warmup={warmup}, record={record})
if ctx.is_main:
    print(RESULT_PREFIX + json.dumps(result), flush=True)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%gpulab nettest", add_help=False, exit_on_error=False)
    p.add_argument("--size", default="16M", help="bytes per all-reduce: 65536, 64K, 16M, 1G")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nproc", type=int, default=None)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--gpu", default="0")
    p.add_argument("--backend", default="")  # "": the site's; see %%train_distributed
    p.add_argument("--pool", default="")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--no-report", action="store_true")
    return p


class NettestError(Exception):
    """Bad arguments or a probe that failed; the message says what to do."""


def parse_nettest(line: str) -> argparse.Namespace:
    try:
        args, extra = _parser().parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as e:
        raise NettestError(f"{e}\nusage: {NETTEST_USAGE}") from None
    if extra:
        raise NettestError(
            f"unknown {noun(len(extra), 'argument')} {' '.join(extra)}\nusage: {NETTEST_USAGE}"
        )
    if (
        args.iters < 1
        or args.warmup < 0
        or (args.nproc is not None and args.nproc < 1)
        or (args.nodes is not None and args.nodes < 1)
    ):
        raise NettestError(
            f"--iters, --nproc and --nodes must be >= 1, --warmup >= 0\nusage: {NETTEST_USAGE}"
        )
    if args.timeout <= 0:
        raise NettestError(f"--timeout {args.timeout:g}: give seconds > 0\nusage: {NETTEST_USAGE}")
    from gpulab.training.allreduce_probe import parse_size

    try:
        sizes = [parse_size(s) for s in str(args.size).split(",") if s.strip()]
    except ValueError as e:
        raise NettestError(f"--size: {e}\nusage: {NETTEST_USAGE}") from None
    if not sizes or (args.nodes is not None and len(sizes) > 1):
        raise NettestError(
            f"--size {args.size!r}: give one size, e.g. --size 16M\nusage: {NETTEST_USAGE}"
        )
    args.size_bytes = max(sizes)
    if args.nodes is None:
        if args.gpu != "0" or args.backend or args.pool:
            raise NettestError(
                "--gpu, --pool and --backend go with --nodes (a job through the "
                f"gpulab service)\nusage: {NETTEST_USAGE}"
            )
        return args
    from IPython.core.error import UsageError

    from .train import parse_gpu

    try:
        args.gpu_milli = parse_gpu(args.gpu)
    except UsageError as e:
        raise NettestError(f"{e}\nusage: {NETTEST_USAGE}") from None
    return args


def job_spec(args: argparse.Namespace) -> dict:
    """The ``nettest`` job (fields of ``gpulab.backend.spec.JobSpec``) for ``--nodes``."""
    code = JOB_CODE.format(
        size=args.size_bytes, iters=args.iters, warmup=args.warmup, record=not args.no_report
    )
    return {
        "code": code,
        "name": JOB_NAME,
        "nodes": args.nodes,
        "nproc_per_node": args.nproc or 1,
        "gpu_milli": args.gpu_milli,
        "backend": args.backend,
        "pool": args.pool,
        "out": "result",
        "timeout": args.timeout,
    }


def default_nproc() -> int:
    """One rank per visible GPU; 2 on CPU (the smallest all-reduce that crosses processes)."""
    try:
        import torch

        if torch.cuda.is_available():
            return max(1, torch.cuda.device_count())
    except ImportError:
        pass
    return 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_probe(size: str, iters: int, nproc: int, warmup: int = 5, timeout: float = 600.0) -> dict:
    """Run the probe under torchrun on this machine; return rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="gpulab-nettest-") as tmp:
        out = os.path.join(tmp, "result.json")
        # Not --standalone: its c10d store would listen on every interface and
        # unpickle what anyone writes there. gpulab's signed rendezvous on
        # loopback only, under a secret this kernel alone holds (its environment).
        argv = [
            sys.executable,
            "-m",
            "gpulab.training.launch",
            "--nnodes=1",
            f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
            "--rdzv-backend=gpulab",
            f"--rdzv-id=nettest-{secrets.token_hex(4)}",
            "--rdzv-conf=is_host=1",
            "--local-addr=127.0.0.1",
            f"--nproc-per-node={nproc}",
            "-m",
            "gpulab.training.allreduce_probe",
            "--size",
            str(size),
            "--iters",
            str(iters),
            "--warmup",
            str(warmup),
            "--json-out",
            out,
        ]
        try:
            env = {
                **os.environ,
                rank_env.RDZV_SECRET: secrets.token_hex(32),
                "GLOO_SOCKET_IFNAME": "lo",
            }
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise NettestError(
                f"the probe took longer than {timeout:g} s; try a smaller --size or fewer --iters"
            ) from None
        if proc.returncode != 0 or not os.path.exists(out):
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise NettestError(f"the probe failed (exit {proc.returncode}):\n{tail}")
        with open(out) as f:
            results = json.load(f)
    return max(results, key=lambda r: r["size_bytes"])


def run_job_probe(client, args: argparse.Namespace) -> tuple[dict, dict]:
    """Submit the ``nettest`` job, show its progress, return (rank 0's result, the job).

    Interrupting cancels the job (and re-raises).
    """
    from gpulab.client import (
        BadRequest,
        ConfigurationError,
        GpuLabError,
        RequestRefused,
        ServiceUnreachable,
    )

    spec = job_spec(args)
    try:
        job = client.submit_job(spec)
    except (ConfigurationError, ServiceUnreachable, BadRequest) as e:
        raise NettestError(f"{e}\nusage: {NETTEST_USAGE}") from None
    except RequestRefused as e:
        raise NettestError(f"the gpulab service refused the probe job: {e}") from None
    job_id = job["id"]
    print(
        f"job {job_id} ({JOB_NAME}): {plural(spec['nodes'], 'node')} x "
        f"{plural(spec['nproc_per_node'], 'rank')} per node, {gpu_label(spec['gpu_milli'])} "
        f"per rank; {_state(job)}",
        flush=True,
    )
    try:
        job = _follow(client, job)
    except GpuLabError as e:
        raise NettestError(
            f"lost track of job {job_id}: {e}; it may still run: "
            f"Client().get_job({job_id!r}) shows it"
        ) from None
    except KeyboardInterrupt:
        from gpulab.client import run_sync

        try:
            run_sync(client.aio.cancel_job(job_id), timeout=60)
            print(f"job {job_id} cancelled (interrupted)")
        except Exception as e:
            print(
                f"job {job_id}: could not cancel it ({e}); Client().cancel_job({job_id!r}) stops it"
            )
        raise
    if job["state"] != "succeeded":
        text = f"job {job_id} {job['state']}: {job.get('message') or job['state']}"
        error = job.get("error") or {}
        if error.get("traceback"):
            text += f"\nrank {error.get('rank')} traceback:\n{error['traceback'][-3000:]}"
        raise NettestError(text)
    try:
        import cloudpickle

        result = cloudpickle.loads(client.job_output(job_id))
    except Exception as e:
        raise NettestError(
            f"job {job_id} succeeded but its result could not be read: {e}"
        ) from None
    if not isinstance(result, dict) or "busbw_bytes_per_second" not in result:
        raise NettestError(f"job {job_id} returned {type(result).__name__}, not a probe result")
    return result, job


def _state(job: dict) -> str:
    if job["state"] == "queued" and job.get("position") is not None:
        return f"queued (position {job['position']})"
    return job.get("message") or job["state"]


def _follow(client, job: dict) -> dict:
    """Print the job's state changes and its ranks' log lines until it ends."""
    import asyncio
    import queue

    from gpulab.client.base import client_loop

    from .train import drain_queue

    lines: queue.Queue[str] = queue.Queue()
    follower = asyncio.run_coroutine_threadsafe(
        client.aio.follow_job_logs_into(job["id"], lines.put), client_loop()
    )
    shown = _state(job)
    try:
        while True:
            job = client.get_job(job["id"])
            if job["state"] in TERMINAL:
                # The stream ends once the job has; a cut one loses only log lines.
                with contextlib.suppress(Exception):
                    follower.result(timeout=30)
            for line in drain_queue(lines):
                print(f"  {line}", flush=True)
            if _state(job) != shown:
                shown = _state(job)
                print(f"job {job['id']}: {shown}", flush=True)
            if job["state"] in TERMINAL:
                return job
            time.sleep(POLL_S)
    finally:
        follower.cancel()


def format_result(r: dict) -> str:
    n = r["world_size"]
    nodes = r.get("nodes") or []
    return (
        f"all-reduce of {r['size_bytes'] / 2**20:.2f} MiB over {n} ranks on "
        f"{plural(len(nodes), 'node')} ({r['backend']}, nodes: {', '.join(nodes)})\n"
        f"  time   {r['time_s'] * 1e3:.3f} ms per all-reduce ({r['iters']} timed)\n"
        f"  algbw  {r['algbw_bytes_per_second'] / 1e9:.3f} GB/s   (size / time)\n"
        f"  busbw  {r['busbw_bytes_per_second'] / 1e9:.3f} GB/s   "
        f"(algbw * 2(n-1)/n = algbw * {2 * (n - 1) / n:.3f})"
        + (
            "\n  one rank: nothing crosses a link, so busbw is 0 by definition; "
            "use --nproc 2 or more, or --nodes 2 or more"
            if n == 1
            else ""
        )
    )


def nettest(line: str) -> dict | None:
    """The ``%gpulab nettest`` subcommand; prints and returns the result."""
    client = job = None
    try:
        args = parse_nettest(line)
        if args.nodes is None:
            result = run_probe(
                args.size, args.iters, args.nproc or default_nproc(), args.warmup, args.timeout
            )
        else:
            from gpulab.client import Client, ConfigurationError

            try:
                client = Client()
            except ConfigurationError as e:
                raise NettestError(f"--nodes runs the probe as a gpulab job: {e}") from None
            result, job = run_job_probe(client, args)
    except NettestError as e:
        print(f"nettest: {e}")
        return None
    print(format_result(result))
    if job is None:
        if not args.no_report:
            print(
                "  not recorded: a probe on this server alone is not; "
                "%gpulab nettest --nodes 1 runs it as a job, whose result the "
                "dashboard's Network tab shows"
            )
        return result
    result = {**result, "job_id": job["id"]}
    if args.no_report:
        return result
    try:  # the service recorded it when the job succeeded; say whether it did
        runs = client.telemetry()["allreduce"]
        if any(r.get("job_id") == job["id"] for r in runs):
            print(f"  recorded: the dashboard's Network tab shows it (job {job['id']})")
        else:
            print(
                f"  not recorded: the gpulab service did not take job {job['id']}'s "
                f"result; its log says why"
            )
    except Exception as e:  # the measurement stands even if the service can't say
        print(f"  could not ask the gpulab service whether it recorded it: {e}")
    return result
