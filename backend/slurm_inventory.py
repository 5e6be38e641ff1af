"""The GPUs of a Slurm cluster, read from its nodes' GRES (``sinfo --json``).

``c.InventorySettings.inventory_class = "slurm"`` lists every GPU the nodes of
gpulab's partition declare (``Gres=gpu:4,shard:80``) as a :class:`Gpu` row:
``node`` is the Slurm node name, ``index`` the GPU's place on the node. A node
that is down, drained, draining or failing offers none (the reason says which
and why). Slurm's commands run through :class:`~gpulab.backend.slurm_site.SlurmSite`
(``c.SlurmSite.slurm_conf``, ``partition``, ``bin_dir``).

Whole GPUs or shards: the rule
------------------------------
Slurm 22.05 does not keep ``gres/gpu`` and ``gres/shard`` apart: a ``shard:3``
job on GPU 0 and a ``gpu:1`` job can both be given GPU 0. A shard request is
served from one GPU only (``shard:8`` on a node of 2 GPUs x 4 shards pends for
ever). And the ledger counts a slice on one GPU, whatever size it is. So a
gpulab partition asks Slurm for one kind of GRES only, chosen by
``c.SlurmInventory.whole_gpus``:

- **shards** (the default): every slice is ``--gres=shard:K`` on one GPU, K =
  the slice's share of that GPU's shards (a whole GPU = all its shards). Nodes
  without ``shard`` GRES are not offered; slices of 2 or more GPUs cannot be
  held (:class:`PoolError`).
- **whole GPUs** (``whole_gpus = True``): every slice is ``--gres=gpu:N``;
  fractions cannot be held (:class:`PoolError`; offer whole sizes only with
  ``c.InventorySettings.slice_sizes``).

Either way what the ledger holds per node is exactly what Slurm holds (shards
per GPU that divide the slice sizes: 20 per GPU serves 1/10, 1/4 and 1/2
exactly), so the ledger never places what Slurm would stack on one GPU. Which
physical GPU Slurm picks is Slurm's choice (its index may differ from the
ledger's); see docs/howto/slurm.md.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess

from traitlets import Bool, Dict, Int, Unicode

from gpulab.scheduler.inventory import Gpu, Inventory, InventoryError
from gpulab.scheduler.slices import MILLI_PER_GPU

from .local_inventory import load_inventory
from .slurm_site import SlurmSite, parse_gres

#: Node states (``state`` or ``state_flags`` of ``sinfo --json``) that take no work.
UNAVAILABLE = frozenset(
    {
        "down",
        "drain",
        "drained",
        "draining",
        "fail",
        "failing",
        "maint",
        "future",
        "unknown",
        "not_responding",
        "reboot_requested",
        "power_down",
        "powered_down",
        "powering_down",
        "inval",
    }
)
SHARD_POOL = "shard"
WHOLE_POOL = "whole"
_GB = re.compile(r"(\d+)\s*G", re.IGNORECASE)


class PoolError(ValueError):
    """A slice that the node's pool cannot hold (e.g. 2 GPUs on a shard node)."""


def gpu_uuid(node: str, index: int) -> str:
    """A stable name for a GPU Slurm does not name: the same after every restart,
    so the ledger's rows still point at it."""
    digest = hashlib.sha1(f"slurm/{node}/{index}".encode()).hexdigest()[:8]
    return f"slurm-{node}-gpu{index}-{digest}"


def node_states(node: dict) -> set[str]:
    """Every state word of a ``sinfo --json`` node (``state`` and ``state_flags``),
    lower case: ``{"idle", "drain"}`` for a drained idle node."""
    state = node.get("state") or ""
    words = state if isinstance(state, list) else re.split(r"[+,\s]+", state)
    words = [*words, *(node.get("state_flags") or [])]
    return {w.strip().lower() for w in words if w and w.strip()}


