"""What ``srun`` starts on every node of a Slurm job: that node's torchrun agent.

``python -m gpulab.backend.slurm_launch JOB_DIR``, once per node (``srun
--ntasks-per-node=1``). One ``srun`` runs the same command everywhere, but the
torchrun command line differs per node (node rank, ``is_host``, log dir), so the
backend rendered every node at submit (:mod:`.render`) into
``JOB_DIR/slurm/node<R>.json`` with placeholders this launcher fills in:

``@HEAD@``  the node that hosts the rendezvous store (``$GPULAB_RDZV_HOST``,
            set by the batch script);
``@SELF@``  this node's own host name (torchrun's ``--local-addr``);
``@PORT@``  the rendezvous port: node rank 0 takes a free port of its host and
            writes it to ``pids/rdzv-port.<job id>.<restart>``; the other nodes
            read it there (the job dir is on a filesystem every node shares).

``slurm/nodes.json`` maps Slurm node names to node ranks (where the ledger put
each node's slices); without an entry the node rank is ``$SLURM_NODEID``.

torchrun, and so every rank, gets the node file's environment plus the
``SLURM_*`` variables srun gave this launcher that describe the job and the node
(``SLURM_JOB_ID``, ``SLURM_NODEID``, ``SLURM_JOB_NODELIST``, ``SLURM_SUBMIT_DIR``...),
not those of its task (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``...): the
launcher is one task per node while the ranks are torchrun's, so those would name
the wrong rank and world, and libraries that read them first (Lightning's Slurm
detection) would take them over ``RANK``/``WORLD_SIZE``. The node file wins on a
clash; nothing else of the batch environment is passed on.

The agent's output goes to ``logs/node<R>.log`` and its exit code to
``pids/node<R>.exit``, as with the local backend, so the service reads a Slurm
job like a local one. The launcher stays torchrun's parent to write that file;
it passes SIGTERM/SIGINT on to the agent.

``--signal SIG JOB_DIR`` instead signals this node's ranks (``pids/rank*.json``
naming this host): a preemption, run as a step of the job on every node.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from gpulab.training.log_cap import CappedLog, copy

#: How long the other nodes wait for node rank 0's rendezvous port. srun starts
#: the nodes' launchers together; a shared filesystem may show the file late.
PORT_WAIT_S = 120.0


class NoPort(RuntimeError):
    """Node rank 0 wrote no rendezvous port in time."""


def port_file(job_dir: str) -> str:
    """Where node rank 0 writes the port: per Slurm job and requeue (a requeued job
    keeps its id and must not read the port of its previous run)."""
    job = os.environ.get("SLURM_JOB_ID", "0")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    return os.path.join(job_dir, "pids", f"rdzv-port.{job}.{restart}")


def rendezvous_port(job_dir: str, rank: int, wait_s: float | None = None) -> int:
    """Node rank 0 asks its kernel for a free port; the others wait for it. A fixed or
    derived port could already be taken on a shared node (another user's torchrun
    listens on 29500 by default)."""
    path = port_file(job_dir)
    wait_s = PORT_WAIT_S if wait_s is None else wait_s
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        with open(path + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.replace(path + ".tmp", path)
        return port
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isascii() and text.isdigit() and len(text) <= 5:
                return int(text)
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise NoPort(
                f"node rank 0 wrote no rendezvous port to {path} within {wait_s:.0f} s: "
                "did it start, and do all nodes see the job dir (a shared filesystem)?"
            )
        time.sleep(0.2)


def node_rank(job_dir: str) -> int:
    try:
        with open(os.path.join(job_dir, "slurm", "nodes.json")) as f:
            by_name = json.load(f)
    except FileNotFoundError:
        by_name = {}
    name = os.environ.get("SLURMD_NODENAME", "")
    if name in by_name:
        return int(by_name[name])
    return int(os.environ.get("SLURM_NODEID", "0"))


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


#: Slurm's variables of the launcher's task (one per node), not of a rank: kept from
#: the ranks, whose rank and world are torchrun's.
TASK_VARIABLES = frozenset(
    {
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
        "SLURM_STEP_NUM_TASKS",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_TASK_PID",
        "SLURM_GTIDS",
    }
)


def rank_env(node_env: dict[str, str], ours, values: dict[str, str]) -> dict[str, str]:
    """torchrun's environment: Slurm's own ``SLURM_*`` variables of this task (the
    job id, node id, node list... users name scratch paths and logs by them), under
    what the backend chose (PASS_ENV, the account's HOME/USER, render_node's
    variables), which wins on a clash. Nothing else of the batch environment: it is
    the service's and must not reach user code."""
    env = {k: v for k, v in ours.items() if k.startswith("SLURM_") and k not in TASK_VARIABLES}
    env.update({k: fill(v, values) for k, v in node_env.items()})
    return env


