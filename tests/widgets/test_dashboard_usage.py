"""The dashboard's Usage tab (GPU-hours, last 7 days, by user and by kind).

The other widget tests read a real hub's telemetry; this service has no
``GET /usage`` route here yet, so these use a stand-in client that answers in
the route's documented shape (or raises what ``gpulab.client`` raises). The
route itself is tested with the service; the client call against a real HTTP
server in tests/client/test_usage_client.py. No hub is started.
"""

import time
from datetime import datetime, timedelta
from html import escape

import pytest

from gpulab.client import NotFound, ServiceUnreachable
from gpulab.widgets import Dashboard, TelemetryModel
from gpulab.widgets.figures import TABS, usage_plot
from gpulab.widgets.tables import status_line, usage_tables

EMPTY = "No GPU time used in the last 7 days"


def answer(group_by, rows):
    return {
        "since": "2026-11-24T00:00:00+00:00",
        "until": "2026-12-01T00:00:00+00:00",
        "group_by": group_by,
        "rows": rows,
    }


def row(group_by, name, milli_gpu_seconds, allocations=1):
    return {
        group_by: name,
        "gpu_hours": milli_gpu_seconds / 1000 / 3600,
        "milli_gpu_seconds": milli_gpu_seconds,
        "allocations": allocations,
    }


BY_USER = answer("user", [row("user", "alice", 4_500_000, 3), row("user", "bob", 1_800_000)])
BY_KIND = answer("kind", [row("kind", "server", 5_400_000, 3), row("kind", "job", 900_000)])


class StandIn:
    """Answers ``telemetry`` (nothing measured) and ``usage`` like the client does."""

    def __init__(self, by_user=BY_USER, by_kind=BY_KIND, fails=None):
        self.answers = {"user": by_user, "kind": by_kind}
        self.fails = fails
        self.usage_calls = []

    def telemetry(self, since=None):
        return {"now": time.time(), "interval_s": 1.0, "nodes": {}, "inventory": {"nodes": []}}

    def usage(self, since=None, until=None, group_by="user"):
        self.usage_calls.append({"since": since, "until": until, "group_by": group_by})
        if self.fails:
            raise self.fails
        return self.answers[group_by]


