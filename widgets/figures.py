"""One plotly ``FigureWidget`` per tab, with subplots, redrawn from a ``TelemetryModel``
(the Cluster tab has two, ``Panels``: GPU telemetry, which a machine without it hides,
and the slices).

Each tab's ``*_plot(model)`` says what should be drawn: a list of ``Trace``
(numpy x/y per subplot) and ``Note``s (text written inside a subplot, e.g. why
it is empty), or ``hidden`` (nothing at all to draw: the tab's notice says why, once).
``TabFigure.draw`` makes the widget match: it replaces the widget's traces and
layout only when the set of series or notes changed (a GPU or job appeared) and
otherwise assigns the arrays inside one ``batch_update``, so the browser gets one
message per tab per tick. One widget per figure for its whole life.
"""

from __future__ import annotations

import html
import threading
from copy import deepcopy
from dataclasses import dataclass, field

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from gpulab.client.units import MILLI_PER_GPU

from .model import CACHE_COLUMNS, GPU_COLUMNS, JOB_COLUMNS, USAGE_DAYS, TelemetryModel

PALETTE = qualitative.Plotly
GIB = 2.0**30


@dataclass
class Trace:
    key: str
    row: int
    col: int
    x: object
    y: object
    group: str
    color: str
    dash: str = "solid"
    kind: str = "lines"  # "lines", "lines+markers", "bar" or "hbar" (x: values, y: labels)
    legend: bool = True


@dataclass
class Note:
    row: int
    col: int
    text: str


@dataclass
class Plot:
    """What one figure shows; ``hidden``: nothing to draw at all, so no figure is shown
    (the tab's status line says why, once, instead of a note in every subplot)."""

    traces: list[Trace] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    hidden: bool = False


def plain(a) -> list:
    """``a`` as a list (None for NaN, plotly's gap) for a FigureWidget's trace.

    plotly sends a float numpy array to the browser as a typed array, and the
    browser's answer (its trace defaults, after every redraw) names that property
    again as a dict; the kernel's FigureWidget then compares that dict with the array
    it holds and raises "The truth value of an array ... is ambiguous" once per
    update, leaving its edit unfinished. A list comes back as a list.
    """
    values = np.asarray(a, dtype=object)
    return [None if isinstance(v, float) and v != v else v for v in values.tolist()]


def ago(m: TelemetryModel, t) -> np.ndarray:
    """Unix seconds -> seconds before the newest answer (0 = now, -600 = ten minutes ago).

    Not a date axis: plotly.js resets an axis to its guessed type whenever a
    trace's x is restyled, and numbers would turn a date axis linear; relative
    seconds stay numeric typed arrays, the cheapest thing to send every second.
    """
    return np.asarray(t, dtype=np.float64) - (m.now or 0.0)


def _color(colors: dict, group: str) -> str:
    return colors.setdefault(group, PALETTE[len(colors) % len(PALETTE)])


class LiveFigure(go.FigureWidget):
    """A ``FigureWidget`` whose new views (a page reloaded, the cell shown again) are
    drawn from the figure as it is now.

    plotly's widget state holds the figure it was made with; its later edits go to the
    views open at the time, as messages. A view made later drew that old figure and
    caught up only if a later edit changed every trace, so a reloaded dashboard could
    show minutes-old points. The state a new view asks for is made here, from the
    figure itself. ``edits`` is held by whoever edits the figure (the dashboard's
    updater thread) and by the kernel's thread that answers the request.
    """

    def __init__(self, *args, **kwargs):
        self._edits = threading.RLock()  # before the widget opens: opening sends the state
        super().__init__(*args, **kwargs)
        self._view_count = 0  # the browser counts the views it draws (ipywidgets)

    @property
    def edits(self) -> threading.RLock:
        return self._edits

    @property
    def drawn(self) -> bool:
        """Whether the browser has drawn a view of it (and so holds its model, which
        hears every later edit). Until then an edit can be lost: plotly's widget module
        loads slowly, and a message that comes before the model exists is dropped."""
        return bool(self._view_count)

    def get_state(self, key=None, drop_defaults=False):
        state = super().get_state(key, drop_defaults)
        if not hasattr(self, "_layout"):  # the widget opening, before plotly's own init
            return state
        with self.edits:
            for name, now in (("_widget_data", self._data), ("_widget_layout", self._layout)):
                if name in state:
                    to_json = self.trait_metadata(name, "to_json", self._trait_to_json)
                    state[name] = to_json(deepcopy(now), self)
        return state


