"""The GPU device nodes of this host, and which of them a slice may open.

The device cgroup decides by (type, major, minor), so nodes are known by their
numbers, not only by the files in ``/dev``: ``nvidia-modprobe`` (setuid root)
creates a card's node on first use, after any rule was written.

* cards: ``/dev/nvidiaN`` is char 195:N, N the "Device Minor" of
  ``/proc/driver/nvidia/gpus/<pci>/information``;
* MIG instances: ``/dev/nvidia-caps/nvidia-capM``, major ``nvidia-caps`` of
  ``/proc/devices``, M from ``/proc/driver/nvidia-caps/mig-minors``
  (``gpu0/gi2/access 21``, ``gpu0/gi2/ci0/access 22``);
* DRM nodes of NVIDIA cards (``/dev/dri/card1``, ``renderD129``: vendor 0x10de);
* shared control nodes every CUDA process needs (``/dev/nvidiactl`` 195:255,
  ``nvidia-modeset`` 195:254, ``nvidia-uvm``, ``nvidia-uvm-tools``): denied
  only to processes that have no GPU at all.
"""

from __future__ import annotations

import glob
import os
import re
import stat
from dataclasses import dataclass

NVIDIA_MAJOR = 195
CTL_MINOR, MODESET_MINOR = 255, 254
DRM_VENDOR_NVIDIA = "0x10de"


@dataclass(frozen=True)
class DeviceNode:
    kind: str  # "c" or "b"
    major: int
    minor: int
    path: str = ""
    shared: bool = False  # needed by every CUDA process (nvidiactl, nvidia-uvm)

    @property
    def rule(self) -> str:
        """The device cgroup v1 rule for this node (``c 195:1 rwm``)."""
        return f"{self.kind} {self.major}:{self.minor} rwm"

    def same(self, other: DeviceNode) -> bool:
        return (self.kind, self.major, self.minor) == (other.kind, other.major, other.minor)


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device majors by name, from ``/proc/devices``."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices"):
            in_char = True
        elif line.startswith("Block devices"):
            in_char = False
        elif in_char and line.strip():
            number, _, name = line.strip().partition(" ")
            if number.isdigit():
                majors.setdefault(name.strip(), int(number))
    return majors


