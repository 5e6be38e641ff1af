"""The Dashboard widget itself (no browser): its updater thread, tabs, errors, close().

Against the real service in this process (tests/widgets/conftest.py): the updater
thread asks it over HTTP while the test awaits; ``close()`` joins that thread, so it
runs in a thread too (the loop must serve the request the updater may be making)."""

import asyncio

from gpulab.client import Client
from gpulab.widgets import Dashboard


async def test_updates_from_its_thread_with_history_and_stops_on_close(clients, names, wait_for):
    # The module's service has just started: some history first, for the dashboard to find.
    await wait_for(
        lambda: any(len(e["samples"]) >= 3 for e in clients["alice"].telemetry()["nodes"].values()),
        what="3 samples on the service",
    )
    d = Dashboard(client=clients["alice"], user=names["alice"])
    try:
        assert d.running
        await wait_for(lambda: d.model.answers >= 1, what="the first answer")
        # A new dashboard starts with the service's recent history, not one point.
        assert max(len(r) for r in d.model.nics.values()) >= 3
        first = d.model.points()
        await wait_for(
            lambda: d.model.points() > first and d.model.answers >= 3,
            what="the updater to add points",
        )
        assert d.error is None
        gpus, slices = d.figures["Cluster"].parts
        cluster = slices.widget
        await wait_for(
            lambda: any(t.name.endswith("held") and len(t.x) for t in cluster.data),
            what="the Cluster figure to be drawn",
        )
        assert "no NVIDIA driver" in d._status["Cluster"].value
        assert not gpus.shown  # no GPU telemetry here: no GPU charts, one notice
        assert "you · 1/4 GPU" in d._tables["Cluster"].value

        # Hidden tabs are drawn when shown.
        d.tabs.selected_index = list(d.figures).index("Network")
        network = d.figures["Network"].widget
        await wait_for(
            lambda: any(len(t.x) > 1 for t in network.data if t.x is not None),
            what="the Network figure to be drawn",
        )
        await asyncio.to_thread(d.draw_all)
        assert "no jobs to show" in d._status["Jobs"].value
    finally:
        await asyncio.to_thread(d.close)
    assert not d.running


async def test_errors_show_in_the_status_line_not_raised(service, wait_for, monkeypatch):
    d = Dashboard(client=Client(service.api, token="not-a-valid-token"))
    try:
        await wait_for(
            lambda: "update failed" in d._status["Cluster"].value, what="the error to show"
        )
        assert d.running  # it keeps retrying
        assert d.error
    finally:
        await asyncio.to_thread(d.close)

    monkeypatch.delenv("GPULAB_API_URL", raising=False)
    d = Dashboard(start=False)
    assert d.refresh() is False
    assert "GPULAB_API_URL" in d._status["Network"].value
    d.close()
