"""How a running job looks in the notebook: widgets in a frontend, text elsewhere.

Both faces take the same calls from ``%%train_distributed``'s watch loop:
``status(job)``, ``metrics(records)``, ``checkpoints(steps)``, ``logs(lines)``,
and ``finish(job)`` once it has ended. An elastic job's resizes (``job["resizes"]``)
are told once each, in the words of the job's event log (:class:`ResizeLog`). The
failure itself (root cause, hint) is
the exception the magic raises (:mod:`.train_failure`), told once, not here.

Widgets keep no state in a saved notebook, so on ``finish`` each live part is
replaced (same ``display_id``) by a static copy: a summary with the final
metrics, the chart as plotly's mime bundle (JupyterLab draws it again after a
reload), and the logs folded in a ``<details>``. Until then each part's
``text/plain`` (what nbconvert, papermill and a terminal show) is one line saying
what it is (:data:`LIVE_TEXT`), not the widget's repr.
"""

from __future__ import annotations

import html
import os
import re
import time
import uuid
from collections import deque

from gpulab.client.units import plural

LOG_LINES_SHOWN = 200
#: Log lines the finished cell keeps (folded); the rest: ``Client().job_logs(id)``.
LOG_LINES_KEPT = 1000
#: An elastic job's resizes listed under the title (the newest; the chart has them all).
RESIZES_SHOWN = 5
_NODE = re.compile(r"^\[node\d+\] ")
#: Each live part's ``text/plain`` (nbconvert, papermill, a terminal) until the job
#: ends and ``finish`` puts a static copy in its place.
LIVE_TEXT = {
    "head": "job progress: live in JupyterLab while the job runs (its summary replaces it)",
    "fig": "training chart (loss, learning rate, samples/s): live in JupyterLab while the job runs",
    "log": "the ranks' logs: live in JupyterLab while the job runs (all: Client().job_logs(id))",
}
#: The start of torchrun's own report of a failed rank (its agent's log): the
#: traceback of ChildFailedError and the "Root Cause" box repeat the rank's error.
_TORCHRUN_DUMP = re.compile(
    r"failed \(exitcode: |Traceback \(most recent call last\)|ChildFailedError"
)


#: The job's event line for a finished resize ("[gpulab] grew to 2 nodes at step 120: ...").
_RESIZED = re.compile(
    r"^\[gpulab\] (?:grew to|shrank to|restarted on) (\d+) nodes? at step (\d+): "
)


def node_range(job: dict) -> str:
    """``1-4``: an elastic job's node range."""
    return f"{job['min_nodes']}-{job['max_nodes']}"


def resize_text(before: int | None, entry: dict) -> str:
    """One of ``job["resizes"]`` as the event log tells it: "grew to 2 nodes at step
    120: slices freed" (``before``: the size it had, None if not known)."""
    nodes = entry["nodes"]
    before = entry.get("from_nodes", before)  # the service says where it came from
    if before is None:
        verb = "resized to"
    elif nodes > before:
        verb = "grew to"
    elif nodes < before:
        verb = "shrank to"
    else:
        verb = "restarted on"
    return f"{verb} {plural(nodes, 'node')} at step {entry['step']}: {entry['reason']}"


def nodes_summary(job: dict) -> str | None:
    """An elastic job's "nodes" row for the finished cell: "1-2, resized 3 times";
    None for a fixed job."""
    if not job.get("elastic"):
        return None
    resized = len(job.get("resizes") or [])
    if resized:
        return f"{node_range(job)}, resized {plural(resized, 'time')}"
    return f"{node_range(job)}, {plural(job['nodes'], 'node')} throughout"


