"""The Slurm inventory: GPUs from the nodes' GRES, the shard/whole rule, and a live
sandbox whose Slurm runs at once everything the ledger placed on it.

The literal outputs below are real `sinfo --json` output of Slurm 22.05.8 (Debian 12)
from sandboxes of `gpulab.backend.slurm_sandbox`, re-indented. The GPUs are GRES
without hardware (this machine has none).
"""

import contextlib
import json
import os
import random
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from slurmhelpers import needs_slurm
from support.wait import wait_until
from traitlets.config import Config

from gpulab.backend import slurm_sandbox
from gpulab.backend.slurm_inventory import (
    WHOLE_POOL,
    PoolError,
    SlurmInventory,
    gres_request,
)
from gpulab.db.engine import make_engine
from gpulab.scheduler.inventory import InventoryError
from gpulab.scheduler.ledger import Ledger, NoCapacity
from gpulab.scheduler.policy import get_policy

RECORDED = Path(__file__).parent / "recorded"

#: `sinfo --json` of a sandbox (gpu:2,shard:8 per node) after
#: `scontrol update nodename=sb28085n1 state=drain reason="gpu fan"`.
SINFO_DRAINED = (RECORDED / "sinfo-drained.json").read_text()

#: `sinfo --json` of a sandbox with gpu:2,shard:40 per node (20 shards per GPU), idle.
SINFO_20_SHARDS = (RECORDED / "sinfo-20-shards.json").read_text()


def inventory(**traits) -> SlurmInventory:
    c = Config()
    for name, value in traits.items():
        setattr(c.SlurmInventory, name, value)
    return SlurmInventory(config=c)


def drained_down() -> dict:
    """SINFO_DRAINED with node 1 down as well (`scontrol update ... state=down`
    gave exactly these two fields on that node)."""
    data = json.loads(SINFO_DRAINED)
    data["nodes"][1].update(state="down", state_flags=["DRAIN"])
    return data


# -- reading the nodes --------------------------------------------------------------------


def test_every_gres_gpu_of_an_available_node_is_a_gpu_row():
    inv = inventory(gpu_model="A100-80GB", simulated=True)
    gpus, reason = inv.parse(json.loads(SINFO_20_SHARDS))
    assert reason is None
    assert [(g.node, g.index) for g in gpus] == [
        ("sb65665n0", 0),
        ("sb65665n0", 1),
        ("sb65665n1", 0),
        ("sb65665n1", 1),
    ]
    assert {g.model for g in gpus} == {"A100-80GB"}
    assert {g.memory_mib for g in gpus} == {80 * 1024}
    assert all(g.simulated for g in gpus)
    assert len({g.uuid for g in gpus}) == 4
    # Stable: a restarted service finds the same GPUs, so the ledger's rows still match.
    again, _ = inventory(gpu_model="A100-80GB").parse(json.loads(SINFO_20_SHARDS))
    assert [g.uuid for g in again] == [g.uuid for g in gpus]
    assert inv.nodes["sb65665n0"]["gres"] == {"gpu": 2, "shard": 40}
    assert inv.nodes["sb65665n1"]["address"] == "10.97.62.11"


def test_a_drained_node_offers_no_gpu_and_the_reason_says_which_and_why():
    gpus, reason = inventory().parse(json.loads(SINFO_DRAINED))
    assert {g.node for g in gpus} == {"sb28085n0"}
    assert len(gpus) == 2
    assert "sb28085n1 (drain: gpu fan)" in reason


def test_a_down_node_offers_no_gpu():
    gpus, reason = inventory().parse(drained_down())
    assert {g.node for g in gpus} == {"sb28085n0"}
    assert "sb28085n1 (down+drain: gpu fan)" in reason


def test_the_gres_type_names_the_model_and_the_memory_table_sizes_it():
    # A real site's node: typed GRES with a socket suffix (`Gres=gpu:a100:4(S:0-1)`).
    data = json.loads(SINFO_20_SHARDS)
    data["nodes"][0]["gres"] = "gpu:a100:4(S:0-1),shard:80"
    gpus, _ = inventory(gpu_memory_mib={"a100": 40960}).parse(data)
    site = [g for g in gpus if g.node == "sb65665n0"]
    assert [(g.model, g.memory_mib) for g in site] == [("a100", 40960)] * 4
    # Untyped GRES: "GPU" of the default size unless gpu_model says more.
    other = [g for g in gpus if g.node == "sb65665n1"]
    assert {(g.model, g.memory_mib) for g in other} == {("GPU", 16 * 1024)}