class TabFigure:
    """A FigureWidget with a ``rows`` x ``cols`` grid of subplots; ``view`` is what to show.

    The first traces ride in the new widget's initial state: the browser loses an
    ``add_traces`` message that arrives before plotly's (large) widget module has
    loaded. A later set of series replaces the same widget's traces and layout
    and stores them as its state too, which a view drawn after that (a slow first
    load, a page reloaded) is made from. Every tick only assigns x/y arrays, which
    the next tick repeats, so a lost update heals itself.
    """

    def __init__(
        self,
        titles: list[str],
        rows: int,
        cols: int,
        height: int,
        time_cells: list[tuple[int, int]],
        y_titles: dict[tuple[int, int], str],
        value_x_titles: dict[tuple[int, int], str] | None = None,
        y_axes: dict[tuple[int, int], dict] | None = None,
        legend_y: float = -0.08,
    ):
        """``value_x_titles``: cells of horizontal bars, the title of their value (x)
        axis; their y axis holds labels and widens the margin to fit them. ``y_axes``:
        more y-axis settings per cell (ticks, range)."""
        base = make_subplots(
            rows=rows,
            cols=cols,
            subplot_titles=titles,
            vertical_spacing=0.3 / rows,
            horizontal_spacing=0.1,
        )
        base.update_annotations(font_size=13)  # the subplot titles
        base.update_layout(
            height=height,
            margin=dict(l=60, r=20, t=40, b=40),
            uirevision="gpulab",
            template="plotly_white",
            legend=dict(orientation="h", y=legend_y, font=dict(size=10)),
        )
        for r, c in time_cells:
            base.update_xaxes(title_text="seconds ago", title_standoff=4, row=r, col=c)
        for (r, c), title in y_titles.items():
            base.update_yaxes(title_text=title, row=r, col=c)
        for (r, c), title in (value_x_titles or {}).items():
            base.update_xaxes(title_text=title, title_standoff=4, rangemode="tozero", row=r, col=c)
            base.update_yaxes(automargin=True, row=r, col=c)
        for (r, c), settings in (y_axes or {}).items():
            base.update_yaxes(row=r, col=c, **settings)
        self._base = base
        self._titles = tuple(base.layout.annotations)
        self.cells = [(r, c) for r in range(1, rows + 1) for c in range(1, cols + 1)]
        self._keys: list[str] | None = None
        self._notes: list[Note] | None = None
        # Made at the first draw that shows something, then kept: the browser answers a
        # graph's drawing with messages to its widget, and one closed or replaced
        # meanwhile got them after its end ("No such comm" in the kernel's log).
        self.widget: LiveFigure | None = None
        self.view = w.VBox([])

    def draw(self, plot: Plot) -> None:
        if plot.hidden:
            # Out of the page and closed, not display:none (plotly lays out a hidden
            # graph at zero size), nor an open model no view shows (a page reload
            # restores every open model). Shown again, it is rebuilt.
            if self.widget is not None:
                self.view.children = ()
                self.widget.close()
                self.widget = None
                self._keys = self._notes = None
            return
        # plotly.js draws no axes for a subplot without traces: an empty trace per
        # cell keeps every subplot drawn (notes are placed on the page by domain).
        cells = [
            Trace(f"_cell {r},{c}", r, c, np.empty(0), np.empty(0), "", "#000", legend=False)
            for r, c in self.cells
        ]
        traces = cells + plot.traces
        keys = [t.key for t in traces]
        if keys != self._keys or plot.notes != self._notes:
            self._rebuild(traces, plot.notes)
            self._keys, self._notes = keys, plot.notes
            return
        with self.widget.edits, self.widget.batch_update():
            for t, shown in zip(traces, self.widget.data, strict=False):
                shown.x = plain(t.x)
                shown.y = plain(t.y)

    def _rebuild(self, traces: list[Trace], notes: list[Note]) -> None:
        """New series or notes: the same widget, its traces and layout replaced."""
        fig = go.Figure(self._base)
        fig.layout.annotations = self._titles + tuple(self._note(n) for n in notes)
        # A subplot that only carries a note shows no empty axes either.
        noted = {(n.row, n.col) for n in notes}
        for r, c in self.cells:
            fig.update_xaxes(visible=(r, c) not in noted, row=r, col=c)
            fig.update_yaxes(visible=(r, c) not in noted, row=r, col=c)
        new = [self._new_trace(t) for t in traces]
        rows, cols = [t.row for t in traces], [t.col for t in traces]
        if self.widget is None or not self.widget.drawn:
            # The traces ride in the widget's first message (its comm's open), which
            # the browser cannot miss. A widget not drawn yet is replaced, not edited:
            # an add_traces it missed would leave its graph empty for good (the ticks
            # after it only restyle the traces it has).
            fig.add_traces(new, rows=rows, cols=cols)
            old, self.widget = self.widget, LiveFigure(fig)
            self.view.children = (self.widget,)
            if old is not None:
                old.close()
            return
        with self.widget.edits:
            self.widget.data = ()
            self.widget.layout = fig.layout
            self.widget.add_traces(new, rows=rows, cols=cols)

    def close(self) -> None:
        if self.widget is not None:
            self.widget.close()
        self.view.close()

    @property
    def shown(self) -> bool:
        return self.widget is not None

    @staticmethod
    def _new_trace(t: Trace):
        if t.kind == "hbar":
            return go.Bar(
                name=t.key,
                x=plain(t.x),
                y=plain(t.y),
                orientation="h",
                legendgroup=t.group,
                showlegend=t.legend,
                marker_color=t.color,
                texttemplate="%{x:.2f}",
                textposition="auto",
                hovertemplate="%{y}: %{x:.2f} GPU-hours<extra></extra>",
            )
        if t.kind == "bar":
            return go.Bar(
                name=t.key,
                x=plain(t.x),
                y=plain(t.y),
                legendgroup=t.group,
                showlegend=t.legend,
                marker_color=t.color,
            )
        return go.Scatter(
            name=t.key,
            x=plain(t.x),
            y=plain(t.y),
            legendgroup=t.group,
            showlegend=t.legend,
            mode=t.kind,
            line=dict(color=t.color, dash=t.dash, width=1.5),
            connectgaps=False,
        )

    def _note(self, n: Note) -> dict:
        cell = self._base.get_subplot(n.row, n.col)
        x0, x1 = cell.xaxis.domain
        y0, y1 = cell.yaxis.domain
        return dict(
            text=n.text,
            xref="paper",
            yref="paper",
            x=(x0 + x1) / 2,
            y=(y0 + y1) / 2,
            xanchor="center",
            yanchor="middle",
            showarrow=False,
            font=dict(size=11, color="#8a2b06"),
            align="center",
            bgcolor="rgba(255,244,229,0.9)",
        )


