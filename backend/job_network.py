"""A job's own network namespace on this machine, for the local backend.

Why: what a torchrun job listens on (the c10d rendezvous store, rank 0's store,
gloo's and NCCL's ports, whatever the cell opens) accepts any client that can
connect, and torch's c10d rendezvous unpickles the state any client writes under
``torch.rendezvous.<id>``. In the host's namespace every local account can connect
(the job id and port are in every account's ``/proc/*/cmdline``), and the stores
listen on all interfaces, so other machines can too. In a namespace of its own,
holding ``lo`` and a tap device that takes no connection in, the job's ports exist
for the job's own processes only.

- **create**: ``ip netns add gpulab-job-<id>`` (a bind mount under ``/run/netns``,
  so the namespace outlives a restart of the service, as the agents do) with ``lo``
  up; with ``outbound``, a slirp4netns process (started as root, in a session of
  its own, sandboxed: it drops its capabilities once the tap is made) NATs the
  namespace's connections out through the host and forwards no port in.
- **enter**: :meth:`Network.popen` forks the node agent from a thread that has
  joined the namespace (``setns(2)`` applies to the calling thread; a child is born
  in its thread's namespaces). Wrapping the argv in ``ip netns exec`` or ``nsenter``
  would not do: the cgroup launch drops to the owner's uid in the child before exec,
  and entering a namespace needs root.
- **delete**: :func:`delete` ends the slirp4netns process and removes the
  namespace. Both are found from the job id alone (a restarted service, a job that
  failed half-way through its start), not from a file a job could write.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from traitlets import Bool, Enum
from traitlets.config import Configurable

log = logging.getLogger("gpulab.job_network")

NETNS_DIR = "/run/netns"
PREFIX = "gpulab-job-"
#: Inside a namespace of its own the job has every port: the rendezvous takes a fixed one.
PRIVATE_RDZV_PORT = 29400
_CLONE_NEWNET = 0x40000000
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_READY_S = 10.0


def _nameable(job_id: str) -> bool:
    return bool(_SAFE_ID.match(job_id)) and not job_id.startswith(".")


def netns_name(job_id: str) -> str:
    if not _nameable(job_id):
        raise ValueError(f"job id {job_id!r} cannot name a network namespace")
    return PREFIX + job_id


def netns_path(job_id: str) -> str:
    return os.path.join(NETNS_DIR, netns_name(job_id))


class JobNetworkError(RuntimeError):
    """A job that should have a network of its own could not be given one."""


class JobNetwork(Configurable):
    """Which network a local job's nodes run in."""

    mode = Enum(
        ["private", "host"],
        default_value="private",
        config=True,
        help="""The network of a job on the local backend.

        private: with per-user accounts (gpulab run as root), each job's nodes run in
        a network namespace of the job's own: the rendezvous store, rank 0's store,
        gloo's ports and anything the cell listens on are out of reach of other users'
        processes and of other machines. host: the host's network, as the service's
        own processes use it; every local account (and, for ports on all interfaces,
        every machine that reaches this one) can connect to what the job listens on:
        read and write its rendezvous and stores, join it as a node (the job
        restarts), break its start. Without accounts every job runs in the host's
        network (all work runs as one account anyway).

        c.JobNetwork.mode = "host"
        """,
    )
    outbound = Bool(
        True,
        config=True,
        help="""Whether a job in its own network namespace may open connections out
        (pip, dataset downloads), through slirp4netns: connections out are NATed
        through the host, none come in. False: the job has its loopback only.

        c.JobNetwork.outbound = False
        """,
    )
    host_loopback = Bool(
        False,
        config=True,
        help="""Whether a job in its own network namespace reaches the host's
        127.0.0.1 (as 10.0.2.2). Off by default: services bound to the host's loopback
        (the hub, users' servers and kernels, other jobs in the host network) trust
        local callers, and a job is not one of them.

        c.JobNetwork.host_loopback = True
        """,
    )

    def why_host(self, separated: bool) -> str | None:
        """Why a job runs in the host's network; None when it gets one of its own."""
        if not separated:
            return "every job runs as the service's account here"
        if self.mode == "host":
            return (
                'c.JobNetwork.mode = "host": other local users and other machines '
                "can connect to what the job listens on"
            )
        if os.geteuid() != 0:
            return "a network namespace needs root"
        if shutil.which("ip") is None:
            return "no network namespace: `ip` is missing (install iproute2)"
        return None

    def open(self, job_id: str, separated: bool, log_path: str | None = None) -> Network:
        """The network for job ``job_id``, made now (blocking: a few ``ip`` calls)."""
        why = self.why_host(separated)
        if why is not None:
            return Network(None, note=f"network: the host's ({why})" if separated else "")
        delete(job_id)  # a namespace left by an earlier run of this job
        name = netns_name(job_id)
        try:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        except (OSError, subprocess.SubprocessError) as e:
            delete(job_id)
            # Not the host's network instead: there every account could connect to its
            # rendezvous store and its ranks' ports, and send them what they unpickle.
            raise JobNetworkError(
                f"the job's network namespace could not be made ({e}); without one, other "
                "accounts could connect to its rendezvous and its ranks. Fix `ip netns add` "
                'on this host, or set c.JobNetwork.mode = "host" to run jobs in the '
                "host's network"
            ) from None
        if not self.outbound:
            return Network(
                name, note=f"network: {name}, loopback only (c.JobNetwork.outbound = False)"
            )
        pid, problem = start_outbound(job_id, self.host_loopback, log_path)
        if pid is None:
            log.warning("Job %s has no outbound network: %s", job_id, problem)
            return Network(name, note=f"network: {name}, loopback only (no outbound: {problem})")
        note = (
            f"network: {name}; outbound through slirp4netns, nothing reaches the job from outside"
        )
        resolver = loopback_resolver()
        if resolver:
            note += (
                f"; names may not resolve: the host's resolver {resolver} is on its "
                "loopback, which the job does not share"
            )
        return Network(name, outbound_pid=pid, note=note)