def unavailable_because(node: dict) -> str | None:
    """Why a node takes no work (``"drain: gpu fan"``), or None."""
    bad = sorted(node_states(node) & UNAVAILABLE)
    if not bad:
        return None
    reason = (node.get("reason") or "").strip()
    return "+".join(bad) + (f": {reason}" if reason else "")


def shards_per_gpu(gres: dict[str, int]) -> int:
    gpus = gres.get("gpu", 0)
    return gres.get("shard", 0) // gpus if gpus else 0


def gres_request(milli: int, gres: dict[str, int], pool: str = SHARD_POOL) -> str:
    """The ``--gres`` value for a slice of ``milli`` on a node with ``gres``
    (``{"gpu": 2, "shard": 8}``) in ``pool``; ``""`` for no GPU.

    On a shard node a fraction rounds up to whole shards (Slurm then holds a
    little more than the ledger counts; choose shards per GPU that divide the
    slice sizes to avoid it).
    """
    if milli <= 0:
        return ""
    if pool == WHOLE_POOL:
        if milli % MILLI_PER_GPU:
            raise PoolError(
                f"this Slurm partition hands out whole GPUs (c.SlurmInventory.whole_gpus); "
                f"a slice of {milli} milli-GPU cannot be held: pick 1 GPU or more"
            )
        return f"gpu:{milli // MILLI_PER_GPU}"
    if milli > MILLI_PER_GPU:
        raise PoolError(
            f"a slice of {milli // MILLI_PER_GPU} GPUs cannot be held with shards: Slurm "
            f"serves a shard request from one GPU; pick a slice of at most 1 GPU (or run "
            f"a partition of whole GPUs: c.SlurmInventory.whole_gpus = True)"
        )
    per_gpu = shards_per_gpu(gres)
    if per_gpu < 1:
        raise PoolError(f"the node declares fewer shards than GPUs ({gres}); fix its gres.conf")
    return f"shard:{max(1, -(-milli * per_gpu // MILLI_PER_GPU))}"


