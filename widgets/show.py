"""Widgets shown with a short text: one line where no widget can be drawn.

A displayed widget's output holds two forms: the widget view
(``application/vnd.jupyter.widget-view+json``, the model id JupyterLab draws) and
``text/plain``, which is what nbconvert (``--to markdown``, ``--to script``),
papermill's logs and a terminal show. ipywidgets puts the widget's repr there
(``Dashboard(children=(HTML(value=...``), plotly's ``FigureWidget`` nothing, so
IPython adds the figure's repr: its whole dict, a hundred lines and more. Every
widget gpulab displays goes through :func:`show` with one line saying what it is.
"""

from __future__ import annotations

#: The mime type of a widget's view (ipywidgets 8: ``DOMWidget._repr_mimebundle_``).
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_bundle(widget, text: str, shown: dict | None = None) -> dict:
    """The widget's view, as the widget itself gives it, with ``text`` as ``text/plain``.

    ``shown`` is the widget's own bundle where the caller has it (a widget class's
    ``_repr_mimebundle_`` built on its base's); else it is asked for, so a plotly
    ``FigureWidget`` stores its figure as its state as it does when displayed alone.
    """
    if shown is None:
        shown = widget._repr_mimebundle_() or {}
    view = shown.get(WIDGET_VIEW) or {
        "version_major": 2,
        "version_minor": 0,
        "model_id": widget.model_id,
    }
    return {WIDGET_VIEW: view, "text/plain": text}


def show(widget, text: str, display_id: str | None = None, update: bool = False):
    """Display ``widget`` (or, with ``update``, put it in place of the output
    ``display_id``), its ``text/plain`` being ``text``; the display's handle."""
    from IPython.display import display, update_display

    bundle = widget_bundle(widget, text)
    if update:
        return update_display(bundle, raw=True, display_id=display_id)
    return display(bundle, raw=True, display_id=display_id)
