"""CPU, memory and GPU-device limits for a process group, by the host's own means.

``Cgroups.detect()`` picks what the host offers, best first:

==========  ==========================================  =====================================
kind        when                                        how a group is held
==========  ==========================================  =====================================
systemd     systemd is PID 1 and gpulab is root         a transient scope per group,
                                                        ``gpulab-<account>-<unit>.scope`` in
                                                        ``gpulab-<account>.slice``, started by
                                                        ``systemd-run --scope`` (as
                                                        systemdspawner does): ``CPUQuota``,
                                                        ``MemoryMax``, ``MemorySwapMax=0``,
                                                        ``TasksMax``,
                                                        ``DevicePolicy=closed`` + ``DeviceAllow``
cgroup2     a unified hierarchy with cpu and memory     ``<hub's cgroup>/gpulab/<account>/<unit>``:
            controllers we may delegate                 ``cpu.max``, ``memory.max``,
                                                        ``memory.swap.max=0``; no device rule
                                                        (cgroup v2 wants an eBPF program)
cgroup1     per-controller hierarchies (cpu, memory,    ``<controller>/<hub's cgroup>/gpulab/
            devices, pids), gpulab is root              <account>/<unit>``: ``cpu.cfs_quota_us``,
                                                        ``memory.limit_in_bytes`` (+ ``memsw``),
                                                        ``devices.deny`` for other cards,
                                                        ``pids.max``
none        none of these                               nothing; ``describe()`` says why
==========  ==========================================  =====================================

This module holds what they share; ``cgroupfs`` the v1/v2 directories,
``cgroups_systemd`` the scopes.

The process joins its group before it drops privileges and execs, so nothing
it runs ever ran outside; the group's files belong to root, so the user cannot
move out of it or raise its limits.

Integration (the spawner, the local job and serving backends)::

    from gpulab.enforcement.cgroups import Cgroups
    from gpulab.enforcement.limits import limits_for_slice

    CGROUPS = Cgroups.detect()                      # once per process
    limits = limits_for_slice(250, cpu_per_gpu=8, memory_per_gpu=64 * 2**30,
                              gpu_devices=("/dev/nvidia0",))
    group = CGROUPS.create("alice/server", limits)  # idempotent
    argv, kwargs = group.launch(argv, **account.popen_kwargs())  # user/group/extra_groups
    proc = subprocess.Popen(argv, env=env, cwd=home, start_new_session=True, **kwargs)
    ...                                             # the process group ends
    group.remove()                                  # kills stragglers, removes empty groups

``launch`` replaces ``Popen(user=, group=, extra_groups=)``: Python applies
those *before* ``preexec_fn``, when it is too late to join a root-owned group.
Under systemd it prefixes ``systemd-run --scope … -- setpriv …`` instead. Code
that drops privileges itself may chain ``group.join_in_child`` before its own
step (cgroup v1/v2 only). After a restart, ``CGROUPS.open("alice/server")``
finds a group again to remove it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import time
from collections.abc import Callable, Sequence

from .gpu_nodes import DeviceNode, host_gpu_nodes, node_of
from .limits import Limits, format_limits, limits_in_words

CFS_PERIOD_US = 100_000
V1_CONTROLLERS = ("cpu", "memory", "devices", "pids")
KNOWN_V1 = frozenset(
    {
        "cpu",
        "cpuacct",
        "cpuset",
        "memory",
        "devices",
        "freezer",
        "net_cls",
        "blkio",
        "perf_event",
        "net_prio",
        "hugetlb",
        "pids",
        "rdma",
        "misc",
    }
)
_SAFE_SEGMENT = re.compile(r"[A-Za-z0-9_.@+-]")
LABELS = {
    "systemd": "systemd",
    "cgroup2": "cgroup v2",
    "cgroup1": "cgroup v1",
    "none": "not enforced",
}


class CgroupError(RuntimeError):
    """A group could not be made or changed; the message says which file and why."""

    errno: int | None = None


# -- what the host has (pure parsers, tested on literal text) -------------------------
def parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """``/proc/<pid>/cgroup`` -> ({v1 controller: path}, v2 path or None)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if parts[0] == "0" and controllers == "":
            v2 = path
            continue
        for c in controllers.split(","):
            if c in KNOWN_V1:
                v1[c] = path
    return v1, v2