class SlurmInventory(Inventory):
    """The GPUs of the Slurm cluster's nodes (``c.InventorySettings.inventory_class = "slurm"``).

    A cluster that cannot be read at start (no ``sinfo``, controller down) stops the
    service with the reason, instead of serving an empty cluster.
    """

    gpu_model = Unicode(
        "",
        help="""Model name of the GPUs when the nodes' GRES has no type (Gres=gpu:4
        rather than Gres=gpu:a100:4). Default: the GRES type, else "GPU".

        c.SlurmInventory.gpu_model = "A100-80GB"
        """,
    ).tag(config=True)

    gpu_memory_mib = Dict(
        value_trait=Int(),
        help="""GPU memory in MiB per model (the GRES type or gpu_model). Models not
        listed take the size in their name ("A100-80GB" -> 81920), else
        default_memory_mib.

        c.SlurmInventory.gpu_memory_mib = {"a100": 81920, "h100": 81920, "t4": 15360}
        """,
    ).tag(config=True)

    default_memory_mib = Int(
        16 * 1024,
        help="""GPU memory in MiB of a model neither gpu_memory_mib nor its name gives.

        c.SlurmInventory.default_memory_mib = 40960
        """,
    ).tag(config=True)

    simulated = Bool(
        False,
        help="""Mark the GPUs simulated: their GRES has no hardware behind it (the
        sandbox of `gpulab slurm-sandbox up`). Nothing is enforced on them.

        c.SlurmInventory.simulated = True
        """,
    ).tag(config=True)

    whole_gpus = Bool(
        False,
        help="""Hand out whole GPUs (--gres=gpu:N) instead of shards (--gres=shard:K, the
        default). With shards, only nodes that declare shard GRES are offered and a
        slice is at most 1 GPU; with whole GPUs, every slice is 1 GPU or more (offer
        whole sizes: c.InventorySettings.slice_sizes). See docs/howto/slurm.md for why
        one partition never mixes the two.

        c.SlurmInventory.whole_gpus = True
        """,
    ).tag(config=True)

    def pool(self) -> str:
        return WHOLE_POOL if self.whole_gpus else SHARD_POOL

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: Per node, after :meth:`load`: name -> {"gres", "address", "reason"}.
        self.nodes: dict[str, dict] = {}

    def site(self) -> SlurmSite:
        return SlurmSite(parent=self)

    def read_sinfo(self) -> dict:
        """``sinfo --json`` of gpulab's partition, run synchronously (the service reads
        its inventory once, before it listens)."""
        site = self.site()
        argv = [site.command("sinfo"), "--json"]
        if site.partition:
            argv += ["-p", site.partition]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, env=site.env(), timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise InventoryError(
                f"inventory_class is slurm but sinfo cannot run ({e}); install Slurm's "
                f"clients or set c.SlurmSite.bin_dir"
            ) from None
        if proc.returncode != 0:
            raise InventoryError(
                f"inventory_class is slurm but `sinfo --json` failed: "
                f"{(proc.stderr or proc.stdout).strip()[:500]}; check c.SlurmSite.slurm_conf "
                f"and that slurmctld runs"
            )
        return json.loads(proc.stdout)

    def model_and_memory(self, gpu_type: str | None) -> tuple[str, int]:
        model = self.gpu_model or gpu_type or "GPU"
        for key in (model, gpu_type):
            if key and key in self.gpu_memory_mib:
                return model, self.gpu_memory_mib[key]
        gb = _GB.search(model)
        return model, int(gb.group(1)) * 1024 if gb else self.default_memory_mib

    def parse(self, sinfo: dict) -> tuple[list[Gpu], str | None]:
        """GPU rows from ``sinfo --json`` output; the reason when some or all are left out."""
        partition = self.site().partition
        self.nodes = {}
        gpus: list[Gpu] = []
        left_out: list[str] = []
        for node in sinfo.get("nodes") or []:
            name = node["name"]
            if name in self.nodes:
                continue  # sinfo lists a node once per partition
            if partition and partition not in (node.get("partitions") or []):
                continue
            gres, gpu_type = parse_gres(node.get("gres"))
            why = unavailable_because(node)
            self.nodes[name] = {
                "gres": gres,
                "address": node.get("address") or name,
                "reason": why,
            }
            if not gres.get("gpu"):
                continue
            if why:
                left_out.append(f"{name} ({why})")
                continue
            if not self.whole_gpus and gres.get("shard", 0) < gres["gpu"]:
                left_out.append(f"{name} (no shards: give it Gres=gpu:N,shard:20N)")
                continue
            model, memory_mib = self.model_and_memory(gpu_type)
            for index in range(gres["gpu"]):
                gpus.append(
                    Gpu(
                        gpu_uuid(name, index),
                        index,
                        model,
                        memory_mib,
                        name,
                        simulated=self.simulated,
                    )
                )
        reason = None
        if left_out:
            reason = "GPUs of these Slurm nodes are not offered: " + ", ".join(left_out)
        elif not gpus:
            where = f"partition {partition!r}" if partition else "the cluster"
            reason = f"no node of {where} declares GPUs (Gres=gpu:N in slurm.conf)"
        return gpus, reason

    def load(self) -> tuple[list[Gpu], str | None]:
        if self.simulate:
            self.log.info("simulate_gpus is set: using it instead of the Slurm nodes")
            return load_inventory(self.simulate, node=self.node or None)
        return self.parse(self.read_sinfo())

    def gres_request(self, gres: dict[str, int], milli: int) -> str:
        """The ``--gres`` value of a slice of ``milli`` on a node with ``gres`` (from
        :meth:`SlurmSite.nodes` or :attr:`nodes`): ``shard:K``, or ``gpu:N`` with
        ``whole_gpus``."""
        return gres_request(milli, gres, self.pool())
