"""``%deploy --list`` kept current while it is on screen, and "did you mean" for names.

The table is one display output with a ``display_id``; a daemon thread asks the
service again every ``REFRESH_S`` seconds and replaces the output in place (the
kernel may be idle or running another cell: display updates go out from any
thread). It stops after ``WATCH_S`` seconds, or when ``%deploy --list`` runs again;
the last table stays in the output, so a saved notebook holds it as text.
"""

from __future__ import annotations

import difflib
import threading
import time
from collections.abc import Callable

#: Seconds between refreshes of a shown list.
REFRESH_S = 5.0
#: How long a shown list keeps refreshing (then it stays as the last table).
WATCH_S = 600.0


class _Text:
    """A display whose only form is plain text (what JupyterLab shows in monospace)."""

    def __init__(self, text: str):
        self.text = text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.text}


class LiveTable:
    """``table()`` shown now and again every ``every`` seconds for ``watch`` seconds.

    ``table`` returns the text to show (it may raise: the last table stays, with one
    line saying the refresh failed). Only one is live per kernel: a new one stops the
    one before it, whose output keeps its last table.
    """

    current: LiveTable | None = None
    _lock = threading.Lock()

    def __init__(self, table: Callable[[], str], every: float = REFRESH_S, watch: float = WATCH_S):
        self.table = table
        self.every = float(every)
        self.watch = float(watch)
        self.stopped = threading.Event()
        self.refreshes = 0
        self._handle = None
        self._last = ""
        self._thread = threading.Thread(target=self._run, name="gpulab-deploy-list", daemon=True)

    def show(self) -> None:
        from IPython.display import display

        self._last = self.table()
        with LiveTable._lock:
            if LiveTable.current is not None:
                LiveTable.current.stop()
            LiveTable.current = self
        self._handle = display(_Text(self._with_footer(live=True)), display_id=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _with_footer(self, live: bool, problem: str = "") -> str:
        clock = time.strftime("%H:%M:%S")
        if live:
            until = time.strftime("%H:%M", time.localtime(time.time() + self.watch))
            note = f"(updated {clock}; refreshes every {self.every:g} s until {until})"
        else:
            note = f"(as of {clock}; no longer refreshing: run %deploy --list again)"
        return f"{self._last}\n{note}" + (f"\n{problem}" if problem else "")

    def _run(self) -> None:
        deadline = time.monotonic() + self.watch
        while not self.stopped.wait(self.every) and time.monotonic() < deadline:
            problem = ""
            try:
                self._last = self.table()
            except Exception as e:  # shown under the last table; the next refresh retries
                problem = f"refresh failed ({type(e).__name__}: {e}); retrying"
            self.refreshes += 1
            self._handle.update(_Text(self._with_footer(live=True, problem=problem)))
        self._handle.update(_Text(self._with_footer(live=False)))


def did_you_mean(what: str, name: str, known: list[str]) -> str:
    """``No deployment named 'sentimnt'. Did you mean 'sentiment'?`` (or which exist)."""
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    text = f"No {what} named {name!r}."
    if close:
        return f"{text} Did you mean {' or '.join(repr(c) for c in close)}?"
    if known:
        shown = ", ".join(sorted(known)[:10]) + (", ..." if len(known) > 10 else "")
        return f"{text} Yours: {shown}."
    return f"{text} You have none."
