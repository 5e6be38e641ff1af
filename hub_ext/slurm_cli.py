"""``gpulab slurm-sandbox up|down``: a throwaway Slurm cluster on this machine for gpulab.

``up --nodes N [--gpus SPEC] [--spawner] [--hybrid] --data-dir DIR`` starts munge,
``slurmctld`` and one ``slurmd`` per node in network namespaces
(:mod:`gpulab.backend.slurm_sandbox`) under ``DIR/slurm/`` and writes
``DIR/gpulab_config.py`` so that ``gpulab up --data-dir DIR`` runs jobs (and, with
the Slurm spawner, servers) on it. With ``--hybrid`` the site is two pools, the box
(its GPUs from ``gpulab up --simulate-gpus``) first and the Slurm cluster second,
so the cluster takes what does not fit on the box. The daemons keep running after
the command exits; ``down --data-dir DIR`` stops them and removes the namespaces,
links and ``DIR/slurm/``.

The config file is gpulab's usual override file (the hub and the service both
read it). ``up`` writes it between two marker lines and ``down`` removes that
block again, so other settings in the file stay as they were.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from gpulab.backend import slurm_sandbox

#: The sandbox's own folder inside gpulab's data dir.
SANDBOX_DIR = "slurm"
CONFIG = "gpulab_config.py"
BEGIN = "# --- gpulab slurm-sandbox: begin (written by `gpulab slurm-sandbox up`) ---"
END = "# --- gpulab slurm-sandbox: end ---"
#: ``--hybrid``: the box first (``auto`` tries it first), the Slurm cluster takes the
#: overflow. Endpoints go to the first pool with a serving backend: the box.
HYBRID_POOLS = (
    {"name": "box", "inventory": "local", "jobs": "local", "serving": "local"},
    {"name": "slurm", "inventory": "slurm", "jobs": "slurm"},
)
#: What ``gpulab up`` is told to simulate on the box of a hybrid site (one GPU, so a
#: demo fills it with one job and sees the next one go to Slurm).
HYBRID_BOX_GPUS = "1xA100-80GB"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "ip", "nsenter", "unshare")


class SandboxError(Exception):
    """Why the sandbox cannot start or stop; one line with the fix."""


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _pools_lines() -> list[str]:
    """``c.InventorySettings.pools = [...]``, one pool a line (an admin edits it by hand)."""
    rows = [
        "    {" + ", ".join(f'"{k}": "{v}"' for k, v in pool.items()) + "},"
        for pool in HYBRID_POOLS
    ]
    return [
        "# Two pools: the box first, then the Slurm cluster (`auto` tries them in this order).",
        "c.InventorySettings.pools = [",
        *rows,
        "]",
    ]


def _single_backend(line: str) -> bool:
    """A line that picks the site's one inventory or jobs backend: with pools each pool
    names its own, so a hybrid config leaves these out."""
    return line.lstrip("# ").startswith(
        ("c.InventorySettings.inventory_class", "c.GpuLabService.jobs_backend_class")
    )


def config_text(state: dict, hybrid: bool = False) -> str:
    """The lines of ``gpulab_config.py`` that point gpulab at this sandbox; with
    ``hybrid``, a site of two pools (:data:`HYBRID_POOLS`)."""
    data = Path(state["data_dir"])
    conf = data / "etc" / "slurm.conf"
    lines = [
        BEGIN,
        f"c.SlurmSite.slurm_conf = {str(conf)!r}",
        'c.GpuLabService.jobs_backend_class = "slurm"',
    ]
    if _module_exists("gpulab.backend.slurm_inventory"):
        lines.append('c.InventorySettings.inventory_class = "slurm"')
        # The sandbox's GPUs are GRES without hardware: nothing to pin ranks to.
        lines.append("c.SlurmInventory.simulated = True")
    else:  # the inventory is not part of this installation yet
        lines.append('# c.InventorySettings.inventory_class = "slurm"  (no slurm_inventory module)')
    try:  # the Slurm spawner's settings for this sandbox, where it is installed
        from gpulab.spawner.slurm import sandbox_settings as settings
    except ImportError:
        settings = None
    if settings is not None:
        info = {
            "data_dir": str(data),
            "slurm_conf": str(conf),
            "controller_address": state["ctl_addr"],
            "nodes": [{"name": n["name"], "address": n["addr"]} for n in state["nodes"]],
            "spawner": bool(state.get("spawner")),
        }
        lines.append(settings(info).rstrip("\n"))
    if hybrid:
        lines = [line for line in "\n".join(lines).split("\n") if not _single_backend(line)]
        pools = _pools_lines()
        if state.get("spawner"):  # servers are Slurm jobs: their slices are the cluster's
            pools.append('c.InventorySettings.server_pool = "slurm"')
        lines[2:2] = pools
    lines.append(END)
    return "\n".join(lines) + "\n"


def _without_block(text: str) -> str:
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == BEGIN:
            inside = True
        elif line.rstrip("\n") == END and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def write_config(data_dir: Path, state: dict, hybrid: bool = False) -> Path:
    path = data_dir / CONFIG
    old = _without_block(path.read_text()) if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    path.write_text(old + config_text(state, hybrid=hybrid))
    return path


def remove_config(data_dir: Path) -> None:
    path = data_dir / CONFIG
    if path.exists():
        rest = _without_block(path.read_text())
        if rest.strip():
            path.write_text(rest)
        else:
            path.unlink()


def _preflight() -> None:
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        raise SandboxError(
            f"{', '.join(missing)} not found: apt-get install slurm-wlm munge "
            f"(iproute2 and util-linux for ip/nsenter/unshare)"
        )
    if os.geteuid() != 0:
        raise SandboxError(
            "the Slurm sandbox needs root (network namespaces, daemons as root): run it with sudo"
        )


def up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    _preflight()
    sandbox = data_dir / SANDBOX_DIR
    state = slurm_sandbox.load_state(sandbox)
    if state is not None and state.get("up") and slurm_sandbox.running(state):
        raise SandboxError(
            f"a Slurm sandbox is already up in {sandbox}: run `gpulab slurm-sandbox "
            f"down --data-dir {args.data_dir}` first"
        )
    try:
        spec = slurm_sandbox.parse_gres(args.gpus)
    except ValueError as e:
        raise SandboxError(str(e)) from None
    if args.nodes < 1:
        raise SandboxError("--nodes must be 1 or more")
    try:
        slurm_sandbox.check_socket_room(sandbox, args.nodes)
    except ValueError as e:
        raise SandboxError(f"--data-dir: {e}") from None
    data_dir.mkdir(parents=True, exist_ok=True)
    # Users' jobs run as their own accounts and must reach the munge socket and
    # slurm.conf: the data dir is passable (gpulab up makes it 0711 as root too).
    os.chmod(data_dir, os.stat(data_dir).st_mode | 0o711)
    sandbox.mkdir(exist_ok=True)
    os.chmod(sandbox, 0o755)
    gres = ",".join(f"{k}:{v}" for k, v in spec.items())
    try:
        state = slurm_sandbox.start(sandbox, args.nodes, gres)
    except (RuntimeError, OSError) as e:
        raise SandboxError(f"the sandbox did not start: {e}") from None
    hybrid = args.hybrid
    config = write_config(data_dir, {**state, "spawner": args.spawner}, hybrid=hybrid)
    start = f"gpulab up --data-dir {args.data_dir}"
    if hybrid:
        start += f" --simulate-gpus {HYBRID_BOX_GPUS}"
    pools = "\n  pools: box (this machine, first), then slurm (the nodes)" if hybrid else ""
    conf = slurm_sandbox.env(sandbox)["SLURM_CONF"]
    nodes = "\n".join(f"    {n['name']}  {n['addr']}  {gres or 'no GPUs'}" for n in state["nodes"])
    print(
        f"""Slurm sandbox up in {state.get("start_seconds")}s: cluster {state["cluster"]}, \
