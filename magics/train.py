"""``%%train_distributed``: the cell becomes a fault-tolerant PyTorch job across nodes.

``%train_distributed [flags] SCRIPT.py [ARGS...]`` (the line magic) runs an existing
script the same way, as ``torchrun [flags] SCRIPT.py [ARGS...]`` would
(:mod:`.train_script`).

Thin: parse the flags, ship the cell and ``--vars`` (cloudpickle) to the
service through :mod:`gpulab.client`, show progress, logs and metrics while it
runs, put ``--out`` into the notebook, and raise if the job failed, so that
"Run All" stops. Interrupting the cell cancels the job.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import queue
import re
import time
from fractions import Fraction

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from gpulab.client.states import JOB_TERMINAL as TERMINAL
from gpulab.client.units import plural

from .cell_names import free_names
from .lineage import from_job, remember
from .train_display import make_display, nodes_summary
from .train_failure import TrainingJobFailed, failure_lines, hint, names_hint
from .train_script import check_compiles, script_cell

POLL_S = 1.0
#: The most nodes a job may ask for (``gpulab.backend.spec.MAX_NODES``, the service's).
MAX_NODES = 64
#: Polls between full job reads (restarts, queue position) while the state holds.
JOB_EVERY = 5


__all__ = ["TrainMagics", "TrainingJobCancelled", "TrainingJobFailed", "TrainingJobRefused"]


class TrainingJobRefused(RuntimeError):
    """The service would not queue the job (quota, capacity); the message says why.

    Shown as its one line: the service's words are the whole story."""

    def _render_traceback_(self) -> list[str]:
        return [f"TrainingJobRefused: {self}"]


