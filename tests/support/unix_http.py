"""One HTTP request over a Unix socket (requests has no such transport), for tests
that call a replica directly where the service reaches it."""

from __future__ import annotations

import http.client
import json
import socket


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 60):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def unix_request(
    path: str, method: str, url: str, headers: dict | None = None, body=None
) -> tuple[int, dict | str]:
    """``(status, body)`` of one request to the server on socket ``path``; a JSON body
    (a dict) is sent and answered as JSON."""
    conn = UnixHTTPConnection(path)
    try:
        if isinstance(body, dict):
            body = json.dumps(body)
            headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, url, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read().decode(errors="replace")
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data
    finally:
        conn.close()