class Panels:
    """Figures stacked in one tab, each drawn from its own ``Plot`` (and hidden alone):
    the Cluster tab's GPU telemetry goes away on a machine without it, its slices stay."""

    def __init__(self, parts: list[TabFigure]):
        self.parts = parts
        self.view = w.VBox([p.view for p in parts])

    def draw(self, plots: list[Plot]) -> None:
        for part, plot in zip(self.parts, plots, strict=True):
            part.draw(plot)

    def close(self) -> None:
        for part in self.parts:
            part.close()
        self.view.close()


# -- Cluster -------------------------------------------------------------------
#: Ticks of the "held" chart: the fractions slices come in.
HELD_TICKS = [0.0, 0.25, 0.5, 0.75, 1.0]
HELD_TEXT = ["0", "1/4", "1/2", "3/4", "1"]


def cluster_figure() -> Panels:
    gpus = TabFigure(
        [
            "GPU utilisation (%)",
            "GPU memory used / total (GiB)",
            "GPU temperature (°C)",
            "GPU power (W)",
        ],
        rows=2,
        cols=2,
        height=500,
        time_cells=[(1, 1), (1, 2), (2, 1), (2, 2)],
        y_titles={(1, 1): "%", (1, 2): "GiB", (2, 1): "°C", (2, 2): "W"},
    )
    slices = TabFigure(
        ["share of each GPU held", "free slice sizes now (count per node)"],
        rows=1,
        cols=2,
        height=340,
        legend_y=-0.3,  # below the x axis title of a one-row figure
        time_cells=[(1, 1)],
        y_titles={(1, 1): "GPU", (1, 2): "slices"},
        y_axes={(1, 1): dict(range=[0, 1.05], tickvals=HELD_TICKS, ticktext=HELD_TEXT)},
    )
    return Panels([gpus, slices])


