"""Which of the user's threads are alive in this kernel, for the server's idle check.

A kernel whose last cell ended is "idle" to Jupyter, yet a thread the user started
(a download, a training loop, a poller) may still be working; hibernating the server
would end it. A daemon thread of gpulab's looks every :data:`EVERY_S` seconds at
``threading.enumerate()`` and writes the user's live threads to a small file beside
the kernel's connection file (:func:`gpulab.client.hibernations.work_file`), only
when the list changes; the server extension (:mod:`gpulab.lab.activity`) reads it.
Asking the kernel instead would be activity itself (Jupyter counts every message).

A thread is the user's when its code (its ``target``, or its class) was defined in
a notebook or in the user's own modules, not in the standard library, an installed
package or gpulab: the kernel's own threads, a library's helpers and idle pools do
not keep a server awake (a pool working shows as CPU, which the server measures).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import sysconfig
import threading

from gpulab.client.hibernations import work_file

#: How often the threads are looked at (a thread started is seen within this).
EVERY_S = 5.0
_STARTED: list[threading.Thread] = []


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def is_users(code_owner, library_dirs: tuple[str, ...]) -> bool:
    """Was ``code_owner`` (a function or a class) written by the user?"""
    module = sys.modules.get(getattr(code_owner, "__module__", None) or "")
    if module is None or module.__name__.split(".")[0] == "gpulab":
        return False  # gpulab's own (its client's loop, a dashboard's poller, this)
    if module.__name__ == "__main__":
        return True
    path = getattr(module, "__file__", None)
    return bool(path) and not os.path.realpath(path).startswith(library_dirs)


def users_threads(library_dirs: tuple[str, ...] | None = None) -> list[str]:
    """The user's live threads, each as ``name (function)``."""
    dirs = library_dirs if library_dirs is not None else _library_dirs()
    out = []
    for t in threading.enumerate():
        if t is threading.main_thread() or not t.is_alive():
            continue
        # Thread(target=f), Timer(s, f), or a Thread subclass with its own run().
        target = getattr(t, "_target", None) or getattr(t, "function", None)
        owner = target if target is not None else type(t)
        if is_users(owner, dirs):
            out.append(f"{t.name} ({getattr(owner, '__qualname__', type(owner).__name__)})")
    return sorted(out)


def _write(path: str, threads: list[str]) -> None:
    if not threads:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "threads": threads}, f)
    os.replace(tmp, path)


def watch(connection_file: str, every: float = EVERY_S) -> threading.Thread:
    """Start the watcher of this kernel (one per process)."""
    if _STARTED:
        return _STARTED[0]
    path = work_file(connection_file)
    dirs = _library_dirs()
    stop = threading.Event()

    def run():
        last = None
        while not stop.wait(every):
            try:
                now = users_threads(dirs)
                if now != last:
                    _write(path, now)
                    last = now
            except Exception:  # never the kernel's problem: the next look tries again
                last = None

    thread = threading.Thread(target=run, name="gpulab-kernel-work", daemon=True)
    thread.start()
    _STARTED.append(thread)
    return thread


def start_in_kernel() -> None:
    """In a Jupyter kernel (ipykernel), watch its threads; elsewhere, nothing."""
    try:
        from ipykernel.connect import get_connection_file

        connection_file = get_connection_file()
    except Exception:  # not a kernel (a terminal IPython, tests)
        return
    if connection_file and os.path.isabs(connection_file):
        watch(connection_file)