class ResizeLog:
    """An elastic job's resizes as lines, each once, from ``job["resizes"]`` (so that
    they are told even when log lines were cut).

    An entry says the size after; the size before is the one last seen running
    (or the entry before's), which says grew, shrank or restarted.
    """

    def __init__(self):
        self.lines: list[str] = []
        self.size: int | None = None

    def update(self, job: dict) -> list[str]:
        """The lines of the resizes not told yet."""
        entries = job.get("resizes") or []
        new = []
        for i in range(len(self.lines), len(entries)):
            if i == len(self.lines) and self.size is not None:
                before = self.size
            else:
                before = entries[i - 1]["nodes"] if i else None
            new.append(resize_text(before, entries[i]))
        self.lines += new
        if job.get("state") == "running" and job.get("nodes"):
            self.size = job["nodes"]
        return new


def restart_text(restarts: int, restarted_from: list | None) -> str:
    """``restarted 2 times, the last from the checkpoint at step 40``: where the ranks
    resumed, as they told the service (``None``: from step 0, there was no checkpoint)."""
    text = f"restarted {plural(restarts, 'time')}"
    if not restarted_from:  # a service that does not say: no claim about checkpoints
        return text
    last = restarted_from[-1]
    where = "from step 0 (no checkpoint)" if last is None else f"from the checkpoint at step {last}"
    return f"{text}, {'the last ' if restarts > 1 else ''}{where}"


def describe(job: dict) -> str:
    state = job["state"]
    text = f"job {job['id']} ({job['name']}): {state}"
    if job.get("elastic") and state == "running":
        text += f" on {job.get('nodes_running') or job['nodes']} of {node_range(job)} nodes"
    elif job.get("elastic") and state == "queued":
        text += f" for {node_range(job)} nodes"
    pool = job.get("pool")
    if state != "queued" and pool and pool not in ("local", "auto"):
        text += f" on pool {pool}"  # a site of several places: where it went
    if job.get("slurm_job_id"):
        text += f" (Slurm job {job['slurm_job_id']})"
    if state == "running" and (job.get("message") or "").startswith("starting on pool"):
        text += f": {job['message'].split(': ', 1)[1]}"  # why not the first pool
    if state == "queued":
        text += f", position {job.get('position')} in the queue"
        if job.get("message") and job["message"] != "queued":
            text += f" ({job['message']})"
    if state == "running" and job.get("preempting"):
        text += f" ({job['message']})"
    elif state == "running" and job.get("resizing") and job.get("message"):
        text += f"; {job['message']}"  # "shrinking to 1 node: saving a checkpoint..."
    if job.get("restarts"):
        text += f"; {restart_text(job['restarts'], job.get('restarted_from'))}"
    if job.get("preemptions"):
        text += f"; preempted {plural(job['preemptions'], 'time')}, resumed from its checkpoint"
    # A rank's error is told once, by the exception the magic raises.
    if state in ("failed", "cancelled") and job.get("message") and not job.get("error"):
        text += f": {job['message']}"
    return text


class TorchrunDumpFilter:
    """Drops each torchrun agent's failure dump from the streamed log lines.

    Once a ``[nodeN]`` line starts torchrun's report of a failed worker, the rest
    of that agent's lines are its ChildFailedError traceback and summary, which
    repeat the rank's own traceback (already streamed as ``[rN]``). They stay in
    the full logs (``Client().job_logs(id)``).
    """

    def __init__(self):
        self.dumping: set[str] = set()

    def __call__(self, lines: list[str]) -> list[str]:
        kept = []
        for line in lines:
            m = _NODE.match(line)
            if m and (m.group(0) in self.dumping or _TORCHRUN_DUMP.search(line)):
                self.dumping.add(m.group(0))
                continue
            kept.append(line)
        return kept


