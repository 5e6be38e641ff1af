"""The dashboard's Alerts tab, its badge ("Alerts (2)") and the header's marker, drawn
from real ``GET /alerts`` answers.

The service is the real one in this process (``support.service.running_service``,
with its stand-in hub API); alert rows are written straight into its database
(table ``gpulab_alerts``) so each test knows exactly which alerts exist, and the
dashboard reads them through the real client over HTTP. No hub is started.
"""

import asyncio
import datetime as dt
import json
import re

import pytest
from support.service import running_service
from support.wait import wait_until_async

from gpulab.client import BadRequest, Client
from gpulab.db.operations import alerts as alerts_table
from gpulab.widgets import Dashboard
from gpulab.widgets.figures import TABS
from gpulab.widgets.tables import ago, how_long

EMPTY = "No alerts in the last 24 h"


def row(name, severity, kind, subject, owner, message, since_min, resolved_min=None):
    """One alert episode: fired ``since_min`` minutes ago, resolved ``resolved_min`` ago
    (counted from when :func:`seed` writes it, so a slow suite cannot age it)."""
    return {
        "key": f"{name}|{subject}",
        "name": name,
        "severity": severity,
        "subject_kind": kind,
        "subject": subject,
        "owner": owner,
        "message": message,
        "labels": json.dumps({"subject": subject}),
        "since_min": since_min,
        "resolved_min": resolved_min,
    }


#: The alert engine evaluates once at start (nothing fires on this empty cluster) and
#: not again during a test: the alerts are exactly the rows a test writes.
CONFIG = "c.Alerting.alert_interval_seconds = 3600\n"


def serve(tmp_path):
    return running_service(tmp_path / "svc", config=CONFIG)


GPU = "GPU-8f1e2a3b-0c4d-4e5f-8a9b-0123456789ab"
ALERTS = [
    row("JobStalled", "critical", "job", "3f2a1b9c0d1e", "alice",
        "job 3f2a1b9c0d1e made no step for 10 min: see its log", since_min=5),
    row("GpuXidErrors", "warning", "gpu", GPU, None,
        "XID 79 on node-1 GPU 0 (fell off the bus): cordoned; an admin drains the node", 130),
    row("QuotaNearlyUsed", "warning", "user", "bob", "bob",
        "bob holds 950 of 1000 milli-GPU: release a slice", since_min=20),
    row("DiskNearlyFull", "warning", "disk", "node-1:/data", None,
        "/data on node-1 is 96% full: delete old checkpoints", since_min=90, resolved_min=60),
    row("JobFailed", "critical", "job", "77aa00bb11cc", "alice",
        "job 77aa00bb11cc failed: rank 1 exited 1", since_min=45, resolved_min=43),
    # Resolved two days ago: outside the dashboard's 24 h.
    row("JobRestartLoop", "warning", "job", "0123456789ab", "alice",
        "job restarted 5 times", since_min=3000, resolved_min=2900),
]  # fmt: skip


def seed(svc, rows):
    now = dt.datetime.now(dt.UTC)

    def ago(minutes):
        return None if minutes is None else now - dt.timedelta(minutes=minutes)

    written = []
    for r in rows:
        r = dict(r)
        since, resolved = ago(r.pop("since_min")), ago(r.pop("resolved_min"))
        written.append({**r, "since": since, "resolved_at": resolved, "updated": resolved or since})
    with svc.app.engine.begin() as c:
        c.execute(alerts_table.insert(), written)


def alerts_page(d):
    """The Alerts tab: its status line and its tables."""
    return d._status["Alerts"].value + d._tables["Alerts"].value


def firing_part(d):
    """The tab's "firing now" table."""
    tables = d._tables["Alerts"].value
    return tables.split("firing now", 1)[1].split("resolved in the last", 1)[0]


def resolved_part(d):
    """The tab's resolved table ('' when there is none)."""
    return d._tables["Alerts"].value.partition("resolved in the last")[2]


