"""The training figure of ``%%train_distributed``: loss, learning rate, samples/s,
and an elastic job's world size (a step line on the throughput panel's right axis).

One builder for both faces of the chart: the live ``FigureWidget`` while the job
runs and the static copy the cell keeps once it ends (a plotly mime bundle, which
JupyterLab draws again after a page reload, when the widget's state is gone).
"""

from __future__ import annotations

import json

#: (points key, subplot title, y axis label)
PANELS = (
    ("loss", "loss", "loss"),
    ("lr", "learning rate", "lr"),
    ("throughput", "throughput", "samples/s"),
)
WAITING = "waiting for the first metric"
#: The name of the placeholder annotations, so the first points can remove them.
WAITING_NAME = "gpulab-waiting"
CHECKPOINT = "checkpoint"
#: The world-size trace's name (ranks over steps; an elastic job's or one whose size changed).
WORLD = "world size"
_BARE = dict(showticklabels=False, showgrid=False, zeroline=False)
_SCALED = dict(showticklabels=True, showgrid=True, zeroline=True)


def shows_world(points: dict[str, list], elastic: bool = False) -> bool:
    """Draw the world size: for an elastic job, or when it changed (not to clutter
    the chart of a fixed job, whose size is the same throughout)."""
    sizes = {w for w in points.get("world_size", []) if w is not None}
    return elastic or len(sizes) > 1


def training_figure(widget: bool = False, world: bool = False):
    """Three empty panels with labeled axes and a "waiting" note in each.

    Traces: 0-2 the panels' lines, 3 the checkpoint markers on the loss panel, and
    with ``world`` 4 the world size (ranks) on the throughput panel's right axis.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=[title for _, title, _ in PANELS],
        horizontal_spacing=0.09,
        specs=[[{}, {}, {"secondary_y": world}]],
    )
    for col, (_, _, unit) in enumerate(PANELS, start=1):
        fig.add_scatter(x=[], y=[], mode="lines", row=1, col=col, showlegend=False, name=unit)
        fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_yaxes(title_text=unit, row=1, col=col)
        fig.add_annotation(
            text=WAITING,
            name=WAITING_NAME,
            showarrow=False,
            xref=f"x{col if col > 1 else ''} domain",
            yref=f"y{col if col > 1 else ''} domain",
            x=0.5,
            y=0.5,
            font=dict(color="#888"),
        )
    fig.add_scatter(
        x=[],
        y=[],
        mode="markers",
        row=1,
        col=1,
        name=CHECKPOINT,
        showlegend=False,
        marker=dict(symbol="diamond", size=9, color="#2a7"),
    )
    if world:
        fig.add_scatter(
            x=[],
            y=[],
            mode="lines",
            line=dict(shape="hv", dash="dot", color="#888"),
            row=1,
            col=3,
            secondary_y=True,
            name=WORLD,
            showlegend=False,
            hovertemplate="step %{x}: %{y} ranks<extra>world size</extra>",
        )
        fig.update_yaxes(title_text="ranks", rangemode="tozero", row=1, col=3, secondary_y=True)
    # No made-up scale (plotly's -1..6) before there is anything to scale.
    fig.update_xaxes(**_BARE)
    fig.update_yaxes(**_BARE)
    fig.update_layout(height=280, margin=dict(l=50, r=50 if world else 10, t=30, b=40))
    return go.FigureWidget(fig) if widget else fig


def fill(fig, points: dict[str, list], checkpoints: list[int]) -> None:
    """Put ``points`` (step, loss, lr, throughput, world_size) and the checkpoint
    steps on ``fig``."""
    steps = points.get("step", [])
    if not steps:
        return
    # A checkpoint "after step s" holds s steps; its marker sits on the loss line there.
    loss_at = {s + 1: v for s, v in zip(steps, points.get("loss", []), strict=False)}
    marks = [c for c in checkpoints if loss_at.get(c) is not None]
    notes = [a for a in fig.layout.annotations if a.name != WAITING_NAME]
    for trace, (key, _, _) in zip(fig.data, PANELS, strict=False):
        trace.x, trace.y = steps, points.get(key, [])
    fig.data[3].x, fig.data[3].y = [c - 1 for c in marks], [loss_at[c] for c in marks]
    fig.data[3].customdata = marks
    fig.data[3].hovertemplate = "checkpoint: %{customdata} steps done<extra></extra>"
    world = [t for t in fig.data if t.name == WORLD]
    for trace in world:
        trace.x, trace.y = steps, points.get("world_size", [])
    if len(notes) != len(fig.layout.annotations):
        fig.layout.annotations = notes
        fig.update_xaxes(**_SCALED)
        fig.update_yaxes(**_SCALED)
        for trace in world:  # its own scale, but the throughput panel's grid
            fig.layout[f"yaxis{trace.yaxis[1:]}"].showgrid = False


def static_bundle(
    points: dict[str, list], checkpoints: list[int], summary: str, elastic: bool = False
) -> dict:
    """The figure as a mime bundle that needs no kernel: plotly's own mime type,
    with ``summary`` as the plain-text fallback. The world size is drawn for an
    ``elastic`` job or when it changed (:func:`shows_world`)."""
    import plotly.io as pio

    fig = training_figure(world=shows_world(points, elastic))
    fill(fig, points, checkpoints)
    if not points.get("step"):
        fig.update_annotations(selector=dict(name=WAITING_NAME), text="no metrics were reported")
    figure = json.loads(pio.to_json(fig, validate=False))
    figure["config"] = {"displaylogo": False}
    return {"application/vnd.plotly.v1+json": figure, "text/plain": summary}
