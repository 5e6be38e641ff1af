"""``Dashboard``: one live panel (ipywidgets) with Cluster, Cache, Network and Jobs tabs.

One daemon thread polls ``GET /telemetry`` through ``gpulab.client`` about once a
second and redraws; it keeps going while the kernel runs another cell, since
widget messages go out from any thread. A lock guards the model and the
figures (the tab-change handler draws too). Errors never raise into the
notebook: they show in the status line and the thread retries with backoff.
``close()`` stops the thread and closes the widgets.
"""

from __future__ import annotations

import os
import threading
import time
import traceback

import ipywidgets as w

from .figures import TABS, TabFigure
from .model import TelemetryModel
from .tables import cache_tables, cluster_tables, jobs_tables, network_tables, status_line

MAX_BACKOFF_S = 30.0


class Dashboard(w.VBox):
    """Live cluster, dataset-cache, network and jobs telemetry.

    ``Dashboard()`` in a server gpulab started needs no arguments. Elsewhere pass
    ``client=gpulab.client.Client(api_url, token=...)``. ``user`` is the name
    shown as "you" (default ``$JUPYTERHUB_USER``); ``max_age_s`` how much
    history to keep; ``start=False`` leaves the updater off (call ``refresh()``).
    """

    def __init__(
        self,
        client=None,
        interval: float = 1.0,
        max_age_s: float = 600.0,
        user: str | None = None,
        start: bool = True,
    ):
        self.interval = float(interval)
        self.user = user if user is not None else os.environ.get("JUPYTERHUB_USER")
        self.model = TelemetryModel(
            max_age_s=max_age_s, capacity=int(max_age_s / max(self.interval, 0.1)) + 60
        )
        self.error: str | None = None
        self._client = client
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.figures: dict[str, TabFigure] = {name: make() for name, (make, _) in TABS.items()}
        self._status = {name: w.HTML(status_line(self.model, name, None)) for name in TABS}
        self._tables = {name: w.HTML() for name in TABS}
        pages = [w.VBox([self._status[n], self.figures[n].view, self._tables[n]]) for n in TABS]
        self.tabs = w.Tab(children=pages, titles=list(TABS))
        self.tabs.observe(self._on_tab, names="selected_index")
        header = w.HTML(
            "<b>gpulab</b> cluster telemetry "
            "<span style='color:#666'>(updates about once a second)</span>"
        )
        super().__init__([header, self.tabs])
        self.add_class("gpulab-dashboard")
        self._thread = threading.Thread(target=self._run, name="gpulab-dashboard", daemon=True)
        if start:
            self._thread.start()

    # -- polling ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def refresh(self) -> bool:
        """Fetch once and redraw; False (and the reason in the status line) on failure."""
        try:
            if self._client is None:
                from gpulab.client import Client

                self._client = Client()
            answer = self._client.telemetry(self.model.cursor())
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
            for part in (*self._status.values(), *self._tables.values()):
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

    def _draw(self, tab: str) -> None:
        """Status of every tab; figure and tables of ``tab`` (hidden tabs redraw when shown)."""
        self._draw_status()
        self.figures[tab].draw(TABS[tab][1](self.model))
        html = {
            "Cluster": lambda: cluster_tables(self.model, self.user),
            "Cache": lambda: cache_tables(self.model),
            "Network": lambda: network_tables(self.model),
            "Jobs": lambda: jobs_tables(self.model),
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