def cluster_plot(m: TelemetryModel) -> list[Plot]:
    """[GPU telemetry, slices]: the first hidden when no node reports GPU telemetry."""
    return [gpu_plot(m), slices_plot(m)]


def gpu_plot(m: TelemetryModel) -> Plot:
    """Utilisation, memory, temperature, power per GPU; hidden without GPU telemetry (the
    Cluster tab's notice says why once, rather than an error in each of four charts)."""
    p, colors = Plot(), {}
    cells = {
        "utilization_ratio": (1, 1, 100.0),
        "memory_used_bytes": (1, 2, 1 / GIB),
        "temperature_celsius": (2, 1, 1.0),
        "power_watts": (2, 2, 1.0),
    }
    for (node, gpu), t, v in m.series(m.gpus):
        group = f"{node} {gpu}"
        color, x, first = _color(colors, group), ago(m, t), True
        for column, (r, c, scale) in cells.items():
            y = v[:, GPU_COLUMNS.index(column)] * scale
            p.traces.append(
                Trace(
                    group if first else f"{group} {column}", r, c, x, y, group, color, legend=first
                )
            )
            first = False
        total = v[:, GPU_COLUMNS.index("memory_total_bytes")] / GIB
        p.traces.append(Trace(f"{group} total", 1, 2, x, total, group, color, "dot", legend=False))
    p.hidden = not p.traces
    return p


def slices_plot(m: TelemetryModel) -> Plot:
    """The share of each GPU held (0..1, as fractions) and the slice sizes free per node."""
    p, colors = Plot(), {}
    for (node, gpu), t, v in m.series(m.allocated):
        group = f"{node} {gpu}"
        p.traces.append(
            Trace(
                f"{group} held",
                1,
                1,
                ago(m, t),
                v[:, 0] / MILLI_PER_GPU,
                group,
                _color(colors, group),
            )
        )
    for node, sizes in sorted(m.free_sizes.items()):
        p.traces.append(
            Trace(
                f"{node} free",
                1,
                2,
                [s.get("label") for s in sizes],
                np.array([float(s.get("count", 0)) for s in sizes]),
                f"{node} free",
                _color(colors, f"{node} free"),
                kind="bar",
            )
        )
    if not m.allocated:
        p.notes.append(Note(1, 1, "no GPUs in the inventory"))
    return p