def test_no_gpu_anywhere_is_a_reason_not_an_error():
    data = json.loads(SINFO_20_SHARDS)
    for node in data["nodes"]:
        node["gres"] = ""
    gpus, reason = inventory().parse(data)
    assert gpus == []
    assert "no node of the cluster declares GPUs" in reason


def test_a_cluster_that_cannot_be_read_stops_the_service(tmp_path):
    c = Config()
    c.SlurmSite.bin_dir = str(tmp_path)  # no sinfo there
    with pytest.raises(InventoryError, match="sinfo cannot run"):
        SlurmInventory(config=c).load()


# -- whole GPUs or shards --------------------------------------------------------------


def test_a_slice_is_shards_of_one_gpu_or_with_whole_gpus_gpus():
    node = {"gpu": 2, "shard": 40}  # 20 shards per GPU
    assert gres_request(0, node) == ""
    assert gres_request(100, node) == "shard:2"
    assert gres_request(250, node) == "shard:5"
    assert gres_request(500, node) == "shard:10"
    assert gres_request(1000, node) == "shard:20"
    with pytest.raises(PoolError, match="cannot be held with shards"):
        gres_request(2000, node)
    # 4 shards per GPU: 1/10 rounds up to a whole shard (Slurm holds 1/4).
    assert gres_request(100, {"gpu": 2, "shard": 8}) == "shard:1"
    assert gres_request(2000, {"gpu": 4}, WHOLE_POOL) == "gpu:2"
    with pytest.raises(PoolError, match="hands out whole GPUs"):
        gres_request(250, {"gpu": 4}, WHOLE_POOL)


def test_nodes_without_shards_are_offered_only_for_whole_gpus():
    data = json.loads(SINFO_20_SHARDS)
    data["nodes"][1]["gres"] = "gpu:4"
    gpus, reason = inventory().parse(data)
    assert {g.node for g in gpus} == {"sb65665n0"}
    assert "sb65665n1 (no shards" in reason
    whole = inventory(whole_gpus=True)
    gpus, reason = whole.parse(data)
    assert reason is None and len(gpus) == 6
    assert whole.gres_request(whole.nodes["sb65665n1"]["gres"], 2000) == "gpu:2"


def requests_of(ledger: Ledger, inv: SlurmInventory) -> list[tuple[str, int, str]]:
    """(node, first gpu index, --gres) of every owner the ledger holds."""
    by_owner = defaultdict(list)
    for row in ledger.list():
        by_owner[row["owner"]].append(row)
    out = []
    for rows in by_owner.values():
        node = rows[0]["node"]
        milli = sum(r["milli"] for r in rows)
        out.append((node, rows[0]["gpu_index"], inv.gres_request(inv.nodes[node]["gres"], milli)))
    return out


