"""The dashboard's data model against the real service's telemetry answers (no mocks):
the service in this process (tests/widgets/conftest.py), sampling this machine."""

import asyncio
import math
from html import escape

import numpy as np
import pytest

import gpulab.cache
from gpulab.client import GpuLabError
from gpulab.widgets import TelemetryModel
from gpulab.widgets.figures import cache_plot, cluster_plot, jobs_plot, network_plot
from gpulab.widgets.tables import cache_tables, cluster_tables, jobs_tables, status_line


def served(answer):
    return {node: [s["ts"] for s in e["samples"]] for node, e in answer["nodes"].items()}


async def enough_history(client, wait_for, seconds=5.0):
    """An answer (since unset) whose samples span at least ``seconds``."""

    def ready():
        a = client.telemetry()
        ts = [t for v in served(a).values() for t in v]
        return a if ts and a["now"] - min(ts) >= seconds and len(ts) >= 5 else None

    return await wait_for(ready, what=f"{seconds:g}s of samples on the service")


def first_nic(m, node):
    return next((t, v) for (n, _), t, v in m.series(m.nics) if n == node)


async def test_first_answer_backfills_and_later_ones_only_add(clients, wait_for):
    alice = clients["alice"]
    answer = await enough_history(alice, wait_for)
    m = TelemetryModel()
    assert m.cursor() is None
    assert m.ingest(answer) == sum(len(v) for v in served(answer).values())
    node, stamps = next(iter(served(answer).items()))
    t, v = first_nic(m, node)
    # The whole recent history at once, as the service kept it: a reload loses nothing.
    assert t.tolist() == stamps and v.shape == (len(stamps), 2)
    assert m.cursor() == stamps[-1]
    assert m.ingest(answer) == 0  # overlapping answers add nothing twice

    later = await wait_for(
        lambda: (
            (a := alice.telemetry(m.cursor()))
            and any(e["samples"] for e in a["nodes"].values())
            and a
        ),
        what="samples newer than the cursor",
    )
    new = served(later)[node]
    assert new and min(new) > stamps[-1]
    m.ingest(later)
    t2, _ = first_nic(m, node)
    assert t2.tolist() == stamps + new
    assert np.all(np.diff(t2) > 0)


async def test_history_is_bounded_by_count_and_by_age(clients, wait_for):
    answer = await enough_history(clients["alice"], wait_for, seconds=6.0)
    node, stamps = next(iter(served(answer).items()))

    by_count = TelemetryModel(capacity=4)
    by_count.ingest(answer)
    assert all(len(ring) == 4 for ring in by_count.nics.values())
    assert first_nic(by_count, node)[0].tolist() == stamps[-4:]

    by_age = TelemetryModel(max_age_s=3.0)
    by_age.ingest(answer)
    shown = first_nic(by_age, node)[0].tolist()
    assert shown == [ts for ts in stamps if ts > answer["now"] - 3.0]
    assert len(shown) < len(stamps)


async def test_missing_sources_say_why_instead_of_zeros(service, clients, wait_for, tmp_path):
    answer = await wait_for(
        lambda: (
            ((a := clients["alice"].telemetry()) and any(e["samples"] for e in a["nodes"].values()))
            and a
        ),
        what="a first sample on the service",
    )
    m = TelemetryModel()
    m.ingest(answer)
    node, entry = next(iter(answer["nodes"].items()))
    reason = entry["missing"]["gpu"]
    assert "no NVIDIA driver" in reason  # this machine has no GPU
    assert m.missing_sources("gpu") == {"gpu": {node: reason}}
    assert not m.gpus  # nothing drawn for the GPUs, not a flat zero line
    gpus, slices = cluster_plot(m)
    # No GPU charts at all, rather than the same error in each of them ...
    assert gpus.hidden and not gpus.traces and not gpus.notes
    # ... but the simulated GPUs' slices are real.
    assert [t.key for t in slices.traces if t.key.endswith("held")] == [
        f"{node} GPU 0 held",
        f"{node} GPU 1 held",
    ]
    status = status_line(m, "Cluster", None)
    assert "No GPU telemetry on this machine" in status and "simulated" in status
    assert status.count(escape(reason)) == 1  # the reason once, in full
    assert "rdma missing" in status_line(m, "Network", None)
    cache_status = status_line(m, "Cache", None)
    assert "No dataset cache reports on this machine" in cache_status
    assert cache_status.count(escape(entry["missing"]["cache"])) == 1
    assert cache_plot(m).hidden and cache_tables(m) == ""

    # Reading a file through the node's dataset cache makes the source appear.
    shard = tmp_path / "shard.bin"
    shard.write_bytes(b"x" * 65536)
    for _ in range(3):
        with gpulab.cache.open(str(shard), cache_dir=str(service.data_dir / "dataset-cache")) as f:
            assert len(f.read()) == 65536

    def cache_reported():
        m.ingest(clients["alice"].telemetry(m.cursor()))
        return node in m.cache and "cache" not in m.missing[node]

    await wait_for(cache_reported, what="the cache to be sampled")
    _, v = next((t, v) for n, t, v in m.series(m.cache) if n == node)
    assert math.isclose(v[-1, 0], 2 / 3)  # one miss, two hits
    assert not cache_plot(m).notes and not cache_plot(m).hidden
    assert "No dataset cache" not in status_line(m, "Cache", None)
    assert "hit ratio" in cache_tables(m)


