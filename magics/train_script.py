"""``%train_distributed [flags] SCRIPT.py [ARGS...]``: an existing script as a job.

The line magic ships a two-line cell that runs the script in each rank through
:func:`gpulab.training.script.run_script` (its folder on ``sys.path``, its own
``sys.argv``, a working folder the user owns). Paths are the notebook's: the
ranks read the script where the notebook sees it (the user's home and project
folders are the same on every node of a site).

Checked here, before anything is queued: the script exists and compiles; a cell
that does not compile is refused the same way (:class:`CellSyntaxError`).
"""

from __future__ import annotations

import os
import traceback

from IPython.core.error import UsageError

#: A job's ``--env`` that the rank applies itself: the service keeps loader variables
#: off the agents (gpulab's own launcher must load gpulab's packages), and the
#: script's rank puts these on its ``sys.path`` and in its environment.
RANK_ONLY_ENV = ("PYTHONPATH",)


class CellSyntaxError(UsageError):
    """The cell (or script) does not compile; shown as Python shows a SyntaxError,
    without frames of gpulab's magics."""

    def __init__(self, error: SyntaxError):
        self.error = error
        super().__init__(self._text())

    def _text(self) -> str:
        return "".join(traceback.format_exception_only(SyntaxError, self.error)).rstrip()

    def _render_traceback_(self) -> list[str]:
        return self._text().splitlines()


def check_compiles(source: str, filename: str, first_line: int = 1) -> None:
    """Raise :class:`CellSyntaxError` if ``source`` is not Python; ``first_line``: the
    number the notebook gives its first line (2 below ``%%train_distributed``)."""
    try:
        compile(source, filename, "exec")
    except SyntaxError as e:
        if e.lineno is not None:
            e.lineno += first_line - 1
            if getattr(e, "end_lineno", None) is not None:
                e.end_lineno += first_line - 1
        raise CellSyntaxError(e) from None
    except ValueError as e:  # NUL bytes in the source
        raise UsageError(f"{filename}: {e}") from None


def script_cell(words: list[str], env: dict[str, str], cwd: str | None = None) -> str:
    """The cell that runs ``words`` (``SCRIPT.py ARGS...``) in each rank; ``env``
    loses the variables the rank applies itself (``PYTHONPATH``)."""
    cwd = cwd or os.getcwd()
    script, args = words[0], words[1:]
    path = os.path.abspath(os.path.join(cwd, os.path.expanduser(script)))
    if not os.path.isfile(path):
        raise UsageError(
            f"{script}: no such file (looked in {os.path.dirname(path)}); give the "
            f"script's path from the notebook's folder, e.g. %train_distributed train.py"
        )
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        raise UsageError(f"{script}: cannot read it ({e.strerror})") from None
    check_compiles(source, path)
    pythonpath = [cwd]
    for name in RANK_ONLY_ENV:
        value = env.pop(name, "")
        pythonpath += [p for p in value.split(os.pathsep) if p]
    return (
        "from gpulab.training.script import run_script as _gpulab_run_script\n"
        f"globals().update(_gpulab_run_script({path!r}, {args!r}, {cwd!r}, {pythonpath!r}))\n"
    )