@pytest.fixture
def board():
    made = []

    def make(client, user="alice", **kwargs):
        d = Dashboard(client=client, user=user, start=False, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def show_usage(d):
    d.tabs.selected_index = list(TABS).index("Usage")


def bars(d):
    """{trace name: (labels top first, GPU-hours)} of the Usage figure as drawn."""
    shown = d.figures["Usage"].widget.data
    return {
        t.name: (list(t.y)[::-1], [round(x, 4) for x in t.x][::-1])
        for t in shown
        if t.type == "bar"
    }


def test_the_usage_tab_is_one_of_the_dashboards_tabs(board):
    d = board(StandIn())
    assert list(TABS)[-1] == "Usage"
    assert d.tabs.titles[-1] == "Usage"
    assert "Usage" in d.figures and "Usage" in d._status
    assert "GPU-hours not fetched yet" in d._status["Usage"].value


def test_rows_by_user_and_by_kind_are_drawn_and_listed(board):
    client = StandIn()
    d = board(client)
    show_usage(d)
    before = datetime.now().astimezone()
    assert d.refresh() is True
    # Two calls: the last 7 days by user and by kind (until: the service's now).
    assert [c["group_by"] for c in client.usage_calls] == ["user", "kind"]
    since = datetime.fromisoformat(client.usage_calls[0]["since"])
    assert abs(since - (before - timedelta(days=7))) < timedelta(minutes=1)
    assert client.usage_calls[0]["until"] is None
    assert d.error is None

    assert bars(d) == {
        "GPU-hours by user": (["alice", "bob"], [1.25, 0.5]),
        # Every kind is listed; one that used nothing is a 0 bar.
        "GPU-hours by kind": (["server", "job", "deployment"], [1.5, 0.25, 0.0]),
    }
    status = d._status["Usage"].value
    assert "1.75 GPU-hours</b> used in the last 7 days" in status
    assert "GPU-hours updated" in status and "never" not in status
    tables = d._tables["Usage"].value
    for text in ("alice (you)", "1.25", "bob", "0.50", "server", "1.50", "deployment", "0.00"):
        assert text in tables
    assert escape("(everyone's)") in tables  # alice sees bob's row: she is an admin here


def test_usage_is_fetched_at_its_own_slower_pace(board):
    client = StandIn()
    d = board(client)
    for _ in range(3):
        assert d.refresh()
    assert len(client.usage_calls) == 2  # once (by user, by kind), not every tick
    assert d.model.answers == 3

    eager = StandIn()
    d = board(eager, usage_interval=0)
    for _ in range(2):
        assert d.refresh()
    assert len(eager.usage_calls) == 4


def test_a_user_sees_their_own_row(board):
    mine = answer("user", [row("user", "bob", 1_800_000, 2)])
    d = board(StandIn(by_user=mine), user="bob")
    d.refresh()
    d.draw_all()
    tables = d._tables["Usage"].value
    assert "bob (you)" in tables and "(yours)" in tables and "alice" not in tables


def test_many_users_draw_the_top_ten_and_one_bar_for_the_rest(board):
    rows = [row("user", f"u{i:02d}", (30 - i) * 360_000) for i in range(14)]
    d = board(StandIn(by_user=answer("user", rows)), user="admin")
    show_usage(d)
    d.refresh()
    labels, hours = bars(d)["GPU-hours by user"]
    assert labels == [f"u{i:02d}" for i in range(10)] + ["4 others"]
    assert hours[0] == 3.0 and hours[-1] == round(sum((30 - i) * 0.1 for i in range(10, 14)), 4)
    assert "u13" in d._tables["Usage"].value  # the table lists everyone


def test_no_gpu_time_says_so(board):
    d = board(StandIn(by_user=answer("user", []), by_kind=answer("kind", [])))
    show_usage(d)
    d.refresh()
    assert EMPTY in d._status["Usage"].value
    notes = [a.text for a in d.figures["Usage"].widget.layout.annotations]
    assert notes.count(EMPTY) == 2  # one per subplot, instead of empty axes
    assert not bars(d)
    assert d._tables["Usage"].value == ""


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (NotFound(404, "404: Not Found"), "no usage report (404"),
        (ServiceUnreachable(0, "no answer from the gpulab service at http://x"), "no answer"),
    ],
)
def test_a_service_error_is_one_line_in_the_tab_not_a_traceback(board, error, line):
    d = board(StandIn(fails=error))
    show_usage(d)
    assert d.refresh() is True  # the telemetry tabs are not held back by /usage
    assert d.error is None
    status = d._status["Usage"].value
    assert "GPU-hours are not available" in status and line in status
    assert "Traceback" not in status and "update failed" not in status
    assert "GPU-hours are not available" not in d._status["Cluster"].value
    notes = [a.text for a in d.figures["Usage"].widget.layout.annotations]
    assert any(line in n for n in notes)
    assert d._tables["Usage"].value == ""
    assert d.refresh_usage() is False


def test_an_error_after_rows_clears_them():
    m = TelemetryModel()
    m.usage.ingest(BY_USER, BY_KIND, time.time())
    assert "alice" in usage_tables(m, "alice")
    m.usage.fail("GPU-hours are not available (500): boom")
    assert usage_tables(m, "alice") == ""
    assert not usage_plot(m).traces
    assert "boom" in status_line(m, "Usage", None)


def test_rows_without_gpu_hours_are_computed_from_milli_gpu_seconds():
    m = TelemetryModel()
    by_user = answer("user", [{"user": "carol", "milli_gpu_seconds": 7_200_000}])
    m.usage.ingest(by_user, answer("kind", []), time.time())
    assert m.usage.by_user == [{"name": "carol", "gpu_hours": 2.0, "allocations": None}]
    assert "2.00" in usage_tables(m, None)
