"""What the test process's event loop and threads were doing, written to stderr.

Called when a request to the in-process service times out: the service shares the
test's event loop, so a stall there (a task awaiting forever, every thread of the
default pool busy) is only explained by the state at that moment; pytest shows
stderr with the failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import sys
import threading

import psutil


def dump_loop_state(why: str) -> None:
    out = sys.stderr
    print(f"\n===== {why}: the event loop's tasks and every thread =====", file=out)
    loop = asyncio.get_running_loop()
    pool = getattr(loop, "_default_executor", None)
    if pool is not None:
        busy = sum(1 for t in getattr(pool, "_threads", ()) if t.is_alive())
        print(
            f"default executor: {busy} thread(s) of at most {pool._max_workers}, "
            f"{pool._work_queue.qsize()} call(s) waiting for one",
            file=out,
        )
    # A server that never accepts while its loop idles: is its listening socket still
    # watched? (A socket closed without leaving the loop leaves its number registered,
    # and a later one given that number may be swapped in without the kernel watching.)
    selector = getattr(loop, "_selector", None)
    if selector is not None:
        watched = selector.get_map()
        print(f"--- {len(watched)} file descriptor(s) watched by the loop", file=out)
        for fd, key in sorted(watched.items()):
            print(f"fd {fd} events {key.events}: {key.data!r}"[:300], file=out)
    with contextlib.suppress(Exception):  # psutil: which of those are listening, on what
        listening = [c for c in psutil.Process().net_connections() if c.status == "LISTEN"]
        for c in listening:
            print(f"listening: fd {c.fd} on {c.laddr.ip}:{c.laddr.port}", file=out)
    for task in asyncio.all_tasks(loop):
        print(f"--- {task.get_name()}: {task.get_coro()!r}", file=out)
        task.print_stack(limit=6, file=out)
    print(f"--- {threading.active_count()} threads", file=out)
    faulthandler.dump_traceback(file=out, all_threads=True)