def parse_cgroup_mounts(
    mountinfo: str,
) -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """``/proc/self/mountinfo`` -> ({v1 controller: (mountpoint, root)}, (v2 mountpoint, root))."""
    v1: dict[str, tuple[str, str]] = {}
    v2 = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2" and v2 is None:
            v2 = (mountpoint, root)
        elif tail[0] == "cgroup":
            for opt in tail[2].split(","):
                if opt in KNOWN_V1:
                    v1.setdefault(opt, (mountpoint, root))
    return v1, v2


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_dir(mountpoint: str, mount_root: str, path: str) -> str:
    """The directory of cgroup ``path`` in a hierarchy mounted from ``mount_root``."""
    root = mount_root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return os.path.join(mountpoint, path.lstrip("/")).rstrip("/")


def segment(name: str) -> str:
    """One path segment of a group name, safe for the cgroup filesystem."""
    out = "".join(ch if _SAFE_SEGMENT.fullmatch(ch) else f"%{ord(ch):02X}" for ch in name)
    return out.replace(".", "%2E") if out in (".", "..") else out


def group_path(name: str) -> str:
    parts = [segment(p) for p in name.split("/") if p]
    if not parts:
        raise ValueError(
            f"a group name needs at least one segment, e.g. 'alice/server'; got {name!r}"
        )
    return "/".join(parts)


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_text(path: str, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        error = CgroupError(f"cannot write {value!r} to {path}: {exc.strerror}")
        error.errno = exc.errno
        raise error from exc


def _nodes(gpu_nodes) -> Callable[[], list[DeviceNode]]:
    """``gpu_nodes`` as given to ``detect``: None (the host's), paths, or a callable."""
    if gpu_nodes is None:
        return host_gpu_nodes
    if callable(gpu_nodes):
        return gpu_nodes
    nodes = [n for n in (node_of(p) for p in gpu_nodes) if n is not None]
    return lambda: nodes


# -- the mechanism ---------------------------------------------------------------------
class Cgroups:
    """The host's way of holding a process group to ``Limits``; ``create`` groups."""

    kind = "none"

    def __init__(self, reason: str = "", root: str = "gpulab", gpu_nodes=None):
        self.reason = reason
        self.root = root
        self.gpu_nodes = _nodes(gpu_nodes)

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    @classmethod
    def detect(
        cls,
        mechanism: str = "auto",
        root: str = "gpulab",
        parent: str | None = None,
        gpu_nodes: Sequence[str] | Callable[[], list[DeviceNode]] | None = None,
    ) -> Cgroups:
        """The best mechanism this host offers (or ``mechanism`` if it is usable).

        ``parent`` is a cgroup path (``/gpulab-parent``) to put groups under
        instead of gpulab's own cgroup; ``gpu_nodes`` overrides the list of
        device nodes counted as GPUs (tests use ``/dev/null``).
        """
        if mechanism not in ("auto", *LABELS):
            raise ValueError(f"mechanism {mechanism!r}: choose auto, {', '.join(LABELS)}")
        kw = {"root": root, "gpu_nodes": gpu_nodes}
        if mechanism == "none":
            return Cgroups("switched off by configuration", **kw)
        if os.geteuid() != 0:
            return Cgroups("gpulab is not running as root, so it cannot create cgroups", **kw)
        reasons = []
        for kind in ("systemd", "cgroup2", "cgroup1"):
            if mechanism not in ("auto", kind):
                continue
            made = _mechanism(kind).probe(parent=parent, **kw)
            if isinstance(made, Cgroups):
                return made
            reasons.append(f"{LABELS[kind]}: {made}")
        return Cgroups("; ".join(reasons) or "no cgroup filesystem", **kw)

    def create(self, name: str, limits: Limits) -> Group:
        return Group(self, name, limits, notes=[self.reason] if not limits.unlimited else [])

    def open(self, name: str) -> Group:
        """The group ``name`` as it is now (limits unknown): to remove it after a restart."""
        return self.create(name, Limits(None, None, None))

    def hold(self, name: str, limits: Limits) -> list[str]:
        """Hold all groups under ``name`` (one account's) together to ``limits``' CPU,
        memory and processes; what is not held, and why."""
        return [self.reason or "not enforced"]

    def in_words(self, limits: Limits) -> str:
        """What a server under ``limits`` gets, as the spawn form tells its user
        (``up to 2 CPUs and 16 GiB of memory; only its own GPU``): no mechanism names."""
        if self.kind == "none":
            return "CPU and memory are not limited on this host"
        return limits_in_words(limits)

    def describe(self, limits: Limits | None = None) -> str:
        """What ``create(…, limits)`` would hold, for ``%gpulab`` and the admin's logs."""
        if self.kind == "none":
            return f"{self.label}: {self.reason}" if self.reason else self.label
        return f"{self.label}: {format_limits(limits)}" if limits else self.label


class Group:
    """One process group's limits on the host; made by ``Cgroups.create``."""

    def __init__(self, cgroups: Cgroups, name: str, limits: Limits, notes: list[str] | None = None):
        self.cgroups = cgroups
        self.name = name
        self.limits = limits
        self.notes = list(notes or [])

    def describe(self) -> str:
        """``cgroup v1: 2 CPUs, 8 GiB, devices: /dev/nvidia0`` (plus what is not held, and why)."""
        if self.cgroups.kind == "none":
            return self.cgroups.describe()
        text = f"{self.cgroups.label}: {format_limits(self.limits)}"
        return text + "".join(f" ({n})" for n in self.notes if n)

    def join_in_child(self) -> None:
        """Move the calling process into the group (for ``preexec_fn``; needs root)."""

    def launch(
        self,
        argv: Sequence[str],
        *,
        user: int | str | None = None,
        group: int | str | None = None,
        extra_groups: Sequence[int] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> tuple[list[str], dict]:
        """``(argv, popen_kwargs)`` that start ``argv`` in the group, as ``user``."""
        kwargs = {
            "user": user,
            "group": group,
            "extra_groups": extra_groups,
            "preexec_fn": preexec_fn,
        }
        return list(argv), {k: v for k, v in kwargs.items() if v is not None}

    def exists(self) -> bool:
        """Is the group on the host now (made, and not removed since)?"""
        return False

    def pids(self) -> list[int]:
        return []

    def cpu_stat(self) -> dict[str, int]:
        return {}

    def memory_events(self) -> dict[str, int]:
        """``{"limit": bytes, "oom_kills": n}`` where the host says (for why a rank
        was killed); empty where it does not."""
        return {}

    def kill(self, timeout: float = 5.0) -> bool:
        """SIGKILL everything in the group until it is empty; False if it would not empty."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self, kill: bool = True, timeout: float = 5.0) -> bool:
        """Kill what is left (unless ``kill=False``) and remove the group and its
        empty parents; True when it is gone."""
        return True


def numeric_ids(user, group, extra_groups) -> tuple[int | None, int | None, list[int] | None]:
    """Numeric ids, resolved in the parent (no NSS lookups after fork)."""
    if isinstance(user, str):
        pw = pwd.getpwnam(user)
        user, group = pw.pw_uid, pw.pw_gid if group is None else group
    if isinstance(group, str):
        import grp

        group = grp.getgrnam(group).gr_gid
    return user, group, (list(extra_groups) if extra_groups is not None else None)


def _mechanism(kind: str) -> type[Cgroups]:
    # Imported here: the mechanisms build on the classes above.
    if kind == "systemd":
        from .cgroups_systemd import SystemdCgroups

        return SystemdCgroups
    from .cgroupfs import V1Cgroups, V2Cgroups

    return V2Cgroups if kind == "cgroup2" else V1Cgroups


__all__ = ["CgroupError", "Cgroups", "Group", "Limits"]
