"""What ``srun`` starts on every node of a Slurm job: that node's torchrun agent.

``python -m gpulab.backend.slurm_launch JOB_DIR``, once per node (``srun
--ntasks-per-node=1``). One ``srun`` runs the same command everywhere, but the
torchrun command line differs per node (node rank, ``is_host``, log dir), so the
backend rendered every node at submit (:mod:`.render`) into
``JOB_DIR/slurm/node<R>.json`` with placeholders this launcher fills in:

``@HEAD@``  the node that hosts the rendezvous store (``$GPULAB_RDZV_HOST``,
            set by the batch script);
``@SELF@``  this node's own host name (torchrun's ``--local-addr``);
``@PORT@``  the rendezvous port, derived from the Slurm job id.

``slurm/nodes.json`` maps Slurm node names to node ranks (where the ledger put
each node's slices); without an entry the node rank is ``$SLURM_NODEID``.

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

#: Rendezvous ports are 29500 + (Slurm job id mod this): two jobs sharing a node
#: get different ports unless their ids are this far apart.
PORT_SPAN = 2000


def rdzv_port(slurm_job_id: str) -> int:
    return 29500 + int(slurm_job_id or 0) % PORT_SPAN


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


def launch(job_dir: str) -> int:
    rank = node_rank(job_dir)
    with open(os.path.join(job_dir, "slurm", f"node{rank}.json")) as f:
        node = json.load(f)
    values = {
        "@HEAD@": os.environ.get("GPULAB_RDZV_HOST") or socket.gethostname(),
        "@SELF@": socket.gethostname(),
        "@PORT@": str(rdzv_port(os.environ.get("SLURM_JOB_ID", "0"))),
    }
    argv = [fill(a, values) for a in node["argv"]]
    # Only what the backend chose (PASS_ENV, the account's HOME/USER, render_node's
    # variables): nothing of the batch environment leaks into user code.
    env = {k: fill(v, values) for k, v in node["env"].items()}
    log = os.open(
        os.path.join(job_dir, "logs", f"node{rank}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )
    proc = subprocess.Popen(
        argv, env=env, cwd=job_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    os.close(log)

    def forward(signum, _frame):
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = proc.wait()
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