@dataclass
class Network:
    """Where a job's nodes run: a namespace of its own (``name``), or the host's (None)."""

    name: str | None
    outbound_pid: int | None = None
    #: One line for the job's log (empty: nothing to say).
    note: str = ""

    @property
    def private(self) -> bool:
        return self.name is not None

    def record(self) -> dict:
        """What ``launch.json`` keeps, for people reading it (cleanup needs only the id)."""
        return {"netns": self.name, "outbound_pid": self.outbound_pid}

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        """``subprocess.Popen(*args, **kwargs)``, the child born in this network."""
        if self.name is None:
            return subprocess.Popen(*args, **kwargs)
        return run_inside(os.path.join(NETNS_DIR, self.name), subprocess.Popen, *args, **kwargs)


def run_inside(path: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread that joined the network namespace at ``path``;
    processes it forks are born there. The thread ends with the call, and with it its
    namespace: the service's own threads never leave the host's."""
    out: dict = {}

    def body() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc().setns(fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns {path}: {os.strerror(code)}")
            finally:
                os.close(fd)
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    thread = threading.Thread(target=body, name="gpulab-netns", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def start_outbound(
    job_id: str, host_loopback: bool, log_path: str | None
) -> tuple[int | None, str]:
    """Start slirp4netns for the job's namespace: ``(pid, "")``, or ``(None, why not)``.

    It runs in a mount namespace of its own (``unshare --propagation private``): its
    sandbox unmounts what it does not need, and on the host's shared mounts that
    would unmount every job's namespace file."""
    exe = shutil.which("slirp4netns")
    if exe is None:
        return None, "slirp4netns is missing (install slirp4netns)"
    if shutil.which("unshare") is None:
        return None, "unshare is missing (install util-linux)"
    read_end, write_end = os.pipe()
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        exe,
        "--configure",
        "--mtu=65520",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--ready-fd={write_end}",
        "--netns-type=path",
        *([] if host_loopback else ["--disable-host-loopback"]),
        netns_path(job_id),
        "tap0",
    ]
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    log = os.open(log_path or os.devnull, flags if log_path else os.O_WRONLY, 0o600)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(write_end,),
            # A session of its own: it outlives a restart of the service, as the agents do.
            start_new_session=True,
        )
    finally:
        os.close(write_end)
        os.close(log)
    try:
        ready, _, _ = select.select([read_end], [], [], _READY_S)
        ok = bool(ready) and os.read(read_end, 1) == b"1"
    finally:
        os.close(read_end)
    _STARTED[proc.pid] = proc
    if ok:
        return proc.pid, ""
    _end(proc.pid)
    return None, f"slirp4netns did not start (see {log_path})" if log_path else "slirp4netns failed"


def delete(job_id: str) -> None:
    """End the job's slirp4netns and remove its namespace; nothing if there is none."""
    if not _nameable(job_id):
        return  # no namespace could have been made for it
    path = netns_path(job_id)
    for pid in outbound_pids(job_id):
        _end(pid)
    if os.path.exists(path):
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _ip("netns", "delete", netns_name(job_id))


def exists(job_id: str) -> bool:
    return os.path.exists(netns_path(job_id))


def outbound_pids(job_id: str) -> list[int]:
    """The root slirp4netns processes serving the job's namespace (read from /proc,
    so only processes whose command line names that namespace's file)."""
    want = netns_path(job_id).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != 0:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if want in args and any(a.endswith(b"slirp4netns") for a in args):
            found.append(int(entry))
    return found


def loopback_resolver() -> str | None:
    """The host's first nameserver when it is on the host's loopback (e.g. systemd-resolved's
    127.0.0.53), which a job in a namespace of its own cannot reach."""
    try:
        with open("/etc/resolv.conf") as f:
            servers = [
                ln.split()[1] for ln in f if ln.startswith("nameserver") and len(ln.split()) > 1
            ]
    except OSError:
        return None
    if servers and all(s.startswith("127.") or s == "::1" for s in servers):
        return servers[0]
    return None


#: The slirp4netns processes this service started, to reap (a restarted service's
#: were started by the one before it; init reaps those).
_STARTED: dict[int, subprocess.Popen] = {}


def _end(pid: int) -> None:
    """SIGTERM, and SIGKILL if it lingers."""
    child = _STARTED.pop(pid, None)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if child is not None and child.poll() is not None:
                return
            if child is None and not _alive(pid):
                return
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(errno.EIO, f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC
