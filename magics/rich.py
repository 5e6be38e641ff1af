"""Listings shown in two forms: an HTML table in JupyterLab, plain text everywhere else.

A listing is one display output holding both. JupyterLab draws ``text/html``;
terminals, nbconvert and papermill show ``text/plain``, the very lines the magic
printed before it had HTML (``GPULAB_DISPLAY=text`` prints only those). The table
is styled like ``%deploy --list``'s (:mod:`.deploy_list`) and everything that comes
from the environment or the service is escaped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from html import escape

#: A cell's style (the one of ``%deploy --list``'s table, aligned left and on top).
CELL = "border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top"
#: The colour of what is said in passing (notes, hints), as in ``%deploy --list``.
MUTED = "#57606a"
#: The colour of a value that says something went wrong.
ERROR = "#cf222e"
_WARNING = "background:#fff8c5;color:#7d4e00;font-weight:600"


@dataclass(frozen=True)
class Row:
    """One line of a listing: its plain text and, in the table, a label and a value (HTML).

    A warning has no label: it spans the table, marked as a warning.
    """

    text: str
    label: str = ""
    html: str = ""
    warning: bool = False

    @classmethod
    def of(cls, label: str, value: str, html: str | None = None) -> Row:
        """``Label: value`` as text; beside the label ``html``, else ``value`` escaped."""
        return cls(f"{label}: {value}", label, escape(value) if html is None else html)

    @classmethod
    def warn(cls, text: str) -> Row:
        return cls(text, warning=True)


def muted(text: str) -> str:
    """``text`` escaped, in the colour of notes."""
    return f'<span style="color:{MUTED}">{escape(text)}</span>'


def failed(text: str) -> str:
    """``text`` escaped, in the colour of errors."""
    return f'<span style="color:{ERROR}">{escape(text)}</span>'


def rows_html(rows: list[Row], css_class: str) -> str:
    """A two-column table (label, value), the warnings under it across both columns.

    A space separates label and value, so the table's text reads as the plain text
    does (``GPU: 1/4 GPU on ...``) when copied or searched.
    """
    cells = [
        f'<tr><th style="{CELL};white-space:nowrap">{escape(r.label)}:</th> '
        f'<td style="{CELL}">{r.html}</td></tr>'
        for r in rows
        if not r.warning
    ]
    cells += [
        f'<tr class="gpulab-warning"><td colspan="2" style="{CELL};{_WARNING}">'
        f"&#9888; {escape(r.text)}</td></tr>"
        for r in rows
        if r.warning
    ]
    return (
        f'<table class="{escape(css_class)}" style="border-collapse:collapse;font-size:12px">'
        f"{''.join(cells)}</table>"
    )


def rows_bundle(rows: list[Row], css_class: str) -> dict[str, str]:
    """The display's forms: the table for the lab, the lines for everything else."""
    return {"text/plain": "\n".join(r.text for r in rows), "text/html": rows_html(rows, css_class)}


def show_listing(bundle: dict[str, str]) -> None:
    """Display a listing's forms as one output (with ``GPULAB_DISPLAY=text``: print its text)."""
    if os.environ.get("GPULAB_DISPLAY", "auto") == "text":
        print(bundle["text/plain"])
        return
    from IPython.display import display

    display(bundle, raw=True)
