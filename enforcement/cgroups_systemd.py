"""Groups as systemd transient scopes, started by ``systemd-run --scope`` (as systemdspawner does).

See ``gpulab.enforcement.cgroups`` for the mechanisms and how to use a group.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

from .cgroups import CgroupError, Cgroups, Group, numeric_ids, read_text
from .gpu_nodes import DeviceNode, denied_nodes, parse_proc_devices
from .limits import Limits


def unit_escape(text: str) -> str:
    """systemd-escape: what a unit name may hold ([A-Za-z0-9:_.]; others as \\xNN)."""
    out = []
    for i, ch in enumerate(text):
        if ch.isascii() and (ch.isalnum() or ch in ":_" or (ch == "." and i > 0)):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out)


def systemd_units(root: str, name: str) -> tuple[str, str]:
    """(slice, scope) of a group: ``gpulab-alice.slice``, ``gpulab-alice-server.scope``."""
    parts = [unit_escape(p) for p in name.split("/") if p]
    if not parts:
        raise ValueError(
            f"a group name needs at least one segment, e.g. 'alice/server'; got {name!r}"
        )
    return f"{root}-{parts[0]}.slice", f"{root}-{'-'.join(parts)}.scope"


def systemd_properties(
    limits: Limits, char_majors: dict[str, int], host_nodes: list[DeviceNode]
) -> list[str]:
    """The scope's resource properties (``systemd-run -p``) for ``limits``.

    Devices are a whitelist in systemd: every character device group of
    ``/proc/devices`` stays allowed except those holding a GPU node the slice
    may not open; the slice's own nodes are allowed one by one.
    """
    props = quota_properties(limits)
    if limits.devices is not None:
        denied = denied_nodes(host_nodes, limits.devices)
        closed = {n.major for n in denied}
        props.append("DevicePolicy=closed")
        for group, major in sorted(char_majors.items(), key=lambda kv: (kv[1], kv[0])):
            if major not in closed:
                props.append(f"DeviceAllow=char-{group} rwm")
        props += [f"DeviceAllow={p} rw" for p in limits.devices]
        # Nodes that share a closed major with a denied card but are not denied
        # themselves (nvidiactl, nvidia-uvm) are allowed by path.
        for node in host_nodes:
            if (
                node.major in closed
                and not any(node.same(d) for d in denied)
                and node.path not in limits.devices
            ):
                props.append(f"DeviceAllow={node.path} rw")
    return props


def slice_dropin(limits: Limits) -> str:
    """A drop-in for an account's slice: its groups' CPU, memory and tasks together."""
    lines = ["# Written by gpulab: the account's quota (c.HostQuota.user_cpu_quota ...)"]
    lines += ["[Slice]", *quota_properties(limits)]
    return "\n".join(lines) + "\n"


def quota_properties(limits: Limits) -> list[str]:
    """systemd's words for the CPU, memory and tasks of ``limits`` (no swap beyond)."""
    props = []
    if limits.cpu_cores is not None:
        props.append(f"CPUQuota={round(limits.cpu_cores * 100, 1):g}%")
    if limits.memory_bytes is not None:
        props += [f"MemoryMax={limits.memory_bytes}", "MemorySwapMax=0"]
    if limits.pids is not None:
        props.append(f"TasksMax={limits.pids}")
    return props


def root_tool(name: str) -> str:
    """``name``'s full path, found on this process's own PATH. The command runs as root
    with the environment of what it starts (a server's: its user's folders first on
    the PATH, where a ``systemd-run`` of theirs would run as root)."""
    path = shutil.which(name)
    if path is None:
        raise CgroupError(f"{name} is not on gpulab's PATH; install it or leave systemd")
    return os.path.abspath(path)


