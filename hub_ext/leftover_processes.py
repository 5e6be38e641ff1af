"""What an earlier ``gpulab up`` on the same data dir left running, found and ended.

JupyterHub starts its managed services (the gpulab service, the idle culler) and
configurable-http-proxy in sessions of their own, so a hub that dies without its
shutdown (``kill -9``, the OOM killer, a crash) leaves them running. The next hub's
service then finds its port taken and crash-loops on "Address already in use", and
the old service goes on acting on the old hub's behalf. So ``gpulab up`` ends them
before it starts the hub, and refuses to start while that hub itself still runs.

A process is ours only when all of these hold, read from ``/proc``: it runs as this
account, its command line is one of the platform's own (``-m gpulab.service``,
``-m gpulab.service.experiments``, ``-m jupyterhub_idle_culler``,
``configurable-http-proxy``), and its environment
names this data dir (``GPULAB_DATA_DIR``: ``gpulab up`` gives it to the hub, the
hub to the proxy and the services). Signals go through a pidfd opened before those
checks, so a pid reused in between is never signalled.

Users' servers, jobs and replicas are not touched: their command lines are not in
the list, and the service is ended with :data:`LEAVE_WORK_SIGNAL`, not SIGTERM: it
stops without stopping its jobs and replicas (``gpulab up`` has it stop them on its
Ctrl-C), so the next service adopts them as after a crash of the service alone, and
nothing that ran starts again. Servers are the next hub's to find
(``JupyterHub.cleanup_servers``).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

#: How long a left process has to stop after SIGTERM before it gets SIGKILL.
TERM_GRACE_S = 10.0
KILL_GRACE_S = 5.0
#: The hub that ``gpulab up`` execs (``python -m gpulab.hub_ext.hub_app``).
HUB_MODULE = "gpulab.hub_ext.hub_app"
#: What ends a left gpulab service and leaves its work running: the service's
#: ``LEAVE_WORK_SIGNAL`` (gpulab.service.app; not imported: the CLI stays light).
LEAVE_WORK_SIGNAL = signal.SIGUSR1
SERVICE = "the gpulab service"
PROXY = "configurable-http-proxy"


@dataclass
class Leftover:
    pid: int
    what: str  # "the gpulab service"
    pidfd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


def kind_of(argv: list[str]) -> str | None:
    """Which of the platform's processes a command line is, or None."""
    modules = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"}
    if "gpulab.service" in modules:
        # `-m gpulab.service endpoint-standby ...`: the router that answers while the
        # service is down (gpulab.service.endpoints.standby).
        standby = "endpoint-standby" in argv
        return "the standby endpoint router" if standby else SERVICE
    if "gpulab.service.experiments" in modules:
        # MLflow behind the hub: its MLflow server stops with it (PR_SET_PDEATHSIG).
        return "the MLflow service"
    if "jupyterhub_idle_culler" in modules:
        return "the idle culler"
    if any(os.path.basename(a) == PROXY for a in argv[:2]):
        return PROXY
    if HUB_MODULE in modules:
        return "the hub"
    return None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _uid(pid: int) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    raise OSError("no Uid line")


def _environ(pid: int) -> dict[bytes, bytes]:
    pairs = (entry.partition(b"=") for entry in _read(f"/proc/{pid}/environ").split(b"\0"))
    return {k: v for k, _, v in pairs if k}


def identify(pid: int, data_dir: Path) -> str | None:
    """What the process ``pid`` is when it is one of ours on ``data_dir``, else None."""
    try:
        # The account first: another account's command line is never read (a process
        # can make a read of its own command line block, with memory it maps from a
        # FUSE mount it then stalls).
        if _uid(pid) != os.getuid():
            return None
        argv = [a.decode(errors="replace") for a in _read(f"/proc/{pid}/cmdline").split(b"\0")]
        what = kind_of([a for a in argv if a] if argv else [])
        if what is None:
            return None
        env = _environ(pid)
    except (OSError, ValueError):  # gone, a zombie, or not ours to read
        return None
    return what if env.get(b"GPULAB_DATA_DIR") == os.fsencode(data_dir) else None