class TrainingJobCancelled(KeyboardInterrupt):
    """The cell was interrupted and its job cancelled: one line, no traceback."""

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def parse_gpu(text: str) -> int:
    """``0.5``, ``1/4``, ``2`` (GPUs per rank) -> milli-GPU."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise UsageError(
            f"--gpu {text!r}: give GPUs per rank as a number or fraction, "
            f"e.g. --gpu 0.5, --gpu 1/4 or --gpu 2 (0 = no GPU)"
        ) from None
    milli = value * 1000
    if value < 0 or milli.denominator != 1:
        raise UsageError(f"--gpu {text}: must be 0 or more, in steps of 1/1000 GPU")
    if value > 1 and value.denominator != 1:
        raise UsageError(f"--gpu {text}: more than one GPU per rank must be whole GPUs")
    return int(milli)


def parse_nodes(text: str) -> tuple[int, int, int]:
    """``2`` (a fixed job) or ``MIN:MAX`` (elastic) -> ``(nodes, min_nodes, max_nodes)``.

    A fixed job is ``(N, 0, 0)``; an elastic one asks for ``nodes = MAX`` (the
    service sets its size at each launch). ``N:N`` is the fixed job of N nodes.
    """
    text = text.strip()
    example = "e.g. --nodes 2, or --nodes 1:4 for an elastic job of 1 to 4 nodes"
    if ":" not in text:
        try:
            nodes = int(text)
        except ValueError:
            raise UsageError(
                f"--nodes {text}: give a number of nodes or MIN:MAX, {example}"
            ) from None
        if not 1 <= nodes <= MAX_NODES:
            raise UsageError(f"--nodes {nodes}: must be 1 to {MAX_NODES}, {example}")
        return nodes, 0, 0
    low_text, _, high_text = text.partition(":")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise UsageError(
            f"--nodes {text}: MIN and MAX must be whole numbers, e.g. --nodes 1:4 "
            f"(an elastic job of 1 to 4 nodes)"
        ) from None
    if low < 1:
        raise UsageError(f"--nodes {text}: MIN must be at least 1, e.g. --nodes 1:{max(high, 2)}")
    if low > high:
        raise UsageError(f"--nodes {text}: MIN must be <= MAX, e.g. --nodes {high}:{low}")
    if high > MAX_NODES:
        raise UsageError(
            f"--nodes {text}: MAX must be at most {MAX_NODES}, "
            f"e.g. --nodes {min(low, MAX_NODES)}:{MAX_NODES}"
        )
    if low == high:
        return low, 0, 0
    return high, low, high


def parse_env(items: list[str] | None) -> dict[str, str]:
    env = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise UsageError(f"--env {item!r}: write NAME=value (one per --env)")
        env[key] = value
    return env


def var_names(names: str | None) -> list[str]:
    return [n.strip() for n in (names or "").split(",") if n.strip()]


def pickle_vars(names: str | None, namespace: dict) -> str:
    if not names:
        return ""
    import cloudpickle

    chosen = {}
    for name in var_names(names):
        if name not in namespace:
            raise UsageError(
                f"--vars {name}: no variable {name!r} in the notebook; "
                f"run the cell that defines it first"
            )
        chosen[name] = namespace[name]
    try:
        data = cloudpickle.dumps(chosen)
    except Exception as e:
        raise UsageError(
            f"--vars: cannot send these variables to the ranks "
            f"(cloudpickle: {e}); rebuild them inside the cell instead"
        ) from None
    return base64.b64encode(data).decode()


def check_names(cell: str, sent: list[str], namespace: dict) -> None:
    """Refuse, before anything is queued, a cell that reads a notebook name it does
    not send: the ranks would fail on it with a NameError once they have started."""
    names = free_names(cell)
    why = names_hint(sorted(names), sent, namespace) if names else None
    if why:
        raise UsageError(why)


def build_spec(args, cell: str | None, namespace: dict) -> dict:
    """The job's spec from the flags and the cell, or (``cell`` None: the line magic)
    from ``args.script`` (``SCRIPT.py ARGS...``)."""
    nodes, min_nodes, max_nodes = parse_nodes(str(args.nodes))
    for flag, value, low in (
        ("--nproc-per-node", args.nproc_per_node, 1),
        ("--max-restarts", args.max_restarts, 0),
        ("--checkpoint-every", args.checkpoint_every, 0),
    ):
        if value < low:
            raise UsageError(f"{flag} {value}: must be at least {low}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout}: give seconds > 0")
    if args.out and not args.out.isidentifier():
        raise UsageError(f"--out {args.out!r}: must be a Python variable name")
    env = parse_env(args.env)
    script = getattr(args, "script", None) or []  # callers that build args themselves
    if cell is None:
        if not script:
            raise UsageError(
                "give a script, e.g. %train_distributed --nodes 2 train.py --epochs 3, "
                "or write the training code in a %%train_distributed cell"
            )
        cell = script_cell(script, env)
    else:
        if script:
            raise UsageError(
                f"unrecognized arguments: {' '.join(script)} (a %%train_distributed "
                f"cell runs its own code; run a script with the line magic "
                f"%train_distributed [flags] SCRIPT.py [ARGS...])"
            )
        if not cell.strip():
            raise UsageError("the cell is empty: write the training code below %%train_distributed")
        # Before anything is queued; numbered as the notebook numbers the cell's lines.
        check_compiles(cell, "<cell>", first_line=2)
        check_names(cell, var_names(args.vars), namespace)
    return {
        "code": cell,
        "name": args.name,
        "nodes": nodes,
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "nproc_per_node": args.nproc_per_node,
        "gpu_milli": parse_gpu(args.gpu),
        "backend": args.backend,
        "pool": args.pool,
        "max_restarts": args.max_restarts,
        "checkpoint_every": args.checkpoint_every,
        "amp": args.amp or "",
        "comm_hook": args.comm_hook or "",
        "fsdp": bool(getattr(args, "fsdp", False)),
        # Only when asked: a job without --qat sends what it sent before the flag.
        **({"qat": args.qat} if getattr(args, "qat", None) else {}),
        "env": env,
        "out": args.out or "",
        "timeout": args.timeout or 0,
        "priority": args.priority,
        "priority_class": args.priority_class,
        "preemptible": not args.no_preempt,
        # On Kubernetes the ranks run the notebook's own image unless told otherwise.
        "image": args.image
        or os.environ.get("JUPYTER_IMAGE_SPEC")
        or os.environ.get("JUPYTER_IMAGE", ""),
        "vars_b64": pickle_vars(args.vars, namespace),
        # The ranks run in the server's environment (picked on the spawn form).
        **({"environment": picked} if (picked := os.environ.get("GPULAB_ENVIRONMENT")) else {}),
    }


@magics_class
class TrainMagics(Magics):
    @magic_arguments()
    @argument(
        "--nodes",
        default="1",
        metavar="N|MIN:MAX",
        help="nodes (torchrun agents): N, or MIN:MAX for an elastic job that starts once "
        "MIN fit, grows to MAX as slices free and shrinks instead of stopping; default 1",
    )
    @argument("--nproc-per-node", type=int, default=1, help="processes (ranks) per node; default 1")
    @argument("--gpu", default="0", help="GPUs per rank: 0 (CPU), 0.5, 1/4, 1, 2...; default 0")
    @argument(
        "--pool",
        default="",
        help="the pool the ranks run in (%%gpulab pools lists them) or auto (the first "
        "with room); default: the site's",
    )
    @argument(
        "--backend",
        default="",
        help="local, slurm or kubernetes: the site's pool of that kind; default: the site's",
    )
    @argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restarts (from the last checkpoint) after a rank dies; default 0",
    )
    @argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="steps between checkpoints in checkpoint.resume_range; default 0 (end only)",
    )
    @argument("--amp", choices=("bf16", "fp16"), help="autocast dtype for ctx.autocast()")
    @argument(
        "--fsdp",
        action="store_true",
        help="ctx.wrap(model) shards the model with FSDP2 (as shard=True): for a model "
        "whose training state does not fit one rank",
    )
    @argument(
        "--qat",
        choices=("int8-int4",),
        help="ctx.wrap(model) trains quantization-aware (torchao's QAT, as qat=): "
        "%%quantize then converts the model with that scheme",
    )
    @argument(
        "--comm-hook",
        choices=("powersgd", "fp16", "bf16"),
        help="DDP gradient compression; bf16 needs GPUs (NCCL)",
    )
    @argument("--vars", help="notebook variables to send to the ranks: a,b,c")
    @argument("--env", action="append", metavar="K=V", help="environment variable (repeatable)")
    @argument("--out", help="variable the ranks build (rank 0's) to bring back, e.g. model")
    @argument("--name", default="train", help="job name; default train")
    @argument("--image", help="container image (kubernetes backend)")
    @argument("--detach", action="store_true", help="submit and return the job id at once")
    @argument("--timeout", type=float, help="stop the job after this many seconds running")
    @argument("--priority", type=int, default=0, help="queue priority; users may lower it (< 0)")
    @argument(
        "--priority-class",
        default="batch",
        help="priority class: batch (default), or a class an admin granted (batch-high)",
    )
    @argument(
        "--no-preempt",
        action="store_true",
        help="never stop this job to make room for others (it may wait longer to start)",
    )
    @argument(
        "script",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT.py [ARGS...]",
        help="(line magic) an existing script and its own arguments, as torchrun takes "
        "them: %%train_distributed --nodes 2 train.py --epochs 3",
    )
    @line_cell_magic
    def train_distributed(self, line: str, cell: str | None = None):
        """Run this cell as a fault-tolerant PyTorch job (torchrun) on gpulab's GPUs.

        As a line magic, ``%train_distributed [flags] SCRIPT.py [ARGS...]`` runs an
        existing script unchanged, as ``torchrun`` would: its folder on ``sys.path``,
        its arguments in ``sys.argv``, the notebook's folder on ``PYTHONPATH`` and as
        the working folder (else a folder for the job in your home; the first log
        line says which).

        Inside the cell::

            from gpulab.training import setup, report, checkpoint
            ctx = setup()
            model = ctx.wrap(Net())
            for step in checkpoint.resume_range(ctx, total_steps=500, state={"model": model}):
                ...
                report(loss=loss.item())

        The cell shows progress, a live plot and the ranks' logs; interrupting it
        cancels the job; a failure raises naming the rank and its error.
        """
        args = parse_argstring(self.train_distributed, line)
        spec = build_spec(args, cell, self.shell.user_ns)
        from gpulab.client import (
            BadRequest,
            Client,
            ConfigurationError,
            RequestRefused,
            ServiceUnreachable,
        )

        try:
            client = Client()
            job = client.submit_job(spec)
        except (ConfigurationError, ServiceUnreachable, BadRequest) as e:
            raise UsageError(str(e)) from None
        except RequestRefused as e:
            raise TrainingJobRefused(f"job refused: {e}") from None
        if args.detach:
            print(
                f"job {job['id']} submitted ({job['state']}); "
                f"follow it with gpulab.client.Client().get_job({job['id']!r})"
            )
            return job["id"]
        job = self._watch(client, job, args.out)
        if job is not None:
            why = hint(
                job.get("error") or {}, var_names(args.vars), self.shell.user_ns, job["gpu_milli"]
            )
            # Raised, so that "Run All" stops here; IPython prints only these lines.
            raise TrainingJobFailed(job, failure_lines(job, why))
        return None

    def _watch(self, client, job: dict, out: str | None) -> dict | None:
        """Follow the job to its end; None if it succeeded, else the ended job."""
        from gpulab.client import run_sync

        job_id = job["id"]
        display = follower = None
        cursor = 0
        started = time.monotonic()
        try:
            # Everything after submit is inside: an interrupt at any point cancels.
            display = make_display(job["world_size"], elastic=bool(job.get("elastic")))
            lines: queue.Queue[str] = queue.Queue()
            follower = asyncio.run_coroutine_threadsafe(
                client.aio.follow_job_logs_into(job_id, lines.put), _client_loop()
            )
            polls = 0
            while True:
                m = client.job_metrics(job_id, cursor)
                cursor = m["cursor"]
                display.metrics(m["records"])
                display.checkpoints(m.get("checkpoints"))
                # The metrics answer carries the state; the full job (queue position,
                # restarts) is asked for when that changes and every few seconds.
                if m["state"] != job["state"] or polls % JOB_EVERY == 0:
                    job = client.get_job(job_id)
                polls += 1
                if job["state"] in TERMINAL:
                    # The stream ends once the job has; a cut one loses only log lines.
                    with contextlib.suppress(Exception):
                        follower.result(timeout=30)
                new = drain_queue(lines)
                display.logs(new)
                display.starting(job, new)
                display.status(job)
                if job["state"] in TERMINAL:
                    break
                time.sleep(POLL_S)
            # What the ranks wrote after the last read (final steps, the last checkpoint).
            with contextlib.suppress(Exception):
                m = client.job_metrics(job_id, cursor)
                display.metrics(m["records"])
                display.checkpoints(m.get("checkpoints"))
        except KeyboardInterrupt:
            if follower is not None:
                follower.cancel()
            job = run_sync(client.aio.cancel_job(job_id), timeout=60)
            if display is not None:
                display.status(job)
                display.finish(job)
            # Raised, so that "Run All" stops; shown as this one line.
            raise TrainingJobCancelled(f"job {job_id} cancelled (interrupted)") from None
        display.finish(job)
        took = time.monotonic() - started
        if job["state"] == "succeeded":
            note = f"job {job_id} succeeded in {took:.1f} s ({plural(job['world_size'], 'rank')}"
            nodes = nodes_summary(job)
            if nodes:  # an elastic job: its size at the end, and how it got there
                note += f" at the end; nodes {nodes}"
            note += f", {plural(job['restarts'], 'restart')})" if job["restarts"] else ")"
            if out:
                import cloudpickle

                value = cloudpickle.loads(client.job_output(job_id))
                self.shell.user_ns[out] = value
                remember(value, from_job(job))  # %deploy sends where it came from
                note += f"; `{out}` holds rank 0's value"
            print(note)
            return None
        return job


def drain_queue(q: queue.Queue) -> list[str]:
    """Everything in ``q`` now, without waiting."""
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def _client_loop():
    from gpulab.client.base import client_loop

    return client_loop()
