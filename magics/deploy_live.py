"""``%deploy --list`` kept current while it is the notebook's latest output, and
"did you mean" for names.

The table is one display output with a ``display_id``; a daemon thread asks the
service again every ``REFRESH_S`` seconds and replaces the output in place (display
updates go out from any thread). It stops after ``WATCH_S`` seconds, or as soon as
the kernel runs another cell: an older cell's output is a record of its moment, not
rewritten by what later cells did, but for ``%deploy --stop``, which marks the row
stopped in the latest table (:class:`DeploymentsTable`): a table must not say an
endpoint runs once it is stopped. The last table stays, so a saved notebook holds it
(HTML and text).
"""

from __future__ import annotations

import contextlib
import difflib
import threading
import time
from collections.abc import Callable
from html import escape

from .rich import MUTED

#: Seconds between refreshes of a shown list.
REFRESH_S = 5.0
#: How long a shown list keeps refreshing (then it stays as the last table).
WATCH_S = 600.0


class _Bundle:
    """A display given as its forms (``{"text/html": ..., "text/plain": ...}``)."""

    def __init__(self, data: dict[str, str]):
        self.data = data

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.data


class LiveTable:
    """``table()`` shown now and again every ``every`` seconds for ``watch`` seconds.

    ``table`` returns the forms to show, ``text/plain`` and optionally ``text/html``
    (it may raise: the last table stays, with one line saying the refresh failed).
    Only one is live per kernel, and only until the next cell runs: then its output
    keeps its last table.
    """

    current: LiveTable | None = None
    _lock = threading.Lock()

    def __init__(
        self, table: Callable[[], dict[str, str]], every: float = REFRESH_S, watch: float = WATCH_S
    ):
        self.table = table
        self.every = float(every)
        self.watch = float(watch)
        self.stopped = threading.Event()
        self.refreshes = 0
        self._handle = None
        self._last: dict[str, str] = {}
        self._at = ""  # when the last table was read
        self._shell = None
        self._thread = threading.Thread(target=self._run, name="gpulab-deploy-list", daemon=True)

    def show(self) -> None:
        from IPython.display import display

        self._last, self._at = self.table(), time.strftime("%H:%M:%S")
        with LiveTable._lock:
            if LiveTable.current is not None:
                LiveTable.current.stop()
            LiveTable.current = self
        self._handle = display(_Bundle(self._with_footer(live=True)), display_id=True)
        self._shell = _shell()
        if self._shell is not None:
            self._shell.events.register("pre_run_cell", self._next_cell)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _next_cell(self, info=None) -> None:
        """The kernel runs another cell: this output is no longer the latest."""
        self.stop()
        with contextlib.suppress(ValueError):  # unregistered already
            self._shell.events.unregister("pre_run_cell", self._next_cell)

    def _with_footer(self, live: bool, problem: str = "") -> dict[str, str]:
        if live:
            until = time.strftime("%H:%M", time.localtime(time.time() + self.watch))
            note = f"(updated {self._at}; refreshes every {self.every:g} s until {until})"
        else:
            note = f"(as of {self._at}; no longer refreshing: run %deploy --list again)"
        lines = [note, problem] if problem else [note]
        shown = {"text/plain": "\n".join([self._last["text/plain"], *lines])}
        if "text/html" in self._last:
            foot = "".join(
                f'<div style="color:{MUTED};font-size:11px">{escape(line)}</div>' for line in lines
            )
            shown["text/html"] = self._last["text/html"] + foot
        return shown

    def _run(self) -> None:
        deadline = time.monotonic() + self.watch
        while not self.stopped.wait(self.every) and time.monotonic() < deadline:
            problem = ""
            try:
                table = self.table()
                if self.stopped.is_set():  # a cell started while we asked: keep the record
                    break
                self._last, self._at = table, time.strftime("%H:%M:%S")
            except Exception as e:  # shown under the last table; the next refresh retries
                problem = f"refresh failed ({type(e).__name__}: {e}); retrying"
            self.refreshes += 1
            self._handle.update(_Bundle(self._with_footer(live=True, problem=problem)))
        self._handle.update(_Bundle(self._with_footer(live=False)))


#: Where a deployments table keeps the rows it drew, beside its forms (never shown).
_ROWS = "gpulab/deployments"


class DeploymentsTable(LiveTable):
    """``%deploy --list``'s table: the deployments ``fetch()`` returns, kept current.

    ``%deploy --stop`` marks its row stopped (:meth:`mark_stopped`) in the latest table
    shown, though that table stopped refreshing when the stop's cell ran: a table that
    still said "running 2/2" of a stopped endpoint would say what is no longer true.
    """

    def __init__(self, fetch: Callable[[], list[dict]], lineage: bool = False, **kw):
        from .deploy_list import list_bundle

        self._render = lambda rows: {**list_bundle(rows, lineage=lineage), _ROWS: rows}
        super().__init__(lambda: self._render(fetch()), **kw)

    def mark_stopped(self, name: str, user: str | None = None) -> bool:
        """Show ``name`` (of ``user``) as stopped, 0 replicas ready; False if this table
        does not show it."""
        if self._handle is None:
            return False
        self.stop()
        # Its refresher's last update first (it ends within one read): ours is the last.
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=REFRESH_S * 6)
        shown = self._last.get(_ROWS) or []
        rows = [
            stopped_row(d) if d["name"] == name and user in (None, d.get("user")) else d
            for d in shown
        ]
        if rows == shown:
            return False
        self._last = self._render(rows)
        note = f"{name} stopped at {time.strftime('%H:%M:%S')} (%deploy --stop)"
        self._handle.update(_Bundle(self._with_footer(live=False, problem=note)))
        return True


def stopped_row(d: dict) -> dict:
    """A deployment's row once stopped: nothing ready, no calls going to it."""
    gone = {"state": "stopped", "message": "stopped", "replicas_ready": 0}
    return {**d, **gone, "versions": [{**v, **gone} for v in d.get("versions") or []]}


def _shell():
    from IPython import get_ipython

    return get_ipython()


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