def find(data_dir: Path) -> list[Leftover]:
    """Our processes on ``data_dir`` (the hub among them), each held by a pidfd."""
    data_dir = Path(data_dir).resolve()
    found = []
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"):
        return found  # not Linux: nothing can be checked safely, so nothing is ended
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        # Checked after the pidfd is open: if ``pid`` is still this process now, the
        # pidfd is bound to it and no later reuse of the number can be signalled.
        what = identify(pid, data_dir)
        if what is None:
            os.close(pidfd)
        else:
            found.append(Leftover(pid, what, pidfd))
    return found


def _wait(procs: list[Leftover], seconds: float) -> list[Leftover]:
    """Wait until each has exited (its pidfd readable) or ``seconds`` passed; the rest."""
    deadline = time.monotonic() + seconds
    left = list(procs)
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([p.pidfd for p in left], [], [], remaining)
        left = [p for p in left if p.pidfd not in ready]
    return left


def _signal(procs: list[Leftover], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(p.pidfd, sig)


def _end(procs: list[Leftover]) -> None:
    """Ask each to stop: the service leaving its work running, the rest by SIGTERM."""
    for p in procs:
        _signal([p], LEAVE_WORK_SIGNAL if p.what == SERVICE else signal.SIGTERM)


def end_leftovers(data_dir: Path, shown_as: str, say=print) -> list[int]:
    """End what an earlier ``gpulab up`` on ``data_dir`` left running; their pids.

    Raises SystemExit while that earlier hub itself still runs: two hubs on one data
    dir would share its database and ports.
    """
    found = find(data_dir)
    try:
        hubs = [p for p in found if p.what == "the hub"]
        if hubs:
            pid = hubs[0].pid
            raise SystemExit(
                f"gpulab up is already running on {shown_as} (pid {pid}): stop it first "
                f"(Ctrl-C in its terminal, or kill {pid})"
            )
        _end(found)
        stubborn = _wait(found, TERM_GRACE_S)
        _signal(stubborn, signal.SIGKILL)
        still = _wait(stubborn, KILL_GRACE_S)
        for p in found:
            if p not in still:
                say(f"Ended {p.what} (pid {p.pid}) left by an earlier `gpulab up` on {shown_as}")
        if still:
            pids = " ".join(str(p.pid) for p in still)
            raise SystemExit(
                f"{still[0].what} (pid {still[0].pid}) left by an earlier `gpulab up` on "
                f"{shown_as} does not stop, even on SIGKILL: end it (kill -9 {pids}), "
                "then start again"
            )
    finally:
        for p in found:
            p.close()
    # Every proxy of ours has just been ended. JupyterHub would otherwise signal the
    # pid in this file without checking what it is now (after a reboot, anything).
    with contextlib.suppress(FileNotFoundError):
        (Path(data_dir) / "jupyterhub-proxy.pid").unlink()
    return [p.pid for p in found]


#: At the end of a hub's own shutdown, how long what is left has after SIGTERM.
AFTER_SHUTDOWN_GRACE_S = 2.0


def end_after_shutdown(data_dir: Path, say=print) -> list[int]:
    """At the end of the hub's shutdown: end what of the platform on ``data_dir`` still
    runs (a standby router whose service was killed, a service that did not stop in
    time), so that nothing outlives ``gpulab up``; their pids. The hub calls it about
    itself, whose own pid is never among them."""
    found = [p for p in find(data_dir) if p.what != "the hub"]
    try:
        _signal(found, signal.SIGTERM)
        stubborn = _wait(found, AFTER_SHUTDOWN_GRACE_S)
        _signal(stubborn, signal.SIGKILL)
        _wait(stubborn, KILL_GRACE_S)
        for p in found:
            if p.what != PROXY:  # JupyterHub signals it and does not wait: it was stopping
                say(f"Ended {p.what} (pid {p.pid}), still running as the hub stopped")
    finally:
        for p in found:
            p.close()
    return [p.pid for p in found]
