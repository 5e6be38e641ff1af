"""A real HTTP object store on localhost, for tests, benchmarks and demos.

``ShardServer`` serves a directory over HTTP/1.1 from a thread, adding a fixed
delay to every request, the way a remote bucket adds its round trips. It
counts requests per path so a test can see what was fetched and what was
served from the cache.
"""

from __future__ import annotations

import collections
import functools
import http.server
import os
import threading
import time


class _Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def __init__(self, *args, shard_server: ShardServer, **kwargs):
        self.shard_server = shard_server
        super().__init__(*args, directory=shard_server.directory, **kwargs)

    def do_GET(self):
        if self.shard_server._on_request("GET", self.path):
            self.send_error(503, "injected failure")
            return
        super().do_GET()

    def do_HEAD(self):
        self.shard_server._on_request("HEAD", self.path)
        super().do_HEAD()

    def log_message(self, *args):  # keep test output readable
        pass


class ShardServer:
    """Serve ``directory`` on ``127.0.0.1`` with ``latency_s`` added per request.

    Use as a context manager; ``url(name)`` is the URL of a file in it.
    """

    def __init__(self, directory: str, latency_s: float = 0.0):
        self.directory = os.path.abspath(directory)
        self.latency_s = latency_s
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()
        """Name -> how many of its next GETs answer 503 (a flaky store)."""
        self._lock = threading.Lock()
        handler = functools.partial(_Handler, shard_server=self)
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        # A short poll interval so that shutting down does not wait half a second.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="shard-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def gets(self, name: str) -> int:
        """How many GETs asked for ``name``."""
        with self._lock:
            return self.requests[("GET", "/" + name)]

    def _on_request(self, method: str, path: str) -> bool:
        """Count and delay a request; True when it should fail."""
        with self._lock:
            self.requests[(method, path)] += 1
            name = path.lstrip("/")
            fail = method == "GET" and self.failures[name] > 0
            if fail:
                self.failures[name] -= 1
        if self.latency_s:
            time.sleep(self.latency_s)
        return fail

    def __enter__(self) -> ShardServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def write_shards(
    directory: str, count: int, size: int, prefix: str = "shard-", seed: int = 0
) -> list[str]:
    """Write ``count`` files of ``size`` random bytes; return their names."""
    import random

    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    names = []
    for i in range(count):
        name = f"{prefix}{i:04d}.bin"
        with open(os.path.join(directory, name), "wb") as f:
            f.write(rng.randbytes(size))
        names.append(name)
    return names
