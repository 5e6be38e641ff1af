"""The embedded vector engine as a process of its own, under its own account.

The service starts :mod:`.engine_server` (FAISS behind gpulab's write-ahead log) as
the system account ``gpulab_vectors`` when it runs as root (else as itself), with its data in
``<data-dir>/vectors`` (that account's, mode 0700) and its socket in a private
directory (mode 0700: the service and the engine only). The engine dies with the
service (it asks the kernel for that, ``PR_SET_PDEATHSIG``), and one a
killed service left behind is stopped by the next (its pid file). If the engine
exits on its own (or is killed, stuck in a call: :meth:`EngineProcess.kill`), it is
started again; calls meanwhile get "restarting".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpulab.enforcement.accounts import unreachable
from gpulab.enforcement.system_accounts import ensure_system_account, running_as_root

from . import engine_transport, socket_dir

log = logging.getLogger("gpulab.service.vectors")

ENGINE_ACCOUNT = "gpulab_vectors"
ENGINE_MODULE = "gpulab.service.vectors.engine_server"
#: How long a start may take: the engine replays its logs first. Its first start
#: copies what an older gpulab kept in Milvus Lite (a big one, many minutes): while
#: that copy writes pages, the limit counts from the last page it wrote.
READY_TIMEOUT_S = 300.0
#: The copy's progress file (:mod:`.lite_migration`), in the engine's folder of
#: collections: each page it writes replaces it.
MIGRATION_PROGRESS = os.path.join("faiss", "lite-migration.json")
#: Waits between restarts of an engine that keeps exiting: 1 s doubling to a minute.
RESTART_BACKOFF_S = (1.0, 60.0)
#: How often the watcher looks whether the engine is still running (seconds).
WATCH_INTERVAL_S = 0.5


class EngineProcess:
    """Starts, watches and stops the embedded engine; ``uri`` is where it answers."""

    def __init__(self, data_dir: str):
        self.root = os.path.join(data_dir, "vectors")
        self.data_dir = data_dir
        self.pid_file = os.path.join(data_dir, "vector-engine.pid")
        self.socket_dir = ""
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._account = None
        self._made = False
        self._socket_made = False

    @property
    def uri(self) -> str:
        return "unix:" + self.socket

    @property
    def socket(self) -> str:
        return os.path.join(self.socket_dir, "engine.sock")

    def prepare(self) -> None:
        """Stop the engine a killed service left behind (it holds the data directory's
        lock) and choose the socket's folder; the rest waits for the first start."""
        self._stop_leftover()
        # A short path of its own (:mod:`.socket_dir`); the one a killed service left goes.
        self.socket_dir = socket_dir.choose(self.data_dir)

    def _make_room(self) -> None:
        """The engine's account and its data directory, which it must be able to reach."""
        account = ensure_system_account(ENGINE_ACCOUNT) if running_as_root() else None
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        if not self._socket_made:  # once: a retry after a failure below finds it made
            socket_dir.make(self.data_dir, self.socket_dir)
            self._socket_made = True
        if account is not None:
            why = unreachable(os.path.dirname(self.root))
            if why:
                raise RuntimeError(f"its account {ENGINE_ACCOUNT} cannot reach its data: {why}")
            for path in (self.root, self.socket_dir):
                os.chown(path, account.uid, account.gid)
        self._account = account
        self._made = True

    def start_process(self) -> None:
        kwargs = self._account.popen_kwargs() if self._account is not None else {}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.root,
            "PYTHONUNBUFFERED": "1",
        }
        log_path = os.path.join(os.path.dirname(self.root), "vector-engine.log")
        with open(log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", ENGINE_MODULE, self.root, self.socket, str(os.getpid())],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                **kwargs,
            )
        with open(self.pid_file, "w") as f:
            f.write(str(self.proc.pid))

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the socket answers (the engine replays its logs first). The limit
        counts from the start, or from the last page a copy from Milvus Lite wrote:
        a copy that goes on is waited for however long it takes (killed at the
        limit, it began again at each start, and never ended)."""
        started = moved = time.monotonic()
        progress = self._migration_progress()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"the vector engine exited with {self.proc.returncode} as it started; "
                    f"see {os.path.dirname(self.root)}/vector-engine.log"
                )
            if os.path.exists(self.socket) and engine_transport.answers(self.socket, 1.0):
                return
            now, seen = time.monotonic(), self._migration_progress()
            if seen != progress:
                progress, moved = seen, now
            if now - max(started, moved) >= timeout:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the vector engine did not answer within {timeout:g} s")

    def _migration_progress(self) -> int | None:
        """When the copy from Milvus Lite last wrote its progress (ns), or None."""
        try:
            return os.stat(os.path.join(self.root, MIGRATION_PROGRESS)).st_mtime_ns
        except OSError:
            return None

    async def start(self) -> None:
        await self._start_and_wait()
        self._task = asyncio.create_task(self._watch())

    async def _start_and_wait(self) -> None:
        if not self._made:
            self._make_room()
        # Started from the event loop's thread, which lives as long as the service: the
        # engine's death signal follows the thread that started it, not the process.
        self.start_process()
        try:
            await asyncio.to_thread(self.wait_ready)
        except Exception:
            # One that never answered must not hold the data's lock for the next try.
            if self.proc.poll() is None:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
            raise
        log.info("Vector engine ready (pid %d)", self.proc.pid)

    async def _watch(self) -> None:
        delay = RESTART_BACKOFF_S[0]
        while not self._stopping:
            code = await self._exited()
            if self._stopping:
                return
            log.warning("The vector engine exited with %s; starting it again", code)
            await asyncio.sleep(delay)
            try:
                await self._start_and_wait()
                self.restarts += 1
                delay = RESTART_BACKOFF_S[0]
            except Exception as e:
                log.error("Starting the vector engine again failed: %s", e)
                delay = min(delay * 2, RESTART_BACKOFF_S[1])

    async def _exited(self) -> int:
        """The engine's exit code once it exits. Polled: a thread of the loop's shared
        pool parked on ``wait`` for the engine's whole life would be one fewer for
        everything else."""
        while (code := self.proc.poll()) is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
        return code

    def kill(self) -> None:
        """SIGKILL the engine (one stuck in a call); the watcher starts it again."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self) -> None:
        self._stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(OSError):
            os.unlink(self.pid_file)
        if self.socket_dir:
            socket_dir.remove(self.data_dir, self.socket_dir)

    def _stop_leftover(self) -> None:
        try:
            pid = int(Path(self.pid_file).read_text().strip())
        except (OSError, ValueError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return
        if ENGINE_MODULE.encode() not in cmdline:
            return  # the pid is someone else's now
        log.warning("Stopping the vector engine a previous service left (pid %d)", pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.05)