class Rates:
    """Turns report() records into points: step, loss, lr, samples/s, world size."""

    def __init__(self, world_size: int):
        #: The world size of records that do not say theirs (written before they did).
        self.world = world_size
        self.last_time = None
        self.last_world = None
        self.step = None
        self.total = None
        self.points: dict[str, list] = {
            "step": [],
            "loss": [],
            "lr": [],
            "throughput": [],
            "world_size": [],
        }
        self.checkpoints: list[int] = []

    def add(self, records: list[dict]) -> None:
        for r in records:
            step = r.get("step", len(self.points["step"]))
            # Each record's own: an elastic job's size changes between steps.
            world = r.get("world_size") or self.world
            rate = None
            if (
                self.last_time is not None
                and "samples" in r
                and r["time"] > self.last_time
                # Not across a resize or restart: that gap is the relaunch, not steps.
                and world == self.last_world
                and (self.step is None or step > self.step)
            ):
                rate = r["samples"] * world / (r["time"] - self.last_time)
            self.step, self.total = step, r.get("total_steps", self.total)
            self.last_time, self.last_world = r["time"], world
            self.points["step"].append(step)
            self.points["loss"].append(r.get("loss"))
            self.points["lr"].append(r.get("lr"))
            self.points["throughput"].append(rate)
            self.points["world_size"].append(world)

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

    def add_checkpoints(self, steps: list[int] | None) -> bool:
        """Remember checkpoint steps (the service shows the newest few); True if new."""
        new = sorted(set(steps or []) - set(self.checkpoints))
        self.checkpoints = sorted(self.checkpoints + new)
        return bool(new)

    def final(self) -> list[tuple[str, str]]:
        """(name, value) of the last reported metrics, for the finished cell's table."""
        if self.step is None:
            return []
        rows = [("steps", f"{self.step + 1}" + (f" / {self.total}" if self.total else ""))]
        for key, name, fmt in (
            ("loss", "final loss", "{:.4g}"),
            ("lr", "learning rate", "{:.3g}"),
            ("throughput", "samples/s", "{:.0f}"),
        ):
            vals = [v for v in self.points[key] if isinstance(v, (int, float))]
            if vals:
                value = sum(vals[-5:]) / len(vals[-5:]) if key == "throughput" else vals[-1]
                rows.append((name, fmt.format(value)))
        if self.checkpoints:
            rows.append(("checkpoints", ", ".join(str(c) for c in self.checkpoints[-8:])))
        return rows


_RANK = re.compile(r"^\[r\d+\] ")


class Startup:
    """What a running job does before its first metric, told from what the cell
    already reads (the job's state, the streamed log lines): a job whose ranks take
    25 s to start says so instead of a silent "waiting"."""

    def __init__(self, world_size: int, clock=time.monotonic):
        self.world = world_size
        self.clock = clock
        self.running_since: float | None = None
        self.agents = self.ranks = False

    def phase(self, job: dict, lines: list[str]) -> str:
        """The phase now, with seconds since the job started running; "" while it
        is queued (the status line says so) or once it has ended."""
        for line in lines:
            self.ranks = self.ranks or bool(_RANK.match(line))
            self.agents = self.agents or bool(_NODE.match(line))
        if job["state"] != "running":
            return ""
        if self.running_since is None:
            self.running_since = self.clock()
        if self.ranks:
            what = "the ranks run the cell; waiting for the first report()"
        elif self.agents:
            what = "torchrun started; the ranks import torch and join the process group"
        else:
            # An elastic job's size is the service's, set at its start.
            what = f"starting {plural(job.get('world_size') or self.world, 'rank')}"
        return f"{what} ({self.clock() - self.running_since:.0f} s)"


