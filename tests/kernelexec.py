"""Run code in a kernel of a user's real single-user server, as a user would.

The kernel is started through the server's REST API and driven over its
websocket (Jupyter's JSON message protocol), through the hub's proxy, with the
user's own token: the code runs in the process a notebook cell runs in.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


async def _run(server_url: str, token: str, code: str, timeout: float) -> tuple[str, str]:
    auth = {"Authorization": f"token {token}"}
    http = AsyncHTTPClient()
    r = await http.fetch(
        f"{server_url}/api/kernels", method="POST", body="{}", headers=auth, request_timeout=timeout
    )
    kernel = json.loads(r.body)["id"]
    ws_url = server_url.replace("http", "ws", 1) + f"/api/kernels/{kernel}/channels"
    ws = await websocket_connect(HTTPRequest(ws_url, headers=auth, request_timeout=timeout))
    msg_id = uuid.uuid4().hex
    await ws.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": "test",
                    "session": uuid.uuid4().hex,
                    "msg_type": "execute_request",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "buffers": [],
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
            }
        )
    )
    out, err = [], []
    try:
        while True:
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            if raw is None:
                raise ConnectionError("the kernel's websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                err.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
    finally:
        ws.close()
        await http.fetch(
            f"{server_url}/api/kernels/{kernel}", method="DELETE", headers=auth, raise_error=False
        )
    return "".join(out), "\n".join(err)


def run_in_kernel(server_url: str, token: str, code: str, timeout: float = 120) -> str:
    """Stdout of ``code`` run in a new kernel of the server; raises on an error."""
    out, err = asyncio.run(_run(server_url, token, code, timeout))
    if err:
        raise RuntimeError(f"the cell failed: {err}\n{out}")
    return out