@pytest.mark.parametrize("whole_gpus", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_what_the_ledger_places_never_asks_slurm_for_more_than_the_node_has(
    tmp_path, seed, whole_gpus
):
    """Random servers come and go on the ledger over the Slurm inventory; a slice
    the partition cannot hold is refused and released (as the spawner does). At
    every moment each node is asked for one kind of GRES only (Slurm 22.05 would
    stack gpu and shard on one GPU), and for no more than it has: no GPU's shards
    twice, no more whole GPUs than the node has."""
    inv = inventory(whole_gpus=whole_gpus)
    gpus, _ = inv.parse(json.loads(SINFO_20_SHARDS))
    ledger = Ledger(make_engine(f"sqlite:///{tmp_path}/l.sqlite"), gpus, get_policy("gpulab"))
    rng = random.Random(seed)
    placed = refused = 0
    for step in range(150):
        held = sorted({r["owner"] for r in ledger.list()})
        if held and rng.random() < 0.35:
            ledger.release("server", rng.choice(held))
            continue
        milli = rng.choice([100, 250, 500, 1000, 2000])
        try:
            ledger.allocate("u", "server", f"s{step}", milli)
        except NoCapacity:
            continue
        try:
            asked = requests_of(ledger, inv)
        except PoolError:
            ledger.release("server", f"s{step}")
            refused += 1
            continue
        placed += 1
        kinds = defaultdict(set)
        shards = defaultdict(int)
        whole = defaultdict(int)
        for node, index, gres in asked:
            kind, count = gres.split(":")
            kinds[node].add(kind)
            if kind == "shard":
                shards[(node, index)] += int(count)
            else:
                whole[node] += int(count)
        assert all(len(k) == 1 for k in kinds.values()), kinds
        assert all(n <= 20 for n in shards.values()), shards
        assert all(n <= 2 for n in whole.values()), whole
    assert placed > 20 and refused > 0


# -- live ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox20():
    """Two nodes with 2 simulated GPUs of 20 shards each, and CPUs enough that
    only the GPUs limit how many jobs run at once (each job takes a CPU)."""
    base = Path(tempfile.mkdtemp(prefix="gpulab-slurm-inv-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    state = slurm_sandbox.start(base / "sandbox", nodes=2, gpus_spec="gpu:2,shard:40", cpus=16)
    try:
        yield state
    finally:
        slurm_sandbox.stop(base / "sandbox")
        subprocess.run(["rm", "-rf", str(base)], check=False)


def slurm(sandbox, *argv) -> str:
    env = {**os.environ, **slurm_sandbox.env(sandbox["data_dir"])}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30).stdout


@needs_slurm
@pytest.mark.slow
@pytest.mark.netns
def test_slurm_runs_at_once_every_slice_the_ledger_placed_on_the_sandbox(sandbox20, tmp_path):
    c = Config()
    c.SlurmSite.slurm_conf = slurm_sandbox.env(sandbox20["data_dir"])["SLURM_CONF"]
    c.SlurmInventory.gpu_model = "A100-80GB"
    c.SlurmInventory.simulated = True
    inv = SlurmInventory(config=c)
    gpus, reason = inv.load()
    names = [n["name"] for n in sandbox20["nodes"]]
    assert reason is None
    assert sorted({g.node for g in gpus}) == names and len(gpus) == 4
    assert inv.nodes[names[1]]["address"] == sandbox20["nodes"][1]["addr"]

    # Fill both nodes the way users would: fractions and whole GPUs, as long as
    # the ledger finds room (4 GPUs = 4000 milli).
    ledger = Ledger(make_engine(f"sqlite:///{tmp_path}/l.sqlite"), gpus, get_policy("gpulab"))
    sizes = [250, 500, 100, 1000, 250, 100, 500, 250, 100, 1000, 250, 100, 100, 100, 250]
    for i, milli in enumerate(sizes):
        with contextlib.suppress(NoCapacity):
            ledger.allocate("u", "server", f"s{i}", milli)
    assert sum(r["milli"] for r in ledger.list()) >= 3500
    jobs = []
    for node, _, gres in requests_of(ledger, inv):
        out = slurm(
            sandbox20,
            "sbatch",
            "--parsable",
            "-w",
            node,
            f"--gres={gres}",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        )
        assert out.strip().isdigit(), out
        jobs.append(out.strip())
    try:

        def all_running():
            states = slurm(sandbox20, "squeue", "-h", "-o", "%i %T %r")
            running = [line for line in states.splitlines() if " RUNNING " in f"{line} "]
            return len(running) == len(jobs) or None

        wait_until(
            all_running,
            "Slurm to run every slice the ledger placed",
            timeout=60,
            detail=lambda: slurm(sandbox20, "squeue", "-o", "%i %T %r %N %b"),
        )
        # Slurm's own count agrees: the shards of each node add up to the ledger's milli.
        # The shards Slurm holds per node are exactly the ledger's milli (20 per GPU).
        for node in names:
            held = sum(r["milli"] for r in ledger.list() if r["node"] == node)
            asked = [g for n, _, g in requests_of(ledger, inv) if n == node]
            assert held * 20 // 1000 == sum(int(g.split(":")[1]) for g in asked)
            assert all(g.startswith("shard:") for g in asked)
    finally:
        slurm(sandbox20, "scancel", *jobs)