controller {state["ctl_addr"]}:{state["ctl_port"]}
  nodes:
{nodes}
  files: {sandbox} (logs in {sandbox / "log"})
  gpulab settings written to {config}{pools}

Start gpulab on it:     {start}
Use Slurm directly:     SLURM_CONF={conf} sinfo
Remove it all:          gpulab slurm-sandbox down --data-dir {args.data_dir}""",
        flush=True,
    )
    return 0


def down(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    sandbox = data_dir / SANDBOX_DIR
    if slurm_sandbox.load_state(sandbox) is None and not sandbox.exists():
        print(f"no Slurm sandbox in {data_dir}: nothing to do")
        remove_config(data_dir)
        return 0
    if os.geteuid() != 0:
        raise SandboxError("stopping the Slurm sandbox needs root: run it with sudo")
    slurm_sandbox.stop(sandbox)
    shutil.rmtree(sandbox, ignore_errors=True)
    remove_config(data_dir)
    print(f"Slurm sandbox in {data_dir} stopped and removed")
    return 0


def add_parser(sub) -> None:
    """``gpulab slurm-sandbox`` and its ``up``/``down`` (called by hub_ext.cli)."""
    s = sub.add_parser(
        "slurm-sandbox",
        help="start or remove a throwaway Slurm cluster on this machine (needs root)",
        description="A Slurm cluster for tests and demos: munge, slurmctld and one slurmd "
        "per node in network namespaces, simulated GPUs as GRES. Needs root and "
        "Debian's slurm-wlm and munge.",
    )
    actions = s.add_subparsers(dest="action", required=True)
    u = actions.add_parser(
        "up",
        help="start the cluster and point <data-dir>/gpulab_config.py at it",
        description="Start the cluster (it keeps running after this command) and write "
        "<data-dir>/gpulab_config.py so `gpulab up --data-dir DIR` uses it.",
    )
    u.add_argument("--nodes", type=int, default=2, help="compute nodes (default 2)")
    u.add_argument(
        "--gpus",
        default="gpu:2,shard:40",
        metavar="SPEC",
        help="simulated GPUs per node as Slurm GRES (default gpu:2,shard:40: 2 GPUs, "
        "20 shards each, so 1/10, 1/4 and 1/2 GPU are whole shards); '' for none",
    )
    u.add_argument(
        "--spawner",
        action="store_true",
        help="also start users' servers as Slurm jobs (the gpulab-slurm spawner)",
    )
    u.add_argument(
        "--hybrid",
        action="store_true",
        help="a site of two pools: this machine (the box, its GPUs from `gpulab up "
        "--simulate-gpus SPEC`) first, the Slurm cluster second for what does not fit",
    )
    u.add_argument(
        "--data-dir",
        required=True,
        help="gpulab's data dir (the sandbox lives in <data-dir>/slurm)",
    )
    u.set_defaults(func=run_up)
    d = actions.add_parser("down", help="stop the cluster and remove everything it made")
    d.add_argument("--data-dir", required=True, help="the data dir given to `up`")
    d.set_defaults(func=run_down)


def _run(action, args: argparse.Namespace) -> int:
    try:
        return action(args)
    except SandboxError as e:
        print(f"gpulab slurm-sandbox: {e}", file=sys.stderr)
        return 1


def run_up(args: argparse.Namespace) -> int:
    return _run(up, args)


def run_down(args: argparse.Namespace) -> int:
    return _run(down, args)
