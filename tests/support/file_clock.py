"""A clock for a service in another process: real time plus an offset a test writes.

``support.clock.FakeClock`` moves only this process's time. A real hub's service
(``gpulab up``) runs in a process of its own; its ``gpulab_config.py`` can install
this clock there (:func:`config_lines`), and the test then moves that service's
time by writing the offset file (:func:`advance_to`): a schedule due tomorrow at
03:00 fires now, without waiting for it.

Only ``now()`` moves (what stored times and schedules read); ``monotonic()`` stays
the machine's, so timeouts that wait for real things are not cut short.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path


class FileClock:
    def __init__(self, path: str):
        self.path = path

    def offset(self) -> float:
        try:
            with open(self.path) as f:
                return float(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def now(self) -> float:
        return time.time() + self.offset()

    def monotonic(self) -> float:
        return time.monotonic()


def config_lines(offset_file: Path) -> str:
    """``gpulab_config.py`` lines that make the service (and hub) read ``offset_file``."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (
        "import sys as _sys\n"
        f"_sys.path.insert(0, {tests!r})\n"
        "from support.file_clock import FileClock as _FileClock\n"
        "from gpulab.db import clock as _clock\n"
        f"_clock.use(_FileClock({str(offset_file)!r}))\n"
    )


def advance_to(offset_file: Path, when: dt.datetime) -> None:
    """Move the other process's clock so that it reads ``when`` now (never back)."""
    offset = when.timestamp() - time.time()
    current = FileClock(str(offset_file)).offset()
    offset_file.write_text(str(max(offset, current)))