def firing_names(d):
    """Alert names of the "firing now" table, top to bottom."""
    return re.findall(r"<b>(\w+)</b>", firing_part(d))


async def board(svc, token, user, **kw):
    d = Dashboard(client=Client(svc.api, token=token), user=user, start=False, **kw)
    assert await asyncio.to_thread(d.refresh) is True, d.error
    d.tabs.selected_index = list(TABS).index("Alerts")
    d.draw_all()
    return d


def test_relative_times_and_durations_read_at_a_glance():
    assert [how_long(s) for s in (0, 45, 300, 7200, 7500, 90000, 86400 * 3)] == [
        "0 s",
        "45 s",
        "5 min",
        "2 h",
        "2 h 5 min",
        "1 d 1 h",
        "3 d",
    ]
    assert ago(1000.0, 1003.0) == "just now" and ago(1000.0, 1300.0) == "5 min ago"
    assert ago(None, 1.0) == "—"


async def test_an_admin_sees_every_alert_firing_first_with_the_badge_and_a_red_marker(tmp_path):
    async with serve(tmp_path) as svc:
        svc.create_user("alice")
        svc.create_user("bob")
        seed(svc, ALERTS)
        d = await board(svc, svc.admin_token, "admin")
        try:
            index = list(TABS).index("Alerts")
            assert d.tabs.get_title(index) == "Alerts (3)"
            # Red: the worst firing alert is critical.
            marker = re.search(r'class="gpulab-alert-marker" data-severity="(\w+)"', d.header.value)
            assert marker and marker.group(1) == "critical"
            assert "#b00020" in d.header.value and "3 alerts firing" in d.header.value

            page = alerts_page(d)
            assert (
                "3 alerts firing</b> (1 critical, 2 warning); 2 resolved in the last 24 h" in page
            )
            # Firing first, the worst first, then the newest; the resolved ones after.
            assert firing_names(d) == ["JobStalled", "QuotaNearlyUsed", "GpuXidErrors"]
            tables = d._tables["Alerts"].value
            assert tables.index("firing now") < tables.index("resolved in the last 24 h")
            firing = firing_part(d)
            assert "job 3f2a1b9c0d1e" in firing and GPU in firing
            assert "5 min ago" in firing and "2 h 10 min ago" in firing
            # An admin's list names the owner; shared things have none.
            assert "<th" in firing and ">owner</th>" in firing
            assert "— (shared)" in firing and ">bob<" in firing
            assert "see its log" in firing
            # Severity markers: critical red, warning amber.
            assert 'data-severity="critical" style="color:#b00020"' in firing
            assert 'data-severity="warning" style="color:#e69500"' in firing
            assert 'style="color:#888"' not in firing
            # Resolved: greyed, with how long they lasted; older than 24 h: not listed.
            resolved = resolved_part(d)
            assert "DiskNearlyFull" in resolved and "JobFailed" in resolved
            assert "lasted</th>" in resolved and "30 min" in resolved and "2 min" in resolved
            assert "1 h ago" in resolved  # DiskNearlyFull resolved 60 min ago
            cells = re.findall(r"<td [^>]*>(.*?)</td>", resolved)
            assert len(cells) == 2 * 7 and all(  # 2 rows of 7 columns, every cell grey
                c.startswith('<span style="color:#888">') for c in cells
            ), cells
            assert "JobRestartLoop" not in page
            assert EMPTY not in page
        finally:
            d.close()


