"""The program every rank runs: ``python -m gpulab.training.runner <job_dir>``.

It sends this rank's output to ``logs/rank<R>.log``, runs the cell (``cell.py``)
with the shipped variables (``vars.pkl``, cloudpickle) in a fresh ``__main__``
namespace, and on rank 0 saves the ``--out`` variable (``out/value.pkl``, its
``state_dict`` in ``out/state_dict.pt``). A failure is written to torchrun's
error file (its "root cause") and copied to ``errors/rank<R>.json`` with the
rank, so whoever watches the job can name the rank without parsing torchrun.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback

from . import env, hf, memory, preemption


def _redirect_output(job_dir: str, rank: int) -> None:
    path = os.path.join(job_dir, "logs", f"rank{rank}.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cap = int(os.environ.get("GPULAB_LOG_MAX_BYTES") or 0)
    fd = _capped(path, cap) if cap else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    # fd-level, so C extensions' output (gloo, NCCL warnings) lands there too.
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    # Its last lines go into the failure record: argparse's usage error, a script's
    # own message before sys.exit(1), told in the cell rather than only in the log.
    sys.stderr = StderrTail(open(2, "w", buffering=1, closefd=False))  # noqa: SIM115


class StderrTail:
    """``sys.stderr`` that keeps the last ``keep`` characters written to it."""

    def __init__(self, stream, keep: int = 4096):
        self._stream = stream
        self._keep = keep
        self.tail = ""

    def write(self, text: str) -> int:
        self.tail = (self.tail + text)[-self._keep :]
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def stderr_tail(lines: int = 8) -> str:
    """The last ``lines`` non-empty lines the rank wrote to ``sys.stderr``."""
    tail = getattr(sys.stderr, "tail", "")
    return "\n".join([ln for ln in tail.splitlines() if ln.strip()][-lines:])


def _capped(path: str, max_bytes: int) -> int:
    """A pipe into ``log_cap`` (the rank's log kept under ``max_bytes``); its write end."""
    import subprocess

    global _WRITER
    read_end, write_end = os.pipe()
    _WRITER = subprocess.Popen(
        [sys.executable, "-m", "gpulab.training.log_cap", "--max-bytes", str(max_bytes), path],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(read_end)
    return write_end


_WRITER = None


def finish_output(timeout: float = 5.0) -> None:
    """Before the rank exits: all its output into the log (the writer ends when the
    pipe closes; a process the cell left behind may hold it, hence the bound)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _WRITER is None:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    with contextlib.suppress(Exception):
        _WRITER.wait(timeout)


def _write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _unwrap(value):
    # DDP (and torch.compile) wrap the module the user built; return what they built.
    for attr in ("module", "_orig_mod"):
        while hasattr(value, attr) and hasattr(value, "state_dict"):
            value = getattr(value, attr)
    if hasattr(value, "to") and hasattr(value, "state_dict"):
        value = value.to("cpu")
    return value


def save_out(job_dir: str, name: str, namespace: dict, rank: int = 0) -> None:
    """Rank 0 writes the value; every rank calls it (a sharded model is gathered)."""
    import cloudpickle
    import torch

    from .out import gather, save_hf_folder

    if name not in namespace:
        raise NameError(f"--out {name}: the cell defined no variable {name!r}")
    value = gather(namespace[name], rank)
    if rank != 0:
        return
    value = _unwrap(value)
    out = os.path.join(job_dir, "out")
    os.makedirs(out, exist_ok=True)
    if hasattr(value, "state_dict"):
        torch.save(value.state_dict(), os.path.join(out, "state_dict.pt.tmp"))
        os.replace(os.path.join(out, "state_dict.pt.tmp"), os.path.join(out, "state_dict.pt"))
    with open(os.path.join(out, "value.pkl.tmp"), "wb") as f:
        cloudpickle.dump(value, f)
    os.replace(os.path.join(out, "value.pkl.tmp"), os.path.join(out, "value.pkl"))
    save_hf_folder(value, out)


def record_failure(job_dir: str, rank: int, exc: BaseException) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    ErrorHandler().record_exception(exc)  # torchrun's error file: its "root cause"
    _write_json(
        os.path.join(job_dir, "errors", f"rank{rank}.json"),
        {
            "rank": rank,
            "restart": env.restart_count(),
            "time": time.time(),
            "error_file": os.environ.get("TORCHELASTIC_ERROR_FILE"),
            "type": type(exc).__name__,
            "message": memory.explain(exc, rank) if memory.is_out_of_memory(exc) else str(exc),
            "traceback": "".join(traceback.format_exception(exc)),
            "stderr": stderr_tail(),
        },
    )


def run(job_dir: str) -> None:
    import cloudpickle

    rank = env.rank()
    preemption.install()  # before the cell runs: SIGTERM waits for a step boundary
    hf.add_when_imported()  # a Trainer in the cell reports to the live chart
    _redirect_output(job_dir, rank)
    _write_json(
        os.path.join(job_dir, "pids", f"rank{rank}.json"),
        {"pid": os.getpid(), "restart": env.restart_count()},
    )
    if env.restart_count():
        print(f"--- restart {env.restart_count()} ---", flush=True)
    cell = os.path.join(job_dir, "cell.py")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        # Inside: a cell that does not compile is the rank's recorded failure (the
        # notebook checks first; a request made without it lands here).
        with open(cell) as f:
            code = compile(f.read(), cell, "exec")
        vars_path = os.path.join(job_dir, "vars.pkl")
        if os.path.exists(vars_path):
            with open(vars_path, "rb") as f:
                namespace.update(cloudpickle.load(f))
        exec(code, namespace)
        out = env.get(env.OUT)
        if out:
            save_out(job_dir, out, namespace, rank)
    except BaseException as e:  # noqa: BLE001 - everything a rank raises is the job's failure
        if isinstance(e, SystemExit) and not e.code:
            return
        record_failure(job_dir, rank, e)
        traceback.print_exc()
        finish_output()
        os._exit(1)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            # A peer that already left must not turn success into failure.
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m gpulab.training.runner JOB_DIR")
    run(sys.argv[1])
    # Done, and everything is written. Skip the interpreter's teardown: with gloo's
    # threads still unwinding it sometimes aborts ("terminate called without an
    # active exception", about 1 exit in 10 here), which would fail a finished job.
    import logging

    logging.shutdown()
    finish_output()
    os._exit(0)
