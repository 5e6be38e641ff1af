"""``GET <server>/gpulab/activity``: is work going on in this server besides its
kernels' cells? For the service's idle rule and the scheduler's choice of a server
to hibernate (:mod:`gpulab.service.hibernation`): a server is idle only when nothing
the user started is still working, since hibernating ends it.

What counts as work, each cheap to see from here (``/proc`` and the server's own
managers; no message to a kernel, which Jupyter would count as activity):

- a process started from a kernel or a terminal (``subprocess``, ``!cmd &``, a
  command running in a terminal's shell), alive and not a zombie;
- another process of the server's using the CPU while it is looked at;
- a kernel whose cell has ended but whose process uses the CPU (a thread at work);
- a thread the user started in a kernel, alive (the kernel lists them:
  :mod:`gpulab.magics.kernel_work`).

Terminals' last activity (typing, output) is answered too: the service counts it as
the kernels' is. A process that leaves the server's tree (a daemon that detaches
itself) is not seen.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os

from jupyter_server.auth.decorator import authorized
from tornado import web

from gpulab.client.hibernations import work_file

from .handlers import GpuLabHandler

#: How long CPU use is measured for.
SAMPLE_S = 0.25
#: CPU seconds per second above which a process counts as at work.
BUSY_CPU = 0.05
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, str, int, str] | None:
    """(parent pid, state, CPU ticks, command name) of a process; None: gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[11]) + int(fields[12]), name


def processes() -> dict[int, tuple[int, str, int, str]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out[int(entry)] = st
    return out


#: Python's own helper processes, which live as long as the kernel that started them.
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def helper(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(h in cmdline for h in HELPERS)


def descendants(table: dict, root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kernel_pid(km) -> int | None:
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return getattr(process, "pid", None)


def kernel_threads(km) -> list[str]:
    """The user's live threads in a kernel, as the kernel wrote them."""
    try:
        with open(work_file(km.connection_file)) as f:
            said = json.load(f)
    except (OSError, ValueError, TypeError):
        return []
    if said.get("pid") != kernel_pid(km):  # a kernel before a restart
        return []
    return [str(t)[:200] for t in said.get("threads") or []][:20]


async def server_work(kernel_manager, terminal_manager, sample_s: float = SAMPLE_S) -> dict:
    """``{"work": [one line per piece of work], "terminals_last_activity": ISO|None}``."""
    kernels = {}  # pid -> its name
    threads = []
    for kid in list(kernel_manager.list_kernel_ids()):
        try:
            km = kernel_manager.get_kernel(kid)
        except KeyError:
            continue
        pid = kernel_pid(km)
        if pid:
            kernels[pid] = f"kernel {kid[:8]}"
        threads += [f"kernel {kid[:8]}: thread {t}" for t in kernel_threads(km)]
    shells = {}  # pid -> terminal name
    last_terminal = None
    for name, term in list(getattr(terminal_manager, "terminals", {}).items()):
        pid = getattr(getattr(term, "ptyproc", None), "pid", None)
        if pid:
            shells[pid] = f"terminal {name}"
        seen = getattr(term, "last_activity", None)
        if seen is not None and (last_terminal is None or seen > last_terminal):
            last_terminal = seen

    before = processes()
    await asyncio.sleep(sample_s)
    after = processes()
    mine = descendants(after, os.getpid())

    def cpu(pid: int) -> float:
        if pid not in before or pid not in after:
            return 0.0
        return (after[pid][2] - before[pid][2]) / _TICKS / sample_s

    started_by = {}  # pid -> the kernel or terminal whose tree it is in
    for root, what in {**kernels, **shells}.items():
        for pid in descendants(after, root):
            started_by[pid] = what
    work = list(threads)
    for pid in sorted(mine):
        _, state, _, name = after[pid]
        if state == "Z" or pid in shells:
            continue
        if pid in kernels:
            if cpu(pid) >= BUSY_CPU:
                work.append(f"{kernels[pid]}: its process uses the CPU between cells")
        elif helper(pid):
            continue
        elif pid in started_by:
            work.append(f"{started_by[pid]}: process {pid} ({name})")
        elif cpu(pid) >= BUSY_CPU:
            work.append(f"process {pid} ({name}) uses the CPU")
    return {
        "work": work,
        "terminals_last_activity": _iso(last_terminal),
    }


def _iso(t) -> str | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.isoformat()


class ActivityHandler(GpuLabHandler):
    # The service's idle probe is not the user at work: counted, it would keep an idle
    # server from JupyterHub's culler (jupyter_server's APIHandler honours this).
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self):
        answer = await server_work(
            self.settings["kernel_manager"], self.settings.get("terminal_manager")
        )
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))
