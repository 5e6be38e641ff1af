"""A log that stays under a size: ``python -m gpulab.training.log_cap --max-bytes N PATH``.

Reads its standard input (a rank's or a replica's output), or with ``-- CMD...``
runs ``CMD`` and reads its output (a torchrun agent's), and appends it to ``PATH``.
When the file would pass ``N`` bytes, the older half is dropped: the newest lines
are copied to a new file that starts with

    [gpulab] log over 64 MiB: older lines dropped (33554432 bytes)

and that file replaces ``PATH`` (a new inode). Readers that follow the log
(:class:`gpulab.backend.jobdir.LogTail`) notice the new inode and use the byte
count to go on where they were. It is a process of its own, not a limit on the
writer (RLIMIT_FSIZE would kill it): it needs nothing of the service, so it goes
on across a service restart. With ``--exit-file F`` it writes ``CMD``'s exit code
to ``F`` once all of ``CMD``'s output is in the log (the backend's sign that the
node ended), and exits with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time

#: The least cap: a cut keeps half, and a read of the pipe is at most 64 KiB.
MIN_BYTES = 1 << 20
CHUNK = 1 << 16
DROPPED = re.compile(rb"^\[gpulab\] log over [^:\n]*: older lines dropped \((\d+) bytes\)\n")


def label(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"


def note(max_bytes: int, dropped: int) -> bytes:
    return f"[gpulab] log over {label(max_bytes)}: older lines dropped ({dropped} bytes)\n".encode()


def dropped_of(first_line: bytes) -> int | None:
    """The bytes a cut dropped, from the first line of a cut log; None if not cut."""
    m = DROPPED.match(first_line)
    return int(m.group(1)) if m else None


class CappedLog:
    """Appends to ``path``, cutting the older half when it would pass ``max_bytes``."""

    def __init__(self, path: str, max_bytes: int, mode: int = 0o600):
        self.path = path
        self.max_bytes = max(int(max_bytes), MIN_BYTES)
        self.mode = mode
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, mode)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        if self.size + len(data) > self.max_bytes:
            self.cut(self.max_bytes // 2)
        while data:
            done = os.write(self.fd, data)
            self.size += done
            data = data[done:]

    def cut(self, keep: int) -> None:
        """Keep the last ``keep`` bytes (from a line's start) in a new file at ``path``."""
        with open(self.path, "rb") as old:
            start = max(0, self.size - keep)
            old.seek(start)
            kept = old.read(keep)
        newline = kept.find(b"\n")
        if start and newline >= 0:
            start, kept = start + newline + 1, kept[newline + 1 :]
        tmp = f"{self.path}.cut"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, self.mode)
        try:
            os.write(fd, note(self.max_bytes, start) + kept)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)


def copy(source_fd: int, log: CappedLog, child=None, grace_s: float = 5.0) -> None:
    """Copy until end of file. With ``child`` (a ``Popen``), also stop ``grace_s``
    after it exits: a process it left behind may hold the pipe open for ever."""
    deadline = None
    while True:
        if child is not None:
            ready, _, _ = select.select([source_fd], [], [], 0.5)
            if not ready:
                if deadline is None and child.poll() is not None:
                    deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline:
                    return
                continue
        try:
            data = os.read(source_fd, CHUNK)
        except InterruptedError:
            continue
        if not data:
            return
        log.write(data)


class _Dropped:
    def write(self, data: bytes) -> None:
        pass


def _exit_file(path: str, code: int) -> None:
    with open(f"{path}.tmp", "w") as f:
        f.write(f"{code}\n")
    os.replace(f"{path}.tmp", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.training.log_cap")
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--exit-file", help="where CMD's exit code goes when it ends")
    parser.add_argument("path")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...: run and log it")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # It ends when its writers close the pipe; a signal meant for them (a cancel's
    # SIGTERM to the process group, a preemption's) must not end it first and
    # break their output.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    child = None
    source = sys.stdin.fileno()
    if command:
        source, write_end = os.pipe()
        child = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=write_end,
            preexec_fn=_default_signals,
        )
        os.close(write_end)
    try:
        log = CappedLog(args.path, args.max_bytes)
        copy(source, log, child)
        log.close()
    except OSError as exc:
        # Whatever happens to the file (a full disk), the writers must not get SIGPIPE.
        print(f"[gpulab] log_cap: {args.path}: {exc}; output dropped", file=sys.stderr)
        with contextlib.suppress(OSError):
            copy(source, _Dropped(), child)
    if child is None:
        return 0
    code = child.wait()
    code = code if code >= 0 else 128 - code  # as a shell says a signal
    if args.exit_file:
        _exit_file(args.exit_file, code)
    return code


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