# -- Cache ---------------------------------------------------------------------
def cache_figure() -> TabFigure:
    return TabFigure(
        [
            "hit ratio (%)",
            "from cache (solid) / remote (dash), GiB",
            "prefetched ahead (solid) and evictions (dash)",
            "used (solid) / capacity (dot), GiB",
        ],
        rows=2,
        cols=2,
        height=560,
        time_cells=[(1, 1), (1, 2), (2, 1), (2, 2)],
        y_titles={(1, 1): "%", (1, 2): "GiB", (2, 1): "count", (2, 2): "GiB"},
    )


def cache_plot(m: TelemetryModel) -> Plot:
    p, colors = Plot(), {}
    cells = [
        ("hit_ratio", 1, 1, 100.0, "solid"),
        ("bytes_from_cache", 1, 2, 1 / GIB, "solid"),
        ("bytes_from_remote", 1, 2, 1 / GIB, "dash"),
        ("prefetch_ahead", 2, 1, 1.0, "solid"),
        ("evictions", 2, 1, 1.0, "dash"),
        ("used", 2, 2, 1 / GIB, "solid"),
        ("capacity", 2, 2, 1 / GIB, "dot"),
    ]
    for node, t, v in m.series(m.cache):
        color, x = _color(colors, node), ago(m, t)
        for i, (column, r, c, scale, dash) in enumerate(cells):
            y = v[:, CACHE_COLUMNS.index(column)] * scale
            p.traces.append(
                Trace(
                    node if i == 0 else f"{node} {column}",
                    r,
                    c,
                    x,
                    y,
                    node,
                    color,
                    dash,
                    legend=i == 0,
                )
            )
    # No cache reports: no charts (the tab's notice says why, once).
    p.hidden = not m.cache
    return p


# -- Network -------------------------------------------------------------------
def network_figure() -> TabFigure:
    return TabFigure(
        [
            "NIC receive (solid) / transmit (dash), MB/s",
            "RDMA receive (solid) / transmit (dash), MB/s",
            "all-reduce bus bandwidth (solid) / algbw (dot), GB/s",
        ],
        rows=3,
        cols=1,
        height=720,
        time_cells=[(1, 1), (2, 1), (3, 1)],
        y_titles={(1, 1): "MB/s", (2, 1): "MB/s", (3, 1): "GB/s"},
    )


def network_plot(m: TelemetryModel) -> Plot:
    p, colors = Plot(), {}
    for row, table in ((1, m.nics), (2, m.rdma)):
        for (node, dev), t, v in m.series(table):
            group = f"{node} {dev}"
            color, x = _color(colors, group), ago(m, t)
            p.traces.append(Trace(group, row, 1, x, v[:, 0] / 1e6, group, color))
            p.traces.append(
                Trace(f"{group} tx", row, 1, x, v[:, 1] / 1e6, group, color, "dash", legend=False)
            )
    for row, source, what in ((1, "nic", "NIC"), (2, "rdma", "RDMA")):
        if not (m.nics if row == 1 else m.rdma):
            # The reason, in full, is in the status line above the charts.
            why = " (why: see above)" if m.missing_sources(source).get(source) else ""
            p.notes.append(Note(row, 1, f"no {what} telemetry{why}"))
    since = m.window_start()
    runs = [r for r in m.allreduce if since is None or float(r.get("ts", 0)) > since]
    if runs:
        x = ago(m, np.array([float(r.get("ts", np.nan)) for r in runs]))
        bus = np.array([float(r.get("busbw_bytes_per_second", np.nan)) for r in runs]) / 1e9
        alg = np.array([float(r.get("algbw_bytes_per_second", np.nan)) for r in runs]) / 1e9
        color = _color(colors, "all-reduce")
        p.traces.append(
            Trace("all-reduce busbw", 3, 1, x, bus, "all-reduce", color, kind="lines+markers")
        )
        p.traces.append(
            Trace(
                "all-reduce algbw",
                3,
                1,
                x,
                alg,
                "all-reduce",
                color,
                "dot",
                kind="lines+markers",
                legend=False,
            )
        )
    elif m.allreduce:
        p.notes.append(
            Note(
                3,
                1,
                f"no all-reduce in the last {m.max_age_s / 60:g} min "
                "(the table lists the latest); run %gpulab nettest",
            )
        )
    else:
        p.notes.append(Note(3, 1, "no all-reduce measured yet: run %gpulab nettest"))
    return p