def parse_device_minor(information: str) -> int | None:
    """The card's minor number from ``/proc/driver/nvidia/gpus/<pci>/information``."""
    m = re.search(r"^Device Minor:\s*(\d+)", information, re.MULTILINE)
    return int(m.group(1)) if m else None


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as ``{"gpu0/gi2/ci0/access": 22, ...}``."""
    minors = {}
    for line in text.splitlines():
        name, _, number = line.strip().rpartition(" ")
        if name and number.isdigit():
            minors[name] = int(number)
    return minors


def mig_access_minors(
    minors: dict[str, int], gpu: int, gi: int | None = None, ci: int | None = None
) -> list[int]:
    """Cap minors of MIG instances on card ``gpu``: all of them, or the one
    (``gi``, ``ci``) a MIG slice needs (its GPU instance and compute instance)."""
    if gi is None:
        pattern = re.compile(rf"gpu{gpu}/gi\d+(/ci\d+)?/access")
        return sorted(v for k, v in minors.items() if pattern.fullmatch(k))
    wanted = [f"gpu{gpu}/gi{gi}/access"] + (
        [f"gpu{gpu}/gi{gi}/ci{ci}/access"] if ci is not None else []
    )
    return [minors[k] for k in wanted if k in minors]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def node_of(path: str) -> DeviceNode | None:
    """The device numbers of ``path``: from the node itself, else from its name."""
    try:
        st = os.stat(path)
    except OSError:
        m = re.fullmatch(r"/dev/nvidia(\d+)", path)
        if m:
            return DeviceNode("c", NVIDIA_MAJOR, int(m.group(1)), path)
        m = re.fullmatch(r"/dev/nvidia-caps/nvidia-cap(\d+)", path)
        caps = parse_proc_devices(_read("/proc/devices")).get("nvidia-caps")
        if m and caps is not None:
            return DeviceNode("c", caps, int(m.group(1)), path)
        return None
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
        return DeviceNode(kind, os.major(st.st_rdev), os.minor(st.st_rdev), path)
    return None


def card_minors(proc: str = "/proc") -> list[int]:
    """Minor numbers of the NVIDIA cards the driver knows, else of ``/dev/nvidiaN``."""
    minors = {
        parse_device_minor(_read(p))
        for p in glob.glob(os.path.join(proc, "driver/nvidia/gpus/*/information"))
    }
    minors.discard(None)
    if not minors:
        for path in glob.glob("/dev/nvidia[0-9]*"):
            m = re.fullmatch(r"/dev/nvidia(\d+)", path)
            if m:
                minors.add(int(m.group(1)))
    return sorted(minors)


def host_gpu_nodes(proc: str = "/proc", sys: str = "/sys") -> list[DeviceNode]:
    """Every NVIDIA device node of this host, present in ``/dev`` or not yet."""
    cards = card_minors(proc)
    nodes = [DeviceNode("c", NVIDIA_MAJOR, m, f"/dev/nvidia{m}") for m in cards]
    majors = parse_proc_devices(_read(os.path.join(proc, "devices")))
    caps = majors.get("nvidia-caps")
    if caps is not None:
        mig = parse_mig_minors(_read(os.path.join(proc, "driver/nvidia-caps/mig-minors")))
        for card in cards:
            nodes += [
                DeviceNode("c", caps, m, f"/dev/nvidia-caps/nvidia-cap{m}")
                for m in mig_access_minors(mig, card)
            ]
    for dev in sorted(glob.glob(os.path.join(sys, "class/drm/*/dev"))):
        entry = os.path.dirname(dev)
        if _read(os.path.join(entry, "device/vendor")).strip() != DRM_VENDOR_NVIDIA:
            continue
        major, _, minor = _read(dev).strip().partition(":")
        if major.isdigit() and minor.isdigit():
            nodes.append(
                DeviceNode("c", int(major), int(minor), f"/dev/dri/{os.path.basename(entry)}")
            )
    if cards:
        nodes += [
            DeviceNode("c", NVIDIA_MAJOR, CTL_MINOR, "/dev/nvidiactl", shared=True),
            DeviceNode("c", NVIDIA_MAJOR, MODESET_MINOR, "/dev/nvidia-modeset", shared=True),
        ]
        uvm = majors.get("nvidia-uvm")
        if uvm is not None:
            nodes += [
                DeviceNode("c", uvm, 0, "/dev/nvidia-uvm", shared=True),
                DeviceNode("c", uvm, 1, "/dev/nvidia-uvm-tools", shared=True),
            ]
    return nodes


def denied_nodes(host_nodes: list[DeviceNode], allowed_paths: tuple[str, ...]) -> list[DeviceNode]:
    """The host's GPU nodes a slice with ``allowed_paths`` must not open.

    With no device at all, the shared control nodes go too; with any, they
    stay (CUDA needs them, and they reach no card by themselves).
    """
    allowed = [n for n in (node_of(p) for p in allowed_paths) if n is not None]
    return [
        n
        for n in host_nodes
        if not any(n.same(a) for a in allowed) and (not n.shared or not allowed_paths)
    ]


def no_gpu_unless(uuids: list[str], real_cards: bool) -> tuple[str, ...] | None:
    """The device nodes work holding ``uuids`` may open: theirs; none at all on a host
    with real cards where it holds none; not limited (None) where the host has no
    real card (simulated GPUs: there is nothing to open)."""
    if not real_cards:
        return None
    return device_paths_for_uuids(uuids) if uuids else ()


def device_paths_for_uuids(uuids: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The device nodes a slice on these GPU (or MIG) UUIDs needs (NVML)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        mig = parse_mig_minors(_read("/proc/driver/nvidia-caps/mig-minors"))
        paths: list[str] = []
        for uuid in uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            if uuid.startswith("MIG-"):
                parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                card = pynvml.nvmlDeviceGetMinorNumber(parent)
                gi = pynvml.nvmlDeviceGetGpuInstanceId(handle)
                ci = pynvml.nvmlDeviceGetComputeInstanceId(handle)
                paths.append(f"/dev/nvidia{card}")
                paths += [
                    f"/dev/nvidia-caps/nvidia-cap{m}" for m in mig_access_minors(mig, card, gi, ci)
                ]
            else:
                paths.append(f"/dev/nvidia{pynvml.nvmlDeviceGetMinorNumber(handle)}")
        return tuple(dict.fromkeys(paths))
    finally:
        pynvml.nvmlShutdown()
