"""A throwaway Slurm cluster on this machine: munge, slurmctld and one slurmd per node.

Each node is a network namespace (plus its own UTS namespace, so ``hostname``
prints the node name) joined to a bridge in the root namespace by a veth pair,
with a private 10.x address. ``slurmctld`` and ``munged`` run in the root
namespace (munge's Unix socket is a file path, so every namespace reaches it);
client commands (``srun``, ``sbatch``...) run anywhere with ``SLURM_CONF``
pointing at ``DATA/etc/slurm.conf``. Simulated GPUs are GRES whose ``File=`` is
``DATA/dev/nvidiaN``, a character device with /dev/null's numbers (Slurm wants a
device for gpu when shard is configured, and for CUDA_VISIBLE_DEVICES). Everything
lives under the data dir, except the network namespaces themselves
(``/run/netns/<ns>``), a bridge and one veth pair per node.

``start`` and ``stop`` need root. ``DATA/state.json`` lists what ``start``
created (written as it goes) and ``stop`` removes exactly that; both are
idempotent. Installs nothing: Debian's ``slurm-wlm`` and ``munge`` must be there.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

STATE = "state.json"
PARTITION = "main"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


def _save(data: Path, state: dict) -> None:
    tmp = data / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(data / STATE)


def load_state(data_dir: str | os.PathLike) -> dict | None:
    path = Path(data_dir) / STATE
    return json.loads(path.read_text()) if path.exists() else None


def env(data_dir: str | os.PathLike) -> dict[str, str]:
    """The variables a Slurm client command needs to talk to this sandbox."""
    return {"SLURM_CONF": str(Path(data_dir).resolve() / "etc" / "slurm.conf")}


def parse_gres(gpus_spec: str | None) -> dict[str, int]:
    """``"gpu:2,shard:8"`` -> ``{"gpu": 2, "shard": 8}`` (per node); ``""``/None -> {}."""
    out: dict[str, int] = {}
    for part in (gpus_spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition(":")
        if name not in ("gpu", "shard") or not count.isdigit() or int(count) < 1:
            raise ValueError(f"bad GRES {part!r}: write gpu:N or shard:N, e.g. gpu:2,shard:8")
        out[name] = int(count)
    if "shard" in out and "gpu" not in out:
        raise ValueError("shard needs gpu: write e.g. gpu:2,shard:8")
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _slurm_conf(state: dict, data: Path) -> str:
    gres = state["gres"]
    lines = [
        f"ClusterName={state['cluster']}",
        f"SlurmctldHost={state['ctl_host']}({state['ctl_addr']})",
        f"SlurmctldPort={state['ctl_port']}",
        f"SlurmdPort={state['slurmd_port']}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={data}/munge/munge.socket",
        f"StateSaveLocation={data}/state",
        f"SlurmdSpoolDir={data}/spool/%n",
        f"SlurmctldPidFile={data}/run/slurmctld.pid",
        f"SlurmdPidFile={data}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={data}/log/slurmctld.log",
        f"SlurmdLogFile={data}/log/slurmd-%n.log",
        f"PlugStackConfig={data}/etc/plugstack.conf",
        # No cgroups: this VM's cgroup hierarchy is not delegated to us.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        # Users see only their own jobs in squeue/scontrol (root sees all).
        "PrivateData=jobs",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        # Nodes declare what the spec says, not what this VM has.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=60",
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
    ]
    if gres:
        lines.append("GresTypes=" + ",".join(sorted(gres)))
    node_gres = ",".join(f"{k}:{v}" for k, v in sorted(gres.items()))
    for node in state["nodes"]:
        line = (
            f"NodeName={node['name']} NodeAddr={node['addr']} NodeHostname={node['name']}"
            f" CPUs={state['cpus']} RealMemory=1000 State=UNKNOWN"
        )
        if node_gres:
            line += f" Gres={node_gres}"
        lines.append(line)
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _gres_conf(state: dict, data: Path) -> str:
    # gres/shard refuses a gpu without File= ("SHARING configuration lacks File"), so
    # each simulated GPU is DATA/dev/nvidiaN, a character device with /dev/null's
    # numbers (task/none puts no device cgroup around it). The number in the name is the index
    # Slurm writes into CUDA_VISIBLE_DEVICES.
    lines = ["AutoDetect=off"]
    gres = state["gres"]
    for node in state["nodes"]:
        if gres.get("gpu"):
            last = gres["gpu"] - 1
            files = f"{data}/dev/nvidia[0-{last}]" if last else f"{data}/dev/nvidia0"
            lines.append(f"NodeName={node['name']} Name=gpu File={files} Flags=nvidia_gpu_env")
        if gres.get("shard"):
            lines.append(f"NodeName={node['name']} Name=shard Count={gres['shard']}")
    return "\n".join(lines) + "\n"


def _spawn(argv: list[str], log: Path) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # slurmd makes each job's spool folder (with the batch script the owner's
            # account runs) under its umask: a private one (077, as the gpulab service
            # sets) would leave users' jobs unable to run their own script.
            umask=0o022,
        )
    return proc.pid


def _alive(pid: int, needle: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return needle in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def running(state: dict) -> bool:
    """Are all the sandbox's daemons still running?"""
    conf = str(Path(state["data_dir"]) / "etc" / "slurm.conf")
    return all(
        _alive(pid, "munged" if name == "munged" else conf) for name, pid in state["pids"].items()
    )


