"""The dashboard on a machine without GPU telemetry, from a literal telemetry answer
(the shape ``GET /telemetry`` serves; the hub-backed tests check the real one): one
notice instead of an error in every chart, readable headers, holders with fractions."""

import re

from gpulab.client.units import gpu_label, holders
from gpulab.client.units import plural as units_plural
from gpulab.scheduler.slices import label
from gpulab.scheduler.slices import plural as slices_plural
from gpulab.widgets import TelemetryModel
from gpulab.widgets.figures import cache_plot, cluster_plot, network_plot
from gpulab.widgets.tables import (
    cache_tables,
    cluster_tables,
    jobs_tables,
    network_tables,
    status_line,
)

NO_DRIVER = "no NVIDIA driver: NVML library not found (NVMLError_LibraryNotFound)"
NO_CACHE = (
    "no dataset cache at /tmp/a/rather/long/path/dataset-cache yet (no index.sqlite); it "
    "appears when a process first reads through gpulab.cache with this cache_dir"
)


def gpu(index, held):
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "model": "A100-80GB",
        "memory_mib": 81920,
        "simulated": True,
        "allocated_milli": held,
    }


def held(user, milli, index=0, owner="x/"):
    return {
        "user": user,
        "milli": milli,
        "gpu_uuid": f"GPU-{index}",
        "gpu_index": index,
        "node": "vm",
        "owner_kind": "server",
        "owner": owner,
    }


ANSWER = {
    "now": 1000.0,
    "interval_s": 1.0,
    "nodes": {
        "vm": {
            "missing": {"gpu": NO_DRIVER, "cache": NO_CACHE, "rdma": "no RDMA devices"},
            "samples": [{"ts": 999.0, "nics": [{"device": "eth0", "rx_bytes_per_second": 1}]}],
        }
    },
    "inventory": {"nodes": [{"name": "vm", "gpus": [gpu(0, 1000), gpu(1, 0)]}]},
    "slices": [
        held("me", 250, owner="me/"),
        held("alice", 250, owner="alice/a"),
        held("alice", 250, owner="alice/b"),
        held("bob", 250, owner="bob/"),
    ],
    "free_sizes": {"vm": [{"milli": 250, "label": "1/4 GPU", "count": 4}]},
    "jobs": [],
    "allreduce": [],
}


def model():
    m = TelemetryModel()
    m.ingest(ANSWER)
    return m


def test_no_gpu_telemetry_is_one_notice_not_an_error_per_chart():
    m = model()
    gpus, slices = cluster_plot(m)
    assert gpus.hidden  # the four GPU charts are not shown at all
    assert [t.key for t in slices.traces] == ["vm GPU 0 held", "vm GPU 1 held", "vm free"]
    assert slices.traces[0].y.tolist() == [1.0]  # the share of the GPU, not milli-GPU
    status = status_line(m, "Cluster", None)
    assert status.count('class="gpulab-notice"') == 1
    assert "No GPU telemetry on this machine" in status
    assert "GPU charts appear when a node agent reports NVML data" in status
    assert status.count(NO_DRIVER) == 1 and "gpu missing on" not in status

    assert cache_plot(m).hidden and cache_tables(m) == ""
    cache = status_line(m, "Cache", None)
    assert "No dataset cache reports on this machine" in cache and cache.count(NO_CACHE) == 1

    # Nothing anywhere is cut short with an ellipsis.
    notes = [n.text for n in network_plot(m).notes]
    shown = [status, cache, status_line(m, "Network", None), *notes, cluster_tables(m, "me")]
    assert not [s for s in shown if "…" in s]


def test_held_by_names_each_holder_once_with_the_fraction():
    html = cluster_tables(model(), "me")
    row = re.search(r"<tr><td[^>]*>vm</td><td[^>]*>0</td>.*?</tr>", html).group(0)
    assert ">1 GPU<" in row  # held, every user's total
    assert re.findall(r"(you|alice|bob) · ([^<]+)<", row) == [
        ("alice", "1/2 GPU"),
        ("bob", "1/4 GPU"),
        ("you", "1/4 GPU"),
    ]
    assert "250" not in row and "milli" not in html


def test_every_table_header_is_words_not_field_names():
    m = model()
    m.ingest(
        {
            **ANSWER,
            "now": 1001.0,
            "jobs": [{"id": "j1", "total_steps": 9, "samples_per_second": 1.0, "step": 1}],
            "allreduce": [{"ts": 1000.5, "world_size": 2, "busbw_bytes_per_second": 1e9}],
        }
    )
    html = cluster_tables(m, "me") + jobs_tables(m) + network_tables(m)
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", html)
    assert "GPU memory used / total" in headers and "samples/s" in headers
    assert [h for h in headers if "_" in h] == []


def test_fractions_read_as_the_scheduler_says_them():
    for milli in (0, 100, 125, 200, 250, 333, 500, 750, 1000, 2000, 3000, 50, 1):
        assert gpu_label(milli) == label(milli)
    for n in (0, 1, 2):
        assert units_plural(n, "rank") == slices_plural(n, "rank")
    assert units_plural(1, "call") == "1 call" and units_plural(2, "call") == "2 calls"
    assert holders([held("a", 500), held("me", 250), held("a", 500)], "me") == [
        "a · 1 GPU",
        "you · 1/4 GPU",
    ]