async def test_a_user_sees_only_their_own_alerts_without_an_owner_column(tmp_path):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        seed(svc, ALERTS)
        d = await board(svc, alice, "alice")
        e = await board(svc, bob, "bob")
        try:
            page = alerts_page(d)
            assert d.tabs.get_title(list(TABS).index("Alerts")) == "Alerts (1)"
            assert firing_names(d) == ["JobStalled"]
            assert "JobFailed" in resolved_part(d)
            for other in ("GpuXidErrors", "QuotaNearlyUsed", "DiskNearlyFull", GPU):
                assert other not in page
            assert ">owner</th>" not in page
            assert 'data-severity="critical"' in d.header.value

            # Bob's one alert is a warning: his marker is amber, not red.
            assert e.tabs.get_title(list(TABS).index("Alerts")) == "Alerts (1)"
            assert 'data-severity="warning"' in e.header.value
            assert "#ffb300" in e.header.value and "#b00020" not in e.header.value
            assert firing_names(e) == ["QuotaNearlyUsed"]
            assert "JobStalled" not in alerts_page(e)
        finally:
            d.close()
            e.close()


async def test_no_alerts_says_so_and_shows_no_badge(tmp_path):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        # Only an old one: nothing in the last 24 h.
        seed(svc, [ALERTS[-1]])
        d = await board(svc, alice, "alice")
        try:
            assert d.tabs.get_title(list(TABS).index("Alerts")) == "Alerts"
            assert "gpulab-alert-marker" not in d.header.value
            assert "No alerts firing" in d._status["Alerts"].value
            assert EMPTY in d._tables["Alerts"].value
            assert "gpulab-alerts-empty" in d._tables["Alerts"].value
            assert "<table" not in d._tables["Alerts"].value
        finally:
            d.close()


async def test_the_badge_follows_the_alerts_on_the_dashboards_own_poll(tmp_path):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        d = Dashboard(
            client=Client(svc.api, token=alice), user="alice", interval=0.2, alerts_interval=0
        )
        title = lambda: d.tabs.get_title(list(TABS).index("Alerts"))  # noqa: E731

        async def until(check, what):
            # A minute: the poll runs on a thread of a busy machine.
            try:
                await wait_until_async(check, what, timeout=60)
            except AssertionError as e:
                raise AssertionError(f"{e}: title {title()!r}, header {d.header.value!r}") from None

        try:
            await until(lambda: d.model.alerts.fetched is not None, "the first alerts fetch")
            assert title() == "Alerts"
            seed(svc, [ALERTS[0]])
            await until(lambda: title() == "Alerts (1)", "the badge to count the new alert")
            assert "gpulab-alert-marker" in d.header.value
            with svc.app.engine.begin() as c:
                c.execute(
                    alerts_table.update()
                    .where(alerts_table.c.name == "JobStalled")
                    .values(resolved_at=dt.datetime.now(dt.UTC))
                )
            await until(lambda: title() == "Alerts", "the badge to drop the resolved alert")
            assert "gpulab-alert-marker" not in d.header.value
            d.tabs.selected_index = list(TABS).index("Alerts")
            await until(lambda: "No alerts firing" in d._status["Alerts"].value, "the tab")
            assert "JobStalled" in resolved_part(d)
            assert d.error is None
        finally:
            await asyncio.to_thread(d.close)


async def test_the_client_filters_by_state_and_refuses_a_bad_one(tmp_path):
    async with serve(tmp_path) as svc:
        alice = svc.create_user("alice")
        seed(svc, ALERTS)
        client = Client(svc.api, token=alice)
        firing = await asyncio.to_thread(client.alerts, state="firing")
        assert [a["name"] for a in firing["alerts"]] == ["JobStalled"] and firing["firing"] == 1
        resolved = await asyncio.to_thread(client.alerts, state="resolved")
        assert [a["name"] for a in resolved["alerts"]] == ["JobFailed"]
        assert resolved["firing"] == 1  # what fires now, whatever the filter
        since = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
        every = await asyncio.to_thread(client.alerts, state="all", since=since)
        assert [a["name"] for a in every["alerts"]] == ["JobStalled", "JobFailed", "JobRestartLoop"]
        with pytest.raises(BadRequest):
            await asyncio.to_thread(client.alerts, state="burning")