def _wait_for(
    what: str, ok, timeout: float, log: Path | None = None, pids: dict | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        for name, pid in (pids or {}).items():
            _reap(pid)
            if not Path(f"/proc/{pid}").exists():
                logfile = log.parent / f"{name.replace('slurmd:', 'slurmd-')}.out" if log else None
                tail = logfile.read_text()[-2000:] if logfile and logfile.exists() else ""
                raise RuntimeError(f"slurm sandbox: {name} exited\n{tail}")
        time.sleep(0.1)
    tail = log.read_text()[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"slurm sandbox: {what} not ready after {timeout:.0f}s\n{tail}")


def start(
    data_dir: str | os.PathLike,
    nodes: int = 2,
    gpus_spec: str | None = "gpu:2,shard:40",
    *,
    cpus: int = 16,
    timeout: float = 60,
) -> dict:
    """Bring the sandbox up (or return the state of the one already up there)."""
    # Its folders (config, spool, munge socket) must be reachable by users' jobs,
    # whatever umask the caller runs with (the gpulab service uses 077).
    umask = os.umask(0o022)
    try:
        return _start(data_dir, nodes, gpus_spec, cpus=cpus, timeout=timeout)
    finally:
        os.umask(umask)


#: Unix socket paths are at most 108 bytes, the final NUL included.
SOCKET_PATH_MAX = 107


def check_socket_room(data: Path, nodes: int) -> None:
    """slurmstepd listens on ``spool/<node>/<node>_<job>.<step>`` under the data dir;
    if that path is too long for a Unix socket every step fails with "Unspecified
    error". Count the longest: a 5-digit tag, 8-digit job ids, the batch step's id."""
    node = f"sb{'0' * 5}n{nodes - 1}"
    longest = len(f"{data}/spool/{node}/{node}_{'9' * 8}.{2**32 - 5}")
    if longest > SOCKET_PATH_MAX:
        room = len(str(data)) - (longest - SOCKET_PATH_MAX)
        raise ValueError(
            f"the data dir {data} is {len(str(data))} characters long: Slurm's sockets "
            f"under it would not fit a Unix socket path; use one of at most {room} "
            "characters, e.g. /var/tmp/gpulab-slurm"
        )


def _start(
    data_dir: str | os.PathLike, nodes: int, gpus_spec: str | None, *, cpus: int, timeout: float
) -> dict:
    if os.geteuid() != 0:
        raise PermissionError("the Slurm sandbox needs root (namespaces, daemons as root)")
    for tool in ("munged", "slurmctld", "slurmd", "srun", "ip", "unshare", "nsenter"):
        if not shutil.which(tool):
            raise FileNotFoundError(f"{tool} not found: apt-get install -y slurm-wlm munge")
    data = Path(data_dir).resolve()
    check_socket_room(data, nodes)
    existing = load_state(data)
    if existing and existing.get("up") and running(existing):
        return existing
    if existing:
        stop(data)
    # Each start is a new cluster (new name, nodes, ports): slurmctld refuses a
    # StateSaveLocation written under another ClusterName ("CLUSTER NAME MISMATCH").
    for sub in ("state", "spool", "run"):
        shutil.rmtree(data / sub, ignore_errors=True)
    for sub in ("munge", "etc", "state", "spool", "log", "run"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    # Users' srun/sbatch (jobs run as their owners) need the munge socket: the dir is
    # world-readable, the key inside it root-only.
    os.chmod(data / "munge", 0o755)
    tag = f"{os.getpid() % 10000:04d}{random.randint(0, 9)}"
    used = _run("ip", "-o", "-4", "addr").stdout + _run("ip", "-4", "route").stdout
    subnet = ""
    while not subnet or f" {subnet}." in used:
        subnet = f"10.{random.randint(64, 127)}.{random.randint(0, 255)}"
    state: dict = {
        "data_dir": str(data),
        "tag": tag,
        "cluster": f"gplsb{tag}",
        "ctl_host": socket.gethostname().split(".")[0],
        "ctl_addr": f"{subnet}.1",
        "ctl_port": _free_port(),
        "slurmd_port": _free_port(),
        "cpus": cpus,
        "gres": parse_gres(gpus_spec),
        "bridge": None,
        "nodes": [
            {
                "name": f"sb{tag}n{i}",
                "netns": f"gplsb{tag}n{i}",
                "veth": f"gsb{tag}v{i}",
                "peer": f"gsb{tag}p{i}",
                "addr": f"{subnet}.{10 + i}",
                "created": False,
            }
            for i in range(nodes)
        ],
        "pids": {},
        "up": False,
    }
    _save(data, state)
    t0 = time.monotonic()
    try:
        _configs(data, state)
        _network(data, state)
        _daemons(data, state, timeout)
    except BaseException:
        stop(data)
        raise
    state["up"] = True
    state["start_seconds"] = round(time.monotonic() - t0, 2)
    _save(data, state)
    return state


def _network(data: Path, state: dict) -> None:
    bridge = f"gsb{state['tag']}br"
    _run("ip", "link", "add", bridge, "type", "bridge")
    state["bridge"] = bridge
    _save(data, state)
    _run("ip", "addr", "add", f"{state['ctl_addr']}/24", "dev", bridge)
    _run("ip", "link", "set", bridge, "up")
    hosts = ["127.0.0.1 localhost", f"{state['ctl_addr']} {state['ctl_host']}"]
    hosts += [f"{n['addr']} {n['name']}" for n in state["nodes"]]
    (data / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
    # No DNS server is reachable from a node: without this every lookup of a name not
    # in the hosts file (getaddrinfo asks for IPv6 too) waits 2 x 5 s for the host's
    # nameserver. 127.0.0.1:53 inside the namespace refuses at once.
    (data / "etc" / "resolv.conf").write_text(
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
    )
    for node in state["nodes"]:
        ns = node["netns"]
        _run("ip", "netns", "add", ns)
        node["created"] = True
        _save(data, state)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        # The veth end in the root namespace goes on the bridge; its peer moves into the node.
        _run("ip", "link", "add", node["veth"], "type", "veth", "peer", "name", node["peer"])
        _run("ip", "link", "set", node["veth"], "master", bridge)
        _run("ip", "link", "set", node["veth"], "up")
        _run("ip", "link", "set", node["peer"], "netns", ns)
        _run("ip", "-n", ns, "addr", "add", f"{node['addr']}/24", "dev", node["peer"])
        _run("ip", "-n", ns, "link", "set", node["peer"], "up")
        _run("ip", "-n", ns, "route", "add", "default", "via", state["ctl_addr"])


def _configs(data: Path, state: dict) -> None:
    etc = data / "etc"
    (etc / "slurm.conf").write_text(_slurm_conf(state, data))
    (data / "dev").mkdir(exist_ok=True)
    for i in range(state["gres"].get("gpu", 0)):
        # A character device with /dev/null's numbers: slurmd rejects regular files
        # ("not a valid character or block device") and then sets no CUDA_VISIBLE_DEVICES.
        dev = data / "dev" / f"nvidia{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (etc / "gres.conf").write_text(_gres_conf(state, data))
    (etc / "plugstack.conf").write_text("")
    (etc / "cgroup.conf").write_text("")
    key = data / "munge" / "munge.key"
    if not key.exists():
        # Made 0400: written first and then chmodded, it was readable by everyone for
        # a moment, and the key forges any uid's credential.
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
    os.chmod(key, 0o400)


def _daemons(data: Path, state: dict, timeout: float) -> None:
    conf = str(data / "etc" / "slurm.conf")
    log = data / "log"
    sock = data / "munge" / "munge.socket"
    state["pids"]["munged"] = _spawn(
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={sock}",
            f"--key-file={data}/munge/munge.key",
            f"--pid-file={data}/run/munged.pid",
            f"--log-file={log}/munged.log",
            f"--seed-file={data}/munge/munged.seed",
        ],
        log / "munged.out",
    )
    _save(data, state)
    _wait_for("munged", sock.exists, timeout, log / "munged.log")
    state["pids"]["slurmctld"] = _spawn(
        ["slurmctld", "-D", "-i", "-f", conf], log / "slurmctld.out"
    )
    _save(data, state)
    for node in state["nodes"]:
        name = node["name"]
        (data / "spool" / name).mkdir(exist_ok=True)
        (data / "run" / f"cgroup-{name}").mkdir(exist_ok=True)
        # nsenter, not `ip netns exec`: the latter remounts /sys and so hides the cgroup
        # mounts that slurmd's cgroup plugin insists on finding (even with task/none).
        # Instead, in the node's own mount namespace (slave: later host mounts still
        # show), sysfs is remounted for the node's /sys/class/net and the cgroup tree
        # put back on top; the sandbox's hosts file (node names -> addresses) and
        # resolv.conf become the node's. Own UTS namespace: `hostname` is the node name.
        state["pids"][f"slurmd:{name}"] = _spawn(
            [
                "nsenter", f"--net=/run/netns/{node['netns']}",
                "unshare", "--uts", "--mount", "--propagation", "slave",
                "sh", "-c",
                'mount --rbind /sys/fs/cgroup "$3" && mount -t sysfs sysfs /sys'
                ' && mount --rbind "$3" /sys/fs/cgroup && umount -l "$3"'
                ' && mount --bind "$2/hosts" /etc/hosts'
                ' && mount --bind "$2/resolv.conf" /etc/resolv.conf'
                ' && hostname "$0" && exec slurmd -D -N "$0" -f "$1"',
                name, conf, str(data / "etc"), str(data / "run" / f"cgroup-{name}"),
            ],
            log / f"slurmd-{name}.out",
        )  # fmt: skip
        _save(data, state)
    cenv = {**os.environ, **env(data)}

    def all_idle() -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=cenv, capture_output=True, text=True
        )
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return len(states) == len(state["nodes"]) and all(s == "idle" for s in states.values())

    _wait_for("nodes idle", all_idle, timeout, log / "slurmctld.log", state["pids"])


def stop(data_dir: str | os.PathLike, timeout: float = 15) -> None:
    """Stop what ``start`` created under this data dir: daemons, tasks, namespaces, links."""
    data = Path(data_dir).resolve()
    state = load_state(data)
    if state is None:
        return
    conf = str(data / "etc" / "slurm.conf")
    # Processes left inside the node namespaces (job tasks, slurmstepd) go first.
    for node in state["nodes"]:
        if node.get("created"):
            _kill_netns(node["netns"])
    # slurmd, slurmctld, then munged (the others need munge to shut down cleanly).
    order = sorted(state["pids"], key=lambda k: (k != "munged", k.startswith("slurmd")))[::-1]
    for name in order:
        pid = state["pids"][name]
        needle = "munged" if name == "munged" else conf
        if _alive(pid, needle):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid, needle) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid, needle):
                os.kill(pid, signal.SIGKILL)
        _reap(pid)
    for node in state["nodes"]:
        if node.get("created"):
            _kill_netns(node["netns"])
            _run("ip", "netns", "del", node["netns"], check=False)
        # Deleting the namespace deletes the peer and with it the veth; this covers a
        # start that failed between creating the pair and moving the peer.
        _run("ip", "link", "del", node["veth"], check=False)
    if state.get("bridge"):
        _run("ip", "link", "del", state["bridge"], check=False)
    (data / STATE).unlink()


def _kill_netns(ns: str) -> None:
    for _ in range(50):
        out = _run("ip", "netns", "pids", ns, check=False)
        pids = [int(p) for p in out.stdout.split()] if out.returncode == 0 else []
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
        time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpulab.backend.slurm_sandbox")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--gpus", default="gpu:2,shard:40")
    up.add_argument("--data-dir", required=True)
    down = sub.add_parser("down")
    down.add_argument("--data-dir", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "up":
        state = start(args.data_dir, args.nodes, args.gpus)
        print(f"export SLURM_CONF={env(args.data_dir)['SLURM_CONF']}")
        print(
            f"# up in {state.get('start_seconds')}s: " + " ".join(n["name"] for n in state["nodes"])
        )
    else:
        stop(args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