def launch(job_dir: str) -> int:
    rank = node_rank(job_dir)
    with open(os.path.join(job_dir, "slurm", f"node{rank}.json")) as f:
        node = json.load(f)
    # Made by the hand-over to the owner's account; without accounts, by the first user.
    os.makedirs(os.path.join(job_dir, "pids"), exist_ok=True)
    log = os.open(
        os.path.join(job_dir, "logs", f"node{rank}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    try:
        port = rendezvous_port(job_dir, rank)
    except NoPort as e:
        os.write(log, f"gpulab: {e}\n".encode())
        os.close(log)
        return _exited(job_dir, rank, 1)
    values = {
        "@HEAD@": os.environ.get("GPULAB_RDZV_HOST") or socket.gethostname(),
        "@SELF@": socket.gethostname(),
        "@PORT@": str(port),
    }
    argv = [fill(a, values) for a in node["argv"]]
    env = rank_env(node["env"], os.environ, values)
    cap = int(env.get("GPULAB_LOG_MAX_BYTES") or 0)
    out = subprocess.PIPE if cap else log
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=job_dir,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT if cap else log,
    )
    os.close(log)
    copier = None
    if cap:
        # The agent's output kept under the cap (gpulab.training.log_cap), copied here.
        capped = CappedLog(os.path.join(job_dir, "logs", f"node{rank}.log"), cap)
        copier = threading.Thread(
            target=copy, args=(proc.stdout.fileno(), capped, proc), daemon=True
        )
        copier.start()

    def forward(signum, _frame):
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = proc.wait()
    if copier is not None:
        copier.join()  # copy() stops a few seconds after the agent at the latest
    return _exited(job_dir, rank, code)


def _exited(job_dir: str, rank: int, code: int) -> int:
    """Write this node's exit code where the service reads it; srun's exit status."""
    exit_file = os.path.join(job_dir, "pids", f"node{rank}.exit")
    with open(exit_file + ".tmp", "w") as f:
        f.write(f"{code}\n")
    os.replace(exit_file + ".tmp", exit_file)
    return 0 if code == 0 else (code if 0 < code < 256 else 1)


def signal_ranks(job_dir: str, signum: int) -> int:
    """Signal the ranks of this node (their pid files name the host they run on)."""
    me = socket.gethostname()
    for path in glob.glob(os.path.join(job_dir, "pids", "rank*.json")):
        try:
            with open(path) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        pid = info.get("pid") if isinstance(info, dict) else None
        if info.get("host", me) != me or not isinstance(pid, int) or pid <= 1:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if job_dir.encode() not in f.read():
                    continue
            os.kill(pid, signum)
        except (OSError, ProcessLookupError):
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "--signal":
        return signal_ranks(args[2], getattr(signal, f"SIG{args[1]}"))
    if len(args) != 1:
        usage = "usage: python -m gpulab.backend.slurm_launch [--signal SIG] JOB_DIR"
        print(usage, file=sys.stderr)
        return 2
    return launch(args[0])


if __name__ == "__main__":
    sys.exit(main())
