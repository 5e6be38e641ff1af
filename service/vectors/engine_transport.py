"""The embedded engine's calls on its Unix socket: one frame each way per call.

A request is ``[u32 length][method name]\\n[message]``, a reply ``[u32 length][message]``
(the messages are :mod:`.engine_protocol`'s). The service keeps a few connections open
and sends one call at a time on each; the engine answers each connection in a thread
of its own (FAISS releases the GIL while it searches, so the calls of several
connections run at once).

Why not gRPC (which this replaced): a search's round trip through grpcio's server (its
completion queue, then a worker pool, both ways) and the service's executor thread
took most of a REST search's time on top of FAISS; here it is a write and a read on
the event loop, and a read and a write in the engine's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable

from .engine_protocol import LENGTH, MAX_MESSAGE

log = logging.getLogger("gpulab.service.vectors.engine")

#: A message past this is refused (a 1,000-row insert of 4,096-d vectors is 16 MB).
MAX_FRAME = MAX_MESSAGE + 256
#: How long a stopping engine waits for the calls under way (a write being logged).
STOP_GRACE_S = 5.0


class EngineGone(Exception):
    """The engine is not there, or hung up in the middle of a call."""


def request_frame(method: str, message: bytes) -> bytes:
    body = method.encode() + b"\n" + message
    return LENGTH.pack(len(body)) + body


# -- the engine's side --------------------------------------------------------------


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Answers ``handlers[method](message) -> reply`` on ``path``, a thread per connection."""

    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: str, handlers: dict[str, Callable[[bytes], bytes]]):
        self.handlers = handlers
        self._calls = 0
        self._idle = threading.Condition()
        super().__init__(path, _Connection)

    def answer(self, method: bytes, message: bytes) -> bytes:
        handler = self.handlers.get(method.decode("ascii", "replace"))
        if handler is None:
            raise ValueError(f"no call {method!r}")
        with self._idle:
            self._calls += 1
        try:
            return handler(message)
        finally:
            with self._idle:
                self._calls -= 1
                self._idle.notify_all()

    def handle_error(self, request, client_address) -> None:
        """A connection the service closed (its call's time ran out, or it stopped) is
        not the engine's error; anything else is logged, as socketserver would."""
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            log.exception("vector engine connection failed")

    def stop(self) -> None:
        """No new connections; then the calls under way end (at most STOP_GRACE_S)."""
        self.shutdown()
        self.server_close()
        deadline = time.monotonic() + STOP_GRACE_S
        with self._idle:
            while self._calls and time.monotonic() < deadline:
                self._idle.wait(deadline - time.monotonic())


class _Connection(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:
            head = self.rfile.read(LENGTH.size)
            if len(head) < LENGTH.size:
                return  # the service closed the connection
            (n,) = LENGTH.unpack(head)
            if n > MAX_FRAME:
                return  # not a call of ours: hang up
            body = self.rfile.read(n)
            if len(body) < n:
                return
            method, _, message = body.partition(b"\n")
            try:
                reply = self.server.answer(method, message)
            except ValueError:
                return  # an unknown call: hang up (the service sends only known ones)
            try:
                self.wfile.write(LENGTH.pack(len(reply)) + reply)
                self.wfile.flush()
            except OSError:
                return  # the service gave up on this call (its time ran out) and hung up


# -- the service's side -------------------------------------------------------------


class Client:
    """Calls on the event loop over kept connections, one call per connection at a time.
    A call cut short (its time ran out, or it was cancelled) closes its connection: the
    engine's late reply is never read as another call's."""

    def __init__(self, path: str):
        self.path = path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def _connection(self):
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()  # the engine restarted since this one was used
        try:
            return await asyncio.open_unix_connection(self.path, limit=MAX_FRAME)
        except OSError as e:
            raise EngineGone(f"cannot connect: {e}") from None

    async def call(self, method: str, message: bytes) -> bytes:
        reader, writer = await self._connection()
        ok = False
        try:
            writer.write(request_frame(method, message))
            (n,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            if n > MAX_FRAME:  # not a reply of this engine's: nothing that size is read
                raise EngineGone(f"the engine's reply of {n} bytes is over {MAX_FRAME}")
            reply = await reader.readexactly(n)
            ok = True
            return reply
        except (OSError, asyncio.IncompleteReadError) as e:
            raise EngineGone(f"the engine hung up: {type(e).__name__}") from None
        finally:
            if ok:
                self._idle.append((reader, writer))
            else:
                writer.close()

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


def answers(path: str, timeout: float) -> bool:
    """Whether the engine answers a ping on ``path`` within ``timeout`` (blocking: for
    the thread that waits for a starting engine)."""
    from .engine_protocol import pack

    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(request_frame("ping", pack({})))
        head = b""
        while len(head) < LENGTH.size:
            chunk = s.recv(LENGTH.size - len(head))
            if not chunk:
                return False
            head += chunk
        return True
    return False
