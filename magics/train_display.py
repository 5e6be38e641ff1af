"""How a running job looks in the notebook: widgets in a frontend, text elsewhere.

Both faces take the same calls from ``%%train_distributed``'s watch loop:
``status(job)``, ``metrics(records)``, ``logs(lines)``, ``error(text)``.
A failed rank's error goes above the logs, so the cause is the first thing read.
"""

from __future__ import annotations

import html
import os
from collections import deque

LOG_LINES_SHOWN = 200


def describe(job: dict) -> str:
    state = job["state"]
    text = f"job {job['id']} ({job['name']}): {state}"
    if state == "queued":
        text += f", position {job.get('position')} in the queue"
        if job.get("message") and job["message"] != "queued":
            text += f" ({job['message']})"
    if state == "running" and job.get("preempting"):
        text += f" ({job['message']})"
    if job.get("restarts"):
        text += f"; restarted {job['restarts']} time(s) from the last checkpoint"
    if job.get("preemptions"):
        text += f"; preempted {job['preemptions']} time(s), resumed from its checkpoint"
    if state in ("failed", "cancelled") and job.get("message"):
        text += f": {job['message']}"
    return text


class _Rates:
    """Turns report() records into points: step, loss, lr, samples/s."""

    def __init__(self, world_size: int):
        self.world = world_size
        self.last_time = None
        self.step = None
        self.total = None
        self.points: dict[str, list] = {"step": [], "loss": [], "lr": [], "throughput": []}

    def add(self, records: list[dict]) -> None:
        for r in records:
            step = r.get("step", len(self.points["step"]))
            self.step, self.total = step, r.get("total_steps", self.total)
            rate = None
            if self.last_time is not None and "samples" in r and r["time"] > self.last_time:
                rate = r["samples"] * self.world / (r["time"] - self.last_time)
            self.last_time = r["time"]
            self.points["step"].append(step)
            self.points["loss"].append(r.get("loss"))
            self.points["lr"].append(r.get("lr"))
            self.points["throughput"].append(rate)

    def summary(self) -> str:
        if self.step is None:
            return ""
        parts = [f"step {self.step + 1}" + (f"/{self.total}" if self.total else "")]
        for key, fmt in (
            ("loss", "loss {:.4g}"),
            ("lr", "lr {:.3g}"),
            ("throughput", "{:.0f} samples/s"),
        ):
            vals = [v for v in self.points[key][-5:] if isinstance(v, (int, float))]
            if vals:
                parts.append(fmt.format(sum(vals) / len(vals) if key == "throughput" else vals[-1]))
        return ", ".join(parts)


class TextDisplay:
    """Plain text: status changes, a progress line now and then, every log line."""

    def __init__(self, world_size: int):
        self.rates = _Rates(world_size)
        self.last_status = None
        self.last_tenth = -1

    def status(self, job: dict) -> None:
        text = describe(job)
        if text != self.last_status:
            print(text, flush=True)
            self.last_status = text

    def metrics(self, records: list[dict]) -> None:
        self.rates.add(records)
        if records and self.rates.total:
            tenth = int(10 * (self.rates.step + 1) / self.rates.total)
            if tenth != self.last_tenth:
                self.last_tenth = tenth
                print(self.rates.summary(), flush=True)

    def logs(self, lines: list[str]) -> None:
        for line in lines:
            print(line, flush=True)

    def error(self, text: str) -> None:
        print(text, flush=True)

    def close(self) -> None:
        pass


class WidgetDisplay:
    """Progress bar, live loss / lr / throughput plot, error box, ranks' logs."""

    def __init__(self, world_size: int):
        import ipywidgets as w
        from IPython.display import display

        self.rates = _Rates(world_size)
        self.title = w.HTML()
        self.bar = w.IntProgress(
            value=0, min=0, max=1, description="steps", layout=w.Layout(width="60%")
        )
        self.numbers = w.HTML()
        self.err = w.HTML()
        self.log = w.HTML(layout=w.Layout(max_height="300px", overflow="auto"))
        self.lines: deque[str] = deque(maxlen=LOG_LINES_SHOWN)
        self.fig = self._figure()
        parts = [self.title, w.HBox([self.bar, self.numbers])]
        if self.fig is not None:
            parts.append(self.fig)
        self.box = w.VBox(parts + [self.err, self.log])
        display(self.box)

    @staticmethod
    def _figure():
        try:
            import plotly.graph_objects as go
            from plotly.subplots import make_subplots

            fig = go.FigureWidget(
                make_subplots(rows=1, cols=3, subplot_titles=("loss", "lr", "samples/s"))
            )
            for col in (1, 2, 3):
                fig.add_scatter(x=[], y=[], mode="lines", row=1, col=col, showlegend=False)
            fig.update_layout(height=250, margin=dict(l=30, r=10, t=30, b=20))
            return fig
        except Exception:  # plotly's widget needs anywidget; the rest still works
            return None

    def status(self, job: dict) -> None:
        self.title.value = f"<b>{html.escape(describe(job))}</b>"

    def metrics(self, records: list[dict]) -> None:
        if not records:
            return
        self.rates.add(records)
        if self.rates.total:
            self.bar.max = self.rates.total
            self.bar.value = min(self.rates.step + 1, self.rates.total)
        self.numbers.value = html.escape(self.rates.summary())
        if self.fig is not None:
            p = self.rates.points
            with self.fig.batch_update():
                for trace, key in zip(self.fig.data, ("loss", "lr", "throughput"), strict=False):
                    trace.x, trace.y = p["step"], p[key]

    def logs(self, lines: list[str]) -> None:
        if lines:
            self.lines.extend(lines)
            self.log.value = "<pre>" + html.escape("\n".join(self.lines)) + "</pre>"

    def error(self, text: str) -> None:
        self.err.value = f"<pre style='color:#b00'>{html.escape(text)}</pre>"

    def close(self) -> None:
        pass


def make_display(world_size: int):
    """Widgets when a frontend can show them; text otherwise (or with GPULAB_DISPLAY=text)."""
    if os.environ.get("GPULAB_DISPLAY", "auto") != "text":
        try:
            from IPython import get_ipython

            shell = get_ipython()
            if shell is not None and getattr(shell, "kernel", None) is not None:
                return WidgetDisplay(world_size)
        except Exception:
            pass
    return TextDisplay(world_size)