# -- Jobs ----------------------------------------------------------------------
def jobs_figure() -> TabFigure:
    return TabFigure(
        ["loss", "throughput (samples/s)"],
        rows=1,
        cols=2,
        height=380,
        time_cells=[(1, 1), (1, 2)],
        y_titles={(1, 1): "loss", (1, 2): "samples/s"},
    )


def jobs_plot(m: TelemetryModel) -> Plot:
    p, colors = Plot(), {}
    running = {str(j.get("name") or j.get("id")) for j in m.jobs}
    for job, t, v in m.series(m.job_history):
        if job not in running:
            continue
        color, x = _color(colors, job), ago(m, t)
        p.traces.append(Trace(job, 1, 1, x, v[:, JOB_COLUMNS.index("loss")], job, color))
        p.traces.append(
            Trace(
                f"{job} samples/s",
                1,
                2,
                x,
                v[:, JOB_COLUMNS.index("samples_per_second")],
                job,
                color,
                legend=False,
            )
        )
    if not p.traces:
        for c in (1, 2):
            p.notes.append(
                Note(
                    1,
                    c,
                    "no jobs to show"
                    if not m.jobs
                    else "the jobs report no loss or throughput yet",
                )
            )
    return p


# -- Usage ---------------------------------------------------------------------
#: Users drawn as bars; the rest are one "N others" bar (the table lists everyone).
USAGE_CHART_USERS = 10


def usage_figure() -> TabFigure:
    period = f"last {USAGE_DAYS} days"
    return TabFigure(
        [f"GPU-hours by user, {period}", f"GPU-hours by kind, {period}"],
        rows=1,
        cols=2,
        height=380,
        time_cells=[],
        y_titles={},
        value_x_titles={(1, 1): "GPU-hours", (1, 2): "GPU-hours"},
    )


def usage_plot(m: TelemetryModel) -> Plot:
    """Horizontal bars, most GPU-hours on top; a note instead when there is nothing to draw."""
    p, u = Plot(), m.usage
    if u.error or u.fetched is None or u.empty:
        if u.error:
            text = html.escape(u.error)
        elif u.fetched is None:
            text = "GPU-hours not fetched yet"
        else:
            text = f"No GPU time used in the last {USAGE_DAYS} days"
        p.notes += [Note(1, 1, text), Note(1, 2, text)]
        return p
    users = [(r["name"], r["gpu_hours"]) for r in u.by_user[:USAGE_CHART_USERS]]
    rest = u.by_user[USAGE_CHART_USERS:]
    if rest:
        users.append((f"{len(rest)} others", sum(r["gpu_hours"] for r in rest)))
    kinds = [(r["name"], r["gpu_hours"]) for r in u.kinds()]
    for col, key, bars, color in (
        (1, "by user", users, PALETTE[0]),
        (2, "by kind", kinds, PALETTE[1]),
    ):
        bars = bars[::-1]  # plotly draws the first category at the bottom
        x = np.array([hours for _, hours in bars], dtype=np.float64)
        p.traces.append(
            Trace(
                f"GPU-hours {key}",
                1,
                col,
                x,
                [label for label, _ in bars],
                key,
                color,
                kind="hbar",
                legend=False,
            )
        )
    return p


#: The dashboard's tabs in order: (figure, plot) each; the Alerts tab has no figure
#: (None, None): it is a list (``tables.alerts_tables``).
TABS = {
    "Cluster": (cluster_figure, cluster_plot),
    "Cache": (cache_figure, cache_plot),
    "Network": (network_figure, network_plot),
    "Jobs": (jobs_figure, jobs_plot),
    "Alerts": (None, None),
    "Usage": (usage_figure, usage_plot),
}
