"""``Dashboard``: one live panel (ipywidgets): Cluster, Cache, Network, Jobs, Alerts, Usage.

One daemon thread polls ``GET /telemetry`` through ``gpulab.client`` about once a
second and redraws; every ``usage_interval`` seconds (30) the same thread also
asks ``GET /usage`` for the last 7 days' GPU-hours, by user and by kind, for the
Usage tab (they change slowly). Every ``alerts_interval`` seconds (5) it asks
``GET /alerts`` for the alerts of the last 24 h: the Alerts tab lists them, its
title counts the firing ones ("Alerts (2)") and the header shows a red (critical)
or amber (warning) marker while any fire. A usage failure (an older service without
``/usage`` answers 404) is one line in that tab, not an update error: the
telemetry tabs go on as before; an alerts failure likewise stays in the
Alerts tab. The thread keeps going while the kernel runs
another cell, since widget messages go out from any thread. A lock guards the
model and the figures (the tab-change handler draws too). Errors never raise
into the notebook: they show in the status line and the thread retries with
backoff.
``close()`` stops the thread and closes the widgets.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from datetime import UTC, datetime, timedelta

import ipywidgets as w

from .figures import TABS, TabFigure
from .model import ALERT_HOURS, USAGE_DAYS, TelemetryModel
from .show import widget_bundle
from .tables import (
    alerts_error,
    alerts_marker,
    alerts_tables,
    alerts_title,
    cache_tables,
    cluster_tables,
    jobs_tables,
    network_tables,
    status_line,
    usage_error,
    usage_tables,
)

MAX_BACKOFF_S = 30.0
USAGE_INTERVAL_S = 30.0
ALERTS_INTERVAL_S = 5.0
HEADER = (
    "<b>gpulab</b> cluster telemetry "
    "<span style='color:#666'>(updates about once a second; "
    "alerts every 5 s; GPU-hours every half minute)</span>"
)
#: The dashboard's ``text/plain``: what nbconvert, papermill and a terminal show of it.
TEXT = (
    "gpulab dashboard: live in JupyterLab while this kernel runs; "
    "run %gpulab dashboard to see it again"
)


class Dashboard(w.VBox):
    """Live cluster, dataset-cache, network and jobs telemetry, alerts, and GPU-hours used.

    ``Dashboard()`` in a server gpulab started needs no arguments. Elsewhere pass
    ``client=gpulab.client.Client(api_url, token=...)``. ``user`` is the name
    shown as "you" (default ``$JUPYTERHUB_USER``); ``max_age_s`` how much
    history to keep; ``usage_interval`` and ``alerts_interval`` the seconds between
    GPU-hours and alerts fetches; ``start=False`` leaves the updater off (call
    ``refresh()``, ``refresh_usage()``, ``refresh_alerts()``).
    """

    def __init__(
        self,
        client=None,
        interval: float = 1.0,
        max_age_s: float = 600.0,
        user: str | None = None,
        start: bool = True,
        usage_interval: float = USAGE_INTERVAL_S,
        alerts_interval: float = ALERTS_INTERVAL_S,
    ):
        self.interval = float(interval)
        self.usage_interval = float(usage_interval)
        self._usage_next = 0.0  # time.monotonic() of the next GPU-hours fetch
        self.alerts_interval = float(alerts_interval)
        self._alerts_next = 0.0  # time.monotonic() of the next alerts fetch
        self.user = user if user is not None else os.environ.get("JUPYTERHUB_USER")
        self.model = TelemetryModel(
            max_age_s=max_age_s, capacity=int(max_age_s / max(self.interval, 0.1)) + 60
        )
        self.error: str | None = None
        self._client = client
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.figures: dict[str, TabFigure] = {
            name: make() for name, (make, _) in TABS.items() if make is not None
        }
        self._status = {name: w.HTML(status_line(self.model, name, None)) for name in TABS}
        self._tables = {name: w.HTML() for name in TABS}
        pages = [
            w.VBox(
                [self._status[n], self.figures[n].view, self._tables[n]]
                if n in self.figures
                else [self._status[n], self._tables[n]]
            )
            for n in TABS
        ]
        self.tabs = w.Tab(children=pages, titles=list(TABS))
        self.tabs.observe(self._on_tab, names="selected_index")
        self.header = w.HTML(HEADER)
        super().__init__([self.header, self.tabs])
        self.add_class("gpulab-dashboard")
        self._thread = threading.Thread(target=self._run, name="gpulab-dashboard", daemon=True)
        if start:
            self._thread.start()

    def _repr_mimebundle_(self, **kwargs):
        """The widget's view, and one line (:data:`TEXT`) instead of its repr."""
        return widget_bundle(self, TEXT, super()._repr_mimebundle_(**kwargs))

    # -- polling ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _connect(self):
        if self._client is None:
            from gpulab.client import Client

            self._client = Client()
        return self._client

    def refresh(self) -> bool:
        """Fetch once and redraw; False (and the reason in the status line) on failure.

        GPU-hours and alerts are fetched too when ``usage_interval`` (``alerts_interval``)
        has passed since the last try; how that went shows in the Usage (Alerts) tab and
        never in the return value.
        """
        try:
            answer = self._connect().telemetry(self.model.cursor())
        except Exception as e:  # shown, not raised: a dashboard must not break a notebook
            with self._lock:
                self.error = f"{type(e).__name__}: {e}"
                self._draw_status()
            return False
        with self._lock:
            self.model.ingest(answer)
            self.error = None
            try:
                self._draw(self._selected())
            except Exception:
                self.error = "drawing failed: " + traceback.format_exc(limit=3)
                self._draw_status()
                return False
        if time.monotonic() >= self._alerts_next:
            self.refresh_alerts()
        if time.monotonic() >= self._usage_next:
            self.refresh_usage()
        return True

    def refresh_alerts(self) -> bool:
        """Fetch the last 24 h's alerts now; redraw the Alerts tab, its title and the header.

        False on failure, whose one line (not a traceback) the Alerts tab shows.
        """
        self._alerts_next = time.monotonic() + self.alerts_interval
        since = (datetime.now(UTC) - timedelta(hours=ALERT_HOURS)).isoformat()
        try:
            answer = self._connect().alerts(state="all", since=since)
        except Exception as e:  # shown in the tab: an older service has no /alerts
            with self._lock:
                self.model.alerts.fail(alerts_error(e))
                self._draw_alerts()
            return False
        with self._lock:
            self.model.alerts.ingest(answer, time.time())
            self._draw_alerts()
        return True

    def refresh_usage(self) -> bool:
        """Fetch the last 7 days' GPU-hours (by user, by kind) now and redraw the Usage tab.

        False on failure, whose one line (not a traceback) the Usage tab shows.
        """
        self._usage_next = time.monotonic() + self.usage_interval
        since = (datetime.now(UTC) - timedelta(days=USAGE_DAYS)).isoformat()
        try:
            client = self._connect()
            by_user = client.usage(since=since, group_by="user")
            by_kind = client.usage(since=since, group_by="kind")
        except Exception as e:  # shown in the tab: an older service has no /usage
            with self._lock:
                self.model.usage.fail(usage_error(e))
                self._draw_usage()
            return False
        with self._lock:
            self.model.usage.ingest(by_user, by_kind, time.time())
            self._draw_usage()
        return True

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            failures = 0 if self.refresh() else failures + 1
            wait = self.interval - (time.monotonic() - started)
            if failures:
                wait = min(MAX_BACKOFF_S, self.interval * 2 ** min(failures, 5))
            self._stop.wait(max(0.05, wait))

    def close(self) -> None:
        """Stop updating and close the widgets (idempotent)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:
            for fig in self.figures.values():
                fig.close()
            for part in (*self._status.values(), *self._tables.values(), self.header):
                part.close()
            self.tabs.close()
        super().close()

    # -- drawing (lock held) ---------------------------------------------------
    def _selected(self) -> str:
        index = self.tabs.selected_index or 0
        return list(TABS)[index]

    def _draw_status(self) -> None:
        for name, widget in self._status.items():
            html = status_line(self.model, name, self.error)
            if widget.value != html:
                widget.value = html

    def _draw_alerts(self) -> None:
        """The badge (tab title, header marker) always; the Alerts tab when it is shown."""
        try:
            title = alerts_title(self.model.alerts)
            index = list(TABS).index("Alerts")
            if self.tabs.get_title(index) != title:
                self.tabs.set_title(index, title)
            header = HEADER + alerts_marker(self.model.alerts)
            if self.header.value != header:
                self.header.value = header
            if self._selected() == "Alerts":
                self._draw("Alerts")
                return
        except Exception as e:  # never into the updater thread: it would stop
            self.model.alerts.fail(f"drawing the Alerts tab failed: {type(e).__name__}: {e}")
        self._draw_status()

    def _draw_usage(self) -> None:
        """The Usage tab's status line; the rest too when it is shown (else when it is)."""
        try:
            if self._selected() == "Usage":
                self._draw("Usage")
                return
        except Exception as e:  # never into the updater thread: it would stop
            self.model.usage.fail(f"drawing the Usage tab failed: {type(e).__name__}: {e}")
        self._draw_status()

    def _draw(self, tab: str) -> None:
        """Status of every tab; figure and tables of ``tab`` (hidden tabs redraw when shown)."""
        self._draw_status()
        if tab in self.figures:
            self.figures[tab].draw(TABS[tab][1](self.model))
        html = {
            "Cluster": lambda: cluster_tables(self.model, self.user),
            "Cache": lambda: cache_tables(self.model),
            "Network": lambda: network_tables(self.model),
            "Jobs": lambda: jobs_tables(self.model),
            "Alerts": lambda: alerts_tables(self.model.alerts, self.user),
            "Usage": lambda: usage_tables(self.model, self.user),
        }[tab]()
        if self._tables[tab].value != html:
            self._tables[tab].value = html

    def draw_all(self) -> None:
        """Redraw every tab now (tests and screenshots; the updater draws the shown one)."""
        with self._lock:
            for name in TABS:
                self._draw(name)

    def _on_tab(self, change) -> None:
        with self._lock:
            if self.model.answers:
                self._draw(self._selected())
