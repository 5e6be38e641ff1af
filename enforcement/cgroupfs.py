"""Groups as directories of the cgroup filesystem: cgroup v1 (one per controller) and v2.

See ``gpulab.enforcement.cgroups`` for the mechanisms and how to use a group.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time

from .cgroups import (
    CFS_PERIOD_US,
    V1_CONTROLLERS,
    CgroupError,
    Cgroups,
    Group,
    cgroup_dir,
    group_path,
    numeric_ids,
    parse_cgroup_mounts,
    parse_proc_cgroup,
    read_text,
    write_text,
)
from .gpu_nodes import DeviceNode, denied_nodes, node_of
from .limits import Limits, cpu_shares, cpu_weight


class FsGroup(Group):
    """A group made of directories in the cgroup filesystem (v1: one per controller)."""

    def __init__(
        self,
        cgroups: FsCgroups,
        name: str,
        limits: Limits,
        dirs: list[str],
        notes: list[str] | None = None,
    ):
        super().__init__(cgroups, name, limits, notes)
        self.dirs = dirs
        # Encoded now: the child only opens and writes, nothing that may lock.
        self._procs = [os.fsencode(os.path.join(d, "cgroup.procs")) for d in dirs]

    def exists(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs)

    def join_in_child(self) -> None:
        pid = str(os.getpid()).encode()
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def join(self, pid: int) -> None:
        for d in self.dirs:
            write_text(os.path.join(d, "cgroup.procs"), str(pid))

    def launch(self, argv, *, user=None, group=None, extra_groups=None, preexec_fn=None):
        uid, gid, groups = numeric_ids(user, group, extra_groups)
        join = self.join_in_child

        def preexec() -> None:
            join()
            # Python's own order for user=/group=/extra_groups=: groups, gid, uid.
            if groups is not None:
                os.setgroups(groups)
            if gid is not None:
                os.setresgid(gid, gid, gid)
            if uid is not None:
                os.setresuid(uid, uid, uid)
            if preexec_fn is not None:
                preexec_fn()

        return list(argv), {"preexec_fn": preexec}

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in read_text(os.path.join(d, "cgroup.procs")).split())
        return sorted(found)

    def cpu_stat(self) -> dict[str, int]:
        for d in self.dirs:
            try:
                text = read_text(os.path.join(d, "cpu.stat"))
            except OSError:
                continue
            return {k: int(v) for k, v in (ln.split() for ln in text.splitlines() if ln.strip())}
        return {}

    def memory_events(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.dirs:
            # v1: memory.limit_in_bytes, memory.oom_control's oom_kill (and failcnt, the
            # times usage hit the limit); v2: memory.max and memory.events' oom_kill.
            for name, key in (("memory.limit_in_bytes", "limit"), ("memory.max", "limit")):
                with contextlib.suppress(OSError, ValueError):
                    out[key] = int(read_text(os.path.join(d, name)).strip())
            for name in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError):
                    for line in read_text(os.path.join(d, name)).splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and value.strip().isdigit():
                            out["oom_kills"] = out.get("oom_kills", 0) + int(value)
            with contextlib.suppress(OSError, ValueError):
                out["failcnt"] = int(read_text(os.path.join(d, "memory.failcnt")).strip())
        return out

    def remove(self, kill: bool = True, timeout: float = 5.0) -> bool:
        if kill:
            self.kill(timeout)
        gone = True
        for d in self.dirs:
            # Killed processes leave within moments; live ones (kill=False) do not.
            deadline = time.monotonic() + (timeout if kill else 0)
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        gone = False
                        break
                    time.sleep(0.02)
        self.cgroups.prune(self.dirs)
        return gone


class FsCgroups(Cgroups):
    """Groups as directories: ``bases`` are the ``gpulab`` directories, one per hierarchy."""

    def __init__(self, bases: dict[str, str], **kw):
        super().__init__(**kw)
        self.bases = bases  # controller (or "unified") -> <hierarchy>/<parent>/gpulab

    def _dirs(self, name: str) -> dict[str, str]:
        rel = group_path(name)
        return {c: os.path.join(base, rel) for c, base in self.bases.items()}

    def create(self, name: str, limits: Limits) -> Group:
        dirs = self._dirs(name)
        for attempt in range(3):
            try:
                notes = self._make(dirs, limits)
                break
            except (FileNotFoundError, CgroupError) as exc:
                # A concurrent remove() pruned a parent between makedirs and a write.
                vanished = isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT
                if attempt == 2 or not vanished:
                    raise
        unique = list(dict.fromkeys(dirs.values()))
        return FsGroup(self, name, limits, unique, notes)

    def open(self, name: str) -> Group:
        dirs = [d for d in dict.fromkeys(self._dirs(name).values()) if os.path.isdir(d)]
        return FsGroup(self, name, Limits(None, None, None), dirs)

    def _make(self, dirs: dict[str, str], limits: Limits) -> list[str]:
        raise NotImplementedError

    def hold(self, name: str, limits: Limits) -> list[str]:
        """Hold everything under ``name`` (an account's groups together) to the CPU,
        memory and process caps of ``limits``; notes on what is not held."""
        dirs = self._dirs(name)
        for d in dict.fromkeys(dirs.values()):
            os.makedirs(d, exist_ok=True)
        return self._hold(dirs, limits)

    def _hold(self, dirs: dict[str, str], limits: Limits) -> list[str]:
        return self._make(dirs, Limits(limits.cpu_cores, limits.memory_bytes, None, limits.pids))

    def prune(self, dirs: list[str]) -> None:
        """Remove the empty parents of removed groups, up to (not including) ``gpulab``."""
        bases = set(self.bases.values())
        for d in dirs:
            parent = os.path.dirname(d)
            while parent not in bases and any(parent.startswith(b + "/") for b in bases):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)


class V1Cgroups(FsCgroups):
    kind = "cgroup1"

    @classmethod
    def probe(cls, parent: str | None = None, **kw) -> Cgroups | str:
        mounts, _ = parse_cgroup_mounts(read_text("/proc/self/mountinfo"))
        own, _ = parse_proc_cgroup(read_text("/proc/self/cgroup"))
        bases = {}
        for c in V1_CONTROLLERS:
            if c in mounts:
                mountpoint, root = mounts[c]
                where = parent if parent is not None else own.get(c, "/")
                bases[c] = os.path.join(cgroup_dir(mountpoint, root, where), kw["root"])
        if not bases:
            return "no cpu, memory, devices or pids hierarchy is mounted"
        base_dir = os.path.dirname(next(iter(bases.values())))
        if not os.access(base_dir, os.W_OK):
            return f"{base_dir} is not writable (mounted read-only?)"
        made = cls(bases, **kw)
        missing = [c for c in V1_CONTROLLERS if c not in bases]
        made.reason = f"no {', '.join(missing)} controller mounted" if missing else ""
        return made

    def _make(self, dirs: dict[str, str], limits: Limits) -> list[str]:
        notes = []
        fresh = _missing_between(self.bases.get("cpu"), dirs.get("cpu"))
        for d in dict.fromkeys(dirs.values()):
            os.makedirs(d, exist_ok=True)
        if "cpu" in dirs:
            # gpulab's tree and an account's group made on the way weigh as the
            # host's cores (an account held to a quota weighs as its quota: _hold).
            for d in [self.bases["cpu"], *fresh]:
                write_text(os.path.join(d, "cpu.shares"), str(cpu_shares(_host_cores())))
            notes += _v1_cpu(dirs["cpu"], limits.cpu_cores)
        elif limits.cpu_cores is not None:
            notes.append("CPU not held: no cpu controller")
        if "memory" in dirs:
            _v1_memory(dirs["memory"], -1 if limits.memory_bytes is None else limits.memory_bytes)
        elif limits.memory_bytes is not None:
            notes.append("memory not held: no memory controller")
        if "devices" in dirs:
            notes += self._devices(dirs["devices"], limits.devices)
        elif limits.devices is not None:
            notes.append("devices not held: no devices controller")
        if "pids" in dirs:
            write_text(os.path.join(dirs["pids"], "pids.max"), _pids(limits.pids))
        elif limits.pids is not None:
            notes.append("processes not held: no pids controller")
        return notes

    def _hold(self, dirs: dict[str, str], limits: Limits) -> list[str]:
        # CPU, memory and processes only: a devices rule cannot change on a group
        # with children (v1 refuses), and the account's groups carry their own.
        notes = []
        if "cpu" in dirs:
            base = os.path.join(self.bases["cpu"], "cpu.shares")
            write_text(base, str(cpu_shares(_host_cores())))
            notes += _v1_cpu(dirs["cpu"], limits.cpu_cores)
        if "memory" in dirs:
            _v1_memory(dirs["memory"], -1 if limits.memory_bytes is None else limits.memory_bytes)
        if "pids" in dirs:
            write_text(os.path.join(dirs["pids"], "pids.max"), _pids(limits.pids))
        return notes

    def _devices(self, d: str, allowed: tuple[str, ...] | None) -> list[str]:
        current = read_text(os.path.join(d, "devices.list")).split("\n")
        allow_all = [ln for ln in current if ln.strip()] == ["a *:* rwm"]
        if allow_all:
            # Reset: a re-created group may have denied a card this slice now holds.
            write_text(os.path.join(d, "devices.allow"), "a")
        elif allowed:
            for node in filter(None, (node_of(p) for p in allowed)):
                # If refused, the hierarchy above does not allow it either.
                with contextlib.suppress(CgroupError):
                    write_text(os.path.join(d, "devices.allow"), node.rule)
        if allowed is None:
            return []
        denied = denied_nodes(self.gpu_nodes(), allowed)
        for node in denied:
            write_text(os.path.join(d, "devices.deny"), node.rule)
        if not allow_all:
            # A whitelist above us: a wildcard entry may still let a denied card through.
            still = [
                n.path
                for n in denied
                if _v1_whitelisted(read_text(os.path.join(d, "devices.list")), n)
            ]
            if still:
                return [
                    f"devices not held: the devices cgroup above allows {', '.join(still)} "
                    "by a wildcard rule"
                ]
        return []


def _v1_whitelisted(listing: str, node: DeviceNode) -> bool:
    for line in listing.splitlines():
        try:
            kind, numbers, _ = line.split()
        except ValueError:
            continue
        major, _, minor = numbers.partition(":")
        if (
            kind in ("a", node.kind)
            and major in ("*", str(node.major))
            and minor in ("*", str(node.minor))
        ):
            return True
    return False


def _pids(value: int | None) -> str:
    return "max" if value is None else str(value)


def _host_cores() -> int:
    return os.cpu_count() or 1


def _missing_between(base: str | None, leaf: str | None) -> list[str]:
    """The folders strictly between ``base`` and ``leaf`` that do not exist yet."""
    if not base or not leaf or not leaf.startswith(base + "/"):
        return []
    missing, d = [], os.path.dirname(leaf)
    while d != base and d.startswith(base + "/"):
        if not os.path.isdir(d):
            missing.append(d)
        d = os.path.dirname(d)
    return missing[::-1]


def _v1_cpu(d: str, cores: float | None) -> list[str]:
    """Set the CFS quota and a weight in proportion to it (``cpu.shares``: the default
    1024 would weigh a group of many cores as one process). v1 refuses a quota above
    the parent's (EINVAL): then the parent's (the account's quota), said in a note."""
    write_text(os.path.join(d, "cpu.shares"), str(cpu_shares(cores or _host_cores())))
    quota = -1 if cores is None else max(1000, int(cores * CFS_PERIOD_US))
    write_text(os.path.join(d, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
    try:
        write_text(os.path.join(d, "cpu.cfs_quota_us"), str(quota))
        return []
    except CgroupError as exc:
        parent = os.path.dirname(d)
        try:
            above = int(read_text(os.path.join(parent, "cpu.cfs_quota_us")))
            period = int(read_text(os.path.join(parent, "cpu.cfs_period_us")))
        except (OSError, ValueError):
            raise exc from None
        if exc.errno != errno.EINVAL or above <= 0:
            raise
        held = above * CFS_PERIOD_US // period
        write_text(os.path.join(d, "cpu.cfs_quota_us"), str(held))
        return [f"CPU held at the account's quota of {held / CFS_PERIOD_US:g}"]


def _v1_memory(d: str, value: int) -> None:
    """Set the memory cap, swap included; memsw must never be below the plain limit."""
    limit = os.path.join(d, "memory.limit_in_bytes")
    memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
    if not os.path.exists(memsw):
        write_text(limit, str(value))
        return
    try:
        write_text(memsw, str(value))  # raising (or unlimited): memsw first
        write_text(limit, str(value))
    except CgroupError:
        write_text(limit, str(value))  # lowering: the plain limit first
        write_text(memsw, str(value))


class V2Cgroups(FsCgroups):
    kind = "cgroup2"
    WANTED = ("cpu", "memory", "pids")
    controllers: list[str] = []  # of WANTED, those the parent cgroup offers

    @classmethod
    def probe(cls, parent: str | None = None, **kw) -> Cgroups | str:
        _, mount = parse_cgroup_mounts(read_text("/proc/self/mountinfo"))
        if mount is None:
            return "no cgroup2 hierarchy is mounted"
        mountpoint, root = mount
        _, own = parse_proc_cgroup(read_text("/proc/self/cgroup"))
        top = cgroup_dir(mountpoint, root, "/")
        base_parent = cgroup_dir(mountpoint, root, parent if parent is not None else own or "/")
        try:
            available = read_text(os.path.join(base_parent, "cgroup.controllers")).split()
        except OSError:
            return f"{base_parent} does not exist; create it or correct parent="
        if not any(c in available for c in ("cpu", "memory")):
            return (
                f"{base_parent} has no cpu or memory controller (bound to cgroup v1 "
                "hierarchies, or not delegated)"
            )
        if base_parent != top and read_text(os.path.join(base_parent, "cgroup.procs")).strip():
            enabled = read_text(os.path.join(base_parent, "cgroup.subtree_control")).split()
            if not all(c in enabled for c in cls.WANTED if c in available):
                return (
                    f"gpulab's cgroup {base_parent} holds processes, so cgroup v2 will not "
                    "hand controllers to groups below it; run gpulab under systemd, or in "
                    "a cgroup of its own and pass parent= a sibling cgroup for the groups"
                )
        if not os.access(base_parent, os.W_OK):
            return f"{base_parent} is not writable"
        made = cls({"unified": os.path.join(base_parent, kw["root"])}, **kw)
        made.controllers = [c for c in cls.WANTED if c in available]
        return made

    def _make(self, dirs: dict[str, str], limits: Limits) -> list[str]:
        leaf = dirs["unified"]
        base = self.bases["unified"]
        chain = [os.path.dirname(base)]
        path = base
        for part in os.path.relpath(leaf, base).split("/"):
            chain.append(path)
            path = os.path.join(path, part)
        fresh = _missing_between(base, leaf)
        os.makedirs(leaf, exist_ok=True)
        enable = " ".join(f"+{c}" for c in self.controllers)
        for d in chain:
            have = read_text(os.path.join(d, "cgroup.subtree_control")).split()
            if not all(c in have for c in self.controllers):
                write_text(os.path.join(d, "cgroup.subtree_control"), enable)
        notes = []
        if limits.cpu_cores is not None and "cpu" not in self.controllers:
            notes.append("CPU not held: no cpu controller")
        elif "cpu" in self.controllers:
            quota = (
                "max"
                if limits.cpu_cores is None
                else str(max(1000, int(limits.cpu_cores * CFS_PERIOD_US)))
            )
            write_text(os.path.join(leaf, "cpu.max"), f"{quota} {CFS_PERIOD_US}")
            # Weights in proportion to the cores, as v1's cpu.shares (_v1_cpu).
            for d in [base, *fresh]:
                write_text(os.path.join(d, "cpu.weight"), str(cpu_weight(_host_cores())))
            weight = cpu_weight(limits.cpu_cores or _host_cores())
            write_text(os.path.join(leaf, "cpu.weight"), str(weight))
        if limits.memory_bytes is not None and "memory" not in self.controllers:
            notes.append("memory not held: no memory controller")
        elif "memory" in self.controllers:
            value = "max" if limits.memory_bytes is None else str(limits.memory_bytes)
            write_text(os.path.join(leaf, "memory.max"), value)
            if os.path.exists(os.path.join(leaf, "memory.swap.max")):
                write_text(os.path.join(leaf, "memory.swap.max"), "max" if value == "max" else "0")
        if limits.pids is not None and "pids" not in self.controllers:
            notes.append("processes not held: no pids controller")
        elif "pids" in self.controllers:
            value = "max" if limits.pids is None else str(limits.pids)
            write_text(os.path.join(leaf, "pids.max"), value)
        if limits.devices is not None and denied_nodes(self.gpu_nodes(), limits.devices):
            notes.append(
                "devices not held: cgroup v2 without systemd has no device files; "
                "CUDA_VISIBLE_DEVICES only"
            )
        return notes
