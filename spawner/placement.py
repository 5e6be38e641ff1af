"""Where a server's slice went, in words people read (spawn page, admin page).

One unit for people: the fraction (``1/4 GPU``, from
:func:`gpulab.scheduler.slices.label`); milli-GPU stays in API fields.
A :class:`Placement` is kept in the spawner's state, so the hub's admin page
still shows it after a hub restart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpulab.scheduler.slices import label


def gib(mib: int) -> str:
    """``20480`` -> ``20 GiB``; ``4096`` -> ``4 GiB``; ``1536`` -> ``1.5 GiB``."""
    return f"{mib / 1024:.3g} GiB"


@dataclass(frozen=True)
class Placement:
    """One server's slice: size, card(s), node and memory."""

    milli: int
    model: str = ""
    indexes: tuple[int, ...] = ()
    node: str = ""
    memory_mib: int = 0
    simulated: bool = False

    @property
    def size(self) -> str:
        return label(self.milli)

    @property
    def gpus(self) -> str:
        """``A100-80GB #0`` or ``A100-80GB #0, #1``."""
        if not self.indexes:
            return ""
        return f"{self.model or 'GPU'} " + ", ".join(f"#{i}" for i in self.indexes)

    def sentence(self) -> str:
        """``Placed 1/4 GPU on A100-80GB #0 of node vm (20 GiB)``."""
        if not self.milli:
            return "No GPU: JupyterLab runs on the CPU"
        return f"Placed {self.size} on {self.gpus} of node {self.node} ({gib(self.memory_mib)})"

    def to_state(self) -> dict:
        return {**asdict(self), "indexes": list(self.indexes)}

    @classmethod
    def from_state(cls, state: dict | None) -> Placement | None:
        if not state:
            return None
        try:
            return cls(**{**state, "indexes": tuple(state.get("indexes") or ())})
        except TypeError:  # a state written by another version: show nothing
            return None


def placement_of(milli: int, allocations: list[dict], inventory: dict) -> Placement:
    """The ledger's rows of one owner, with the cards' model from the inventory."""
    if not allocations:
        return Placement(0)
    cards = {g["uuid"]: g for n in inventory.get("nodes", []) for g in n.get("gpus", [])}
    first = cards.get(allocations[0]["gpu_uuid"], {})
    indexes = tuple(
        cards[a["gpu_uuid"]]["index"] if a["gpu_uuid"] in cards else a.get("gpu_index", 0)
        for a in allocations
    )
    return Placement(
        milli=milli or sum(a["milli"] for a in allocations),
        model=str(first.get("model") or ""),
        indexes=indexes,
        node=allocations[0]["node"],
        memory_mib=sum(int(a.get("memory_mib") or 0) for a in allocations),
        simulated=any(a.get("simulated") for a in allocations),
    )


def local_enforcement(allocations: list[dict], simulated: bool, mps: bool, cgroup: str) -> str:
    """``Enforced by: PyTorch memory limit + CUDA_VISIBLE_DEVICES`` for a local server.

    ``cgroup`` is what the account's cgroup holds, as it says so itself
    (``cgroup v2: 1 CPU, 2.7 GiB``; empty: no cgroup).
    """
    if not allocations:
        parts = ["CUDA_VISIBLE_DEVICES (empty: no GPU visible)"]
    else:
        per_gpu = allocations[0]["milli"]
        uuids = [a["gpu_uuid"] for a in allocations]
        if all(u.startswith("MIG-") for u in uuids):
            parts = ["MIG (hardware)", "CUDA_VISIBLE_DEVICES"]
        elif per_gpu >= 1000:
            parts = ["CUDA_VISIBLE_DEVICES"]
        else:
            parts = ["PyTorch memory limit"] + (["MPS limits"] if mps else [])
            parts.append("CUDA_VISIBLE_DEVICES")
    if cgroup:
        parts.append(cgroup)
    text = "Enforced by: " + " + ".join(parts)
    if simulated:
        text += " (simulated GPU: nothing enforced)"
    return text


def kube_enforcement(backend: str, simulated: bool, milli: int) -> str:
    """``Enforced by: the hami backend (pod limits and annotations)``."""
    if not milli:
        return "Enforced by: no GPU resources on the pod"
    text = f"Enforced by: the {backend} backend (pod limits, annotations, node pinning)"
    if simulated:
        text += " (simulated GPU: nothing enforced)"
    return text


STARTING_LAB = "Starting JupyterLab…"