class SystemdGroup(Group):
    """A transient scope: systemd makes it when ``systemd-run --scope`` starts the command."""

    def __init__(self, cgroups: SystemdCgroups, name: str, limits: Limits, properties: list[str]):
        super().__init__(cgroups, name, limits)
        self.slice, self.scope = systemd_units(cgroups.root, name)
        self.properties = properties

    def join_in_child(self) -> None:
        raise CgroupError("under systemd a group is joined by systemd-run; use Group.launch")

    def launch(self, argv, *, user=None, group=None, extra_groups=None, preexec_fn=None):
        uid, gid, groups = numeric_ids(user, group, extra_groups)
        cmd = [
            root_tool("systemd-run"),
            "--scope",
            "--quiet",
            "--collect",
            f"--unit={self.scope}",
            f"--slice={self.slice}",
            f"--description=gpulab {self.name}",
        ]
        cmd += [f"--property={p}" for p in self.properties]
        cmd.append("--")
        if uid is not None:
            # systemd-run's own --uid keeps root's supplementary groups; setpriv sets them.
            gid = pwd.getpwuid(uid).pw_gid if gid is None else gid
            cmd += [
                root_tool("setpriv"),
                f"--reuid={uid}",
                f"--regid={gid}",
                f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
                "--",
            ]
        kwargs = {"preexec_fn": preexec_fn} if preexec_fn is not None else {}
        return cmd + list(argv), kwargs

    def exists(self) -> bool:
        # A scope is collected once its last process ends (--collect).
        return self._cgroup_dir() is not None

    def _cgroup_dir(self) -> str | None:
        done = subprocess.run(
            ["systemctl", "show", "--property=ControlGroup", "--value", self.scope],
            capture_output=True,
            text=True,
        )
        path = done.stdout.strip()
        if not path:
            return None
        for top in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
            d = os.path.join(top, path.lstrip("/"))
            if os.path.exists(os.path.join(d, "cgroup.procs")):
                return d
        return None

    def pids(self) -> list[int]:
        d = self._cgroup_dir()
        try:
            return (
                sorted(int(p) for p in read_text(os.path.join(d, "cgroup.procs")).split())
                if d
                else []
            )
        except OSError:
            return []

    def cpu_stat(self) -> dict[str, int]:
        d = self._cgroup_dir()
        try:
            text = read_text(os.path.join(d, "cpu.stat")) if d else ""
        except OSError:
            return {}
        return {k: int(v) for k, v in (ln.split() for ln in text.splitlines() if ln.strip())}

    def remove(self, kill: bool = True, timeout: float = 5.0) -> bool:
        if kill:
            subprocess.run(
                ["systemctl", "stop", self.scope], capture_output=True, timeout=timeout + 30
            )
        subprocess.run(["systemctl", "reset-failed", self.scope], capture_output=True)
        return not self.pids()


class SystemdCgroups(Cgroups):
    kind = "systemd"

    @classmethod
    def probe(cls, parent: str | None = None, **kw) -> Cgroups | str:
        if not os.path.isdir("/run/systemd/system"):
            return "systemd is not PID 1"
        if shutil.which("systemd-run") is None or shutil.which("setpriv") is None:
            return "systemd-run or setpriv (util-linux) is not installed"
        return cls(**kw)

    def create(self, name: str, limits: Limits) -> Group:
        props = systemd_properties(
            limits, parse_proc_devices(read_text("/proc/devices")), self.gpu_nodes()
        )
        group = SystemdGroup(self, name, limits, props)
        # A scope that failed earlier keeps its name until reset; a new start would fail.
        subprocess.run(["systemctl", "reset-failed", group.scope], capture_output=True)
        return group

    def open(self, name: str) -> Group:
        return SystemdGroup(self, name, Limits(None, None, None), [])

    #: Where the account slices' drop-ins go (runtime: gone at reboot, as the scopes).
    dropin_root = "/run/systemd/system"

    def hold(self, name: str, limits: Limits) -> list[str]:
        slice_name, _ = systemd_units(self.root, name)
        folder = os.path.join(self.dropin_root, f"{slice_name}.d")
        path = os.path.join(folder, "50-gpulab-quota.conf")
        text = slice_dropin(limits)
        try:
            if read_text(path) == text:
                return []
        except OSError:
            pass
        os.makedirs(folder, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        done = subprocess.run(["systemctl", "daemon-reload"], capture_output=True, text=True)
        if done.returncode:
            return [f"account quota not held: systemctl daemon-reload: {done.stderr.strip()}"]
        return []
