"""One tab's figure as the browser gets it (no browser: what the kernel holds and sends).

The browser side is tests/browser/test_dashboard.py; these pin the causes of what a
user saw there: a new series made a new widget and closed the old one while the
browser still wrote to it ("No such comm"), a page reload drew the figure the widget
was made with, and numpy arrays came back from the browser in a form plotly's widget
could not compare ("The truth value of an array ... is ambiguous" once per update)."""

import numpy as np
import plotly.graph_objects as go

from gpulab.widgets.figures import Note, Plot, TabFigure, Trace


def figure() -> TabFigure:
    return TabFigure(["used"], rows=1, cols=1, height=200, time_cells=[(1, 1)], y_titles={})


def line(key: str, y) -> Trace:
    return Trace(key, 1, 1, np.arange(len(y), dtype=float), np.asarray(y, dtype=float), key, "#000")


def test_a_new_series_before_the_browser_drew_the_graph_makes_a_new_widget():
    # plotly's widget module loads slowly: an add_traces sent before the browser holds
    # the model is lost, and the graph stayed empty (only restyles followed). Until the
    # browser says it drew a view, a new series comes in a new widget's first message.
    f = figure()
    f.draw(Plot(traces=[line("gpu 0", [1.0, 2.0])]))
    first = f.widget
    assert not first.drawn
    f.draw(Plot(traces=[line("gpu 0", [1.0, 2.0, 3.0]), line("gpu 1", [4.0])]))
    assert f.widget is not first and first.comm is None  # the old one closed
    assert f.view.children == (f.widget,)
    state = f.widget.get_state()
    assert [t.get("name") for t in state["_widget_data"]][-2:] == ["gpu 0", "gpu 1"]
    f.close()


def test_a_new_series_keeps_the_widget_and_its_state_holds_every_trace():
    f = figure()
    f.draw(Plot(traces=[line("gpu 0", [1.0, 2.0])]))
    widget = f.widget
    widget._view_count = 1  # what the browser sends once it has drawn a view
    assert widget.drawn
    f.draw(Plot(traces=[line("gpu 0", [1.0, 2.0, 3.0]), line("gpu 1", [4.0])]))
    assert f.widget is widget and widget.comm is not None  # the same widget, still open
    assert [t.name for t in widget.data][-2:] == ["gpu 0", "gpu 1"]
    # A view opened now (a reloaded page) starts from the same traces.
    state = widget.get_state()
    assert [t.get("name") for t in state["_widget_data"]] == [t.name for t in widget.data]
    f.draw(Plot(traces=[line("gpu 0", [1.0])], notes=[Note(1, 1, "why")]))
    assert f.widget is widget
    annotations = widget.get_state("_widget_layout")["_widget_layout"]["annotations"]
    assert [a["text"] for a in annotations][-1] == "why"
    f.close()


def test_a_view_opened_later_is_drawn_with_every_point_drawn_since():
    # A page reloaded minutes after the dashboard opened: its new view is drawn from the
    # widget's state, which must hold the points of every tick since (the last CI run's
    # reloaded page showed the figure as it was when its series last changed).
    f = figure()
    f.draw(Plot(traces=[line("gpu 0", [1.0])]))
    for n in range(2, 6):  # four ticks, same series: edits, not a rebuild
        f.draw(Plot(traces=[line("gpu 0", [float(i) for i in range(n)])]))
    data = f.widget.get_state()["_widget_data"]
    assert data[-1]["y"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert data[-1]["x"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    f.close()


def test_a_new_widget_brings_its_first_traces_in_its_opening_state(monkeypatch):
    # An add-traces message that reaches the browser before plotly's widget module has
    # loaded is lost (a plot with no points for good, seen on a busy CI machine).
    sent = []
    monkeypatch.setattr(go.FigureWidget, "_send_addTraces_msg", lambda _, data: sent.append(data))
    f = figure()
    f.draw(Plot(traces=[line("gpu 0", [1.0, 2.0])]))
    assert sent == []
    assert [t.get("name") for t in f.widget._widget_data][-1] == "gpu 0"
    assert f.widget._widget_data[-1]["y"] == [1.0, 2.0]
    f.close()


def test_arrays_reach_plotly_as_lists_with_gaps_as_none():
    f = figure()
    f.draw(Plot(traces=[line("gpu 0", [1.0, float("nan"), 3.0])]))
    f.draw(Plot(traces=[line("gpu 0", [1.0, float("nan"), 3.0, 4.0])]))  # an update
    shown = f.widget.data[-1]
    assert isinstance(shown.y, tuple | list) and list(shown.y) == [1.0, None, 3.0, 4.0]
    assert list(shown.x) == [0.0, 1.0, 2.0, 3.0]
    f.close()


def test_a_figure_hidden_from_the_start_never_opens_a_widget():
    f = figure()
    f.draw(Plot(hidden=True))
    assert f.widget is None and f.view.children == ()
    f.close()