async def test_slices_are_shown_as_served(clients, names):
    alice, bob = names["alice"], names["bob"]
    models = {}
    for name in ("alice", "bob", "admin"):
        models[name] = TelemetryModel()
        models[name].ingest(await asyncio.to_thread(clients[name].telemetry))
    assert [(s["user"], s["milli"]) for s in models["alice"].slices] == [(alice, 250)]
    assert [(s["user"], s["milli"]) for s in models["bob"].slices] == [(bob, 500)]
    assert sorted((s["user"], s["milli"]) for s in models["admin"].slices) == [
        (alice, 250),
        (bob, 500),
    ]
    # Totals are everyone's, for everyone.
    for m in models.values():
        held = [g["allocated_milli"] for n in m.inventory["nodes"] for g in n["gpus"]]
        assert sum(held) == 750
    mine = cluster_tables(models["alice"], alice)
    assert "you · 1/4 GPU" in mine and bob not in mine
    # The holder as the service's pages name it, not its ledger id.
    assert f"{escape(alice)}&#x27;s server" in mine and f"{alice}/<" not in mine
    everyone = cluster_tables(models["admin"], "admin")
    assert f"{alice} · 1/4 GPU" in everyone and f"{bob} · 1/2 GPU" in everyone


async def test_allreduce_results_reach_the_network_tab(clients):
    result = {
        "busbw_bytes_per_second": 3.0e9,
        "algbw_bytes_per_second": 2.0e9,
        "size_bytes": 2**24,
        "world_size": 4,
        "backend": "gloo",
        "nodes": ["n1", "n2"],
    }
    # Users' results come from their nettest jobs; only admins (and the service) post.
    with pytest.raises(GpuLabError) as refused:
        await asyncio.to_thread(clients["alice"].report_allreduce, result)
    assert refused.value.status == 403 and "nettest" in str(refused.value)
    await asyncio.to_thread(clients["admin"].report_allreduce, result)
    mine, bobs = TelemetryModel(), TelemetryModel()
    mine.ingest(await asyncio.to_thread(clients["admin"].telemetry))
    bobs.ingest(await asyncio.to_thread(clients["bob"].telemetry))
    assert any(
        r["user"] == "admin" and r["busbw_bytes_per_second"] == 3.0e9 for r in mine.allreduce
    )
    assert not any(r["user"] == "admin" for r in bobs.allreduce)
    bus = next(t for t in network_plot(mine).traces if t.key == "all-reduce busbw")
    assert 3.0 in bus.y.tolist()  # GB/s
    assert any("no all-reduce measured yet" in n.text for n in network_plot(bobs).notes)


def test_jobs_show_whatever_keys_they_carry():
    # The jobs feature fills `jobs`; until it does, a literal answer of that shape.
    answer = {
        "now": 1000.0,
        "interval_s": 1.0,
        "nodes": {},
        "inventory": {"nodes": []},
        "slices": [],
        "free_sizes": {},
        "allreduce": [],
        "jobs": [
            {
                "id": "j1",
                "name": "bert",
                "user": "alice",
                "state": "running",
                "step": 10,
                "total_steps": 100,
                "loss": 2.5,
                "samples_per_second": 812.0,
            },
            {"id": "j2", "state": "queued"},
        ],
    }
    m = TelemetryModel()
    m.ingest(answer)
    m.ingest(
        {
            **answer,
            "now": 1001.0,
            "jobs": [{**answer["jobs"][0], "step": 11, "loss": 2.25}, answer["jobs"][1]],
        }
    )
    html = jobs_tables(m)
    for text in ("bert", "running", "queued", "2.2500", "812.0", ">of steps<", ">samples/s<"):
        assert text in html
    assert "total_steps" not in html and "samples_per_second" not in html
    plot = jobs_plot(m)
    loss = next(t for t in plot.traces if t.key == "bert")
    assert loss.x.tolist() == [-1.0, 0.0] and loss.y.tolist() == [2.5, 2.25]
    assert "2 jobs" in status_line(m, "Jobs", None)