def elapsed(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"


class TextDisplay:
    """Plain text: status changes, a progress line now and then, every log line
    (but torchrun's failure dump), each resize once, and the final metrics."""

    def __init__(self, world_size: int, elastic: bool = False):
        self.rates = Rates(world_size)
        self.last_status = None
        self.last_tenth = -1
        self.drop_dump = TorchrunDumpFilter()
        self.startup = Startup(world_size)
        self.last_phase = ""
        self.resizes = ResizeLog()
        # (nodes, step) of resizes told by one source (the event log or the job's
        # entries) and not yet by the other, which then keeps quiet.
        self.told_by_log: list[tuple[int, int]] = []
        self.told_by_job: list[tuple[int, int]] = []

    def status(self, job: dict) -> None:
        new = self.resizes.update(job)
        entries = (job.get("resizes") or [])[len(self.resizes.lines) - len(new) :]
        for line, entry in zip(new, entries, strict=True):
            key = (entry["nodes"], entry["step"])
            if key in self.told_by_log:
                self.told_by_log.remove(key)
            else:
                self.told_by_job.append(key)
                print(f"[gpulab] {line}", flush=True)  # as the event log's line reads
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

    def checkpoints(self, steps: list[int] | None) -> None:
        self.rates.add_checkpoints(steps)

    def logs(self, lines: list[str]) -> None:
        for line in self.drop_dump(lines):
            m = _RESIZED.match(line)
            if m:
                key = (int(m.group(1)), int(m.group(2)))
                if key in self.told_by_job:
                    self.told_by_job.remove(key)
                    continue
                self.told_by_log.append(key)
            print(line, flush=True)

    def starting(self, job: dict, lines: list[str]) -> None:
        """A line when the start-up phase changes (not each second: it is a log)."""
        phase = self.startup.phase(job, lines) if self.rates.step is None else ""
        what = phase.rsplit(" (", 1)[0]
        if what and what != self.last_phase:
            print(phase, flush=True)
        self.last_phase = what or self.last_phase

    def finish(self, job: dict) -> None:
        if job["state"] == "succeeded" and self.rates.checkpoints:
            print(f"checkpoints after steps {', '.join(map(str, self.rates.checkpoints))}")


class WidgetDisplay:
    """Summary line with progress bar, live loss / lr / throughput chart, ranks' logs;
    each part replaced by a static copy when the job ends."""

    def __init__(self, world_size: int, elastic: bool = False):
        import ipywidgets as w

        from gpulab.widgets.show import show

        self.started = time.monotonic()
        self.elastic = elastic
        self.rates = Rates(world_size)
        self.startup = Startup(world_size)
        self.resizes = ResizeLog()
        self.ids = {
            part: f"gpulab-train-{part}-{uuid.uuid4().hex}" for part in ("head", "fig", "log")
        }
        self.title = w.HTML()
        self.resized = w.HTML()  # an elastic job's resizes, under the title
        self.bar = w.IntProgress(
            value=0, min=0, max=1, description="steps", layout=w.Layout(width="60%")
        )
        self.numbers = w.HTML()
        self.log = w.HTML(layout=w.Layout(max_height="300px", overflow="auto"))
        self.lines: deque[str] = deque(maxlen=LOG_LINES_SHOWN)
        self.kept: deque[str] = deque(maxlen=LOG_LINES_KEPT)
        self.seen_lines = 0
        self.fig = self._figure(elastic)
        self.head = w.VBox([self.title, self.resized, w.HBox([self.bar, self.numbers])])
        show(self.head, LIVE_TEXT["head"], display_id=self.ids["head"])
        if self.fig is not None:
            show(self.fig, LIVE_TEXT["fig"], display_id=self.ids["fig"])
        show(self.log, LIVE_TEXT["log"], display_id=self.ids["log"])

    @staticmethod
    def _figure(elastic: bool):
        try:
            from gpulab.widgets.training import training_figure

            return training_figure(widget=True, world=elastic)
        except Exception:  # plotly's widget needs anywidget; the rest still works
            return None

    def status(self, job: dict) -> None:
        self.title.value = f"<b>{html.escape(describe(job))}</b>"
        if self.resizes.update(job):
            self.resized.value = resizes_html(self.resizes.lines)

    def metrics(self, records: list[dict]) -> None:
        if not records:
            return
        self.rates.add(records)
        if self.rates.total:
            self.bar.max = self.rates.total
            self.bar.value = min(self.rates.step + 1, self.rates.total)
        self.numbers.value = html.escape(self.rates.summary())
        self._redraw()

    def checkpoints(self, steps: list[int] | None) -> None:
        if self.rates.add_checkpoints(steps):
            self._redraw()

    def _redraw(self) -> None:
        if self.fig is not None:
            from gpulab.widgets.training import fill

            with self.fig.batch_update():
                fill(self.fig, self.rates.points, self.rates.checkpoints)

    def starting(self, job: dict, lines: list[str]) -> None:
        """Beside the progress bar until the first metric: what the job does now."""
        if self.rates.step is None:
            self.numbers.value = html.escape(self.startup.phase(job, lines))

    def logs(self, lines: list[str]) -> None:
        if lines:
            self.seen_lines += len(lines)
            self.lines.extend(lines)
            self.kept.extend(lines)
            self.log.value = "<pre>" + html.escape("\n".join(self.lines)) + "</pre>"

    def finish(self, job: dict) -> None:
        """Replace the live parts by what a saved notebook can show again."""
        from IPython.display import update_display

        summary = f"{describe(job)} after {elapsed(self.started)}"
        self.resizes.update(job)
        nodes = nodes_summary(job)
        rows = ([("nodes", nodes)] if nodes else []) + self.rates.final()
        table = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in rows
        )
        head = f"<div class='gpulab-train-summary'><b>{html.escape(summary)}</b>"
        if table:
            head += f"<table class='gpulab-train-final'>{table}</table>"
        head += resizes_html(self.resizes.lines)
        plain = summary + "".join(f"\n{k}: {v}" for k, v in rows)
        update_display(
            {"text/html": head + "</div>", "text/plain": plain},
            raw=True,
            display_id=self.ids["head"],
        )
        if self.fig is not None:
            if self.rates.points["step"]:
                from gpulab.widgets.training import static_bundle

                bundle = static_bundle(
                    self.rates.points,
                    self.rates.checkpoints,
                    plain,
                    elastic=self.elastic or bool(job.get("elastic")),
                )
            else:  # nothing to draw: no empty chart in the saved notebook
                bundle = {"text/plain": ""}
            update_display(bundle, raw=True, display_id=self.ids["fig"])
        shown = len(self.kept)
        more = (
            f" (the last {shown} of {self.seen_lines}; all: Client().job_logs({job['id']!r}))"
            if self.seen_lines > shown
            else ""
        )
        logs = (
            f"<details class='gpulab-train-logs'><summary>logs: {shown} lines{html.escape(more)}"
            f"</summary><pre>{html.escape(chr(10).join(self.kept))}</pre></details>"
        )
        update_display(
            {
                "text/html": logs,
                "text/plain": f"logs: {shown} lines (Client().job_logs({job['id']!r}))",
            },
            raw=True,
            display_id=self.ids["log"],
        )


def resizes_html(lines: list[str], shown: int = RESIZES_SHOWN) -> str:
    """An elastic job's resizes, newest last (the last ``shown``), for under the title."""
    if not lines:
        return ""
    earlier = len(lines) - shown
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines[-shown:])
    more = f"<li>... and {earlier} earlier</li>" if earlier > 0 else ""
    return f"<ul class='gpulab-train-resizes' style='margin:2px 0'>{more}{items}</ul>"


def make_display(world_size: int, elastic: bool = False):
    """Widgets when a frontend can show them; text otherwise (or with GPULAB_DISPLAY=text).
    An ``elastic`` job's chart draws its world size from the start."""
    if os.environ.get("GPULAB_DISPLAY", "auto") != "text":
        try:
            from IPython import get_ipython

            shell = get_ipython()
            if shell is not None and getattr(shell, "kernel", None) is not None:
                return WidgetDisplay(world_size, elastic)
        except Exception:
            pass
    return TextDisplay(world_size, elastic)
