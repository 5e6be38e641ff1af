"""A notebook's kernel on a user's real server, opened the way JupyterLab opens one.

A *session* for a notebook path (``POST /api/sessions``), so the kernel starts with
``JPY_SESSION_NAME`` as JupyterLab's do; cells run over the kernel's websocket
through the hub's proxy with the user's token. Unlike ``kernelexec.run_in_kernel``
the kernel stays between cells (and after :meth:`NotebookKernel.close`): its
variables are the point.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import uuid

import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect


class CellError(AssertionError):
    pass


class NotebookKernel:
    def __init__(self, server_url: str, token: str, path: str, timeout: float = 120):
        self.server_url = server_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        r = requests.post(
            f"{self.server_url}/api/sessions",
            json={
                "path": path,
                "name": posixpath.basename(path),
                "type": "notebook",
                "kernel": {"name": "python3"},
            },
            headers=self.auth,
            timeout=timeout,
        )
        r.raise_for_status()
        self.session = r.json()
        self.kernel_id = self.session["kernel"]["id"]

    @property
    def auth(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def run(self, code: str) -> str:
        """What the cell printed (stdout, and the text of what it displayed); raises
        :class:`CellError` with the traceback's last line when the cell fails."""
        out, err = asyncio.run(self._run(code))
        if err:
            raise CellError(f"{err}\n--- output ---\n{out}")
        return out

    async def _run(self, code: str) -> tuple[str, str]:
        ws_url = self.server_url.replace("http", "ws", 1)
        ws_url += f"/api/kernels/{self.kernel_id}/channels"
        req = HTTPRequest(ws_url, headers=self.auth, request_timeout=self.timeout)
        ws = await websocket_connect(req)
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "username": "test",
            "session": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "version": "5.3",
        }
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        message = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
        await ws.write_message(json.dumps({**message, "content": content, "buffers": []}))
        out, err = [], []
        try:
            while True:
                raw = await asyncio.wait_for(ws.read_message(), self.timeout)
                if raw is None:
                    raise ConnectionError("the kernel's websocket closed")
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, body = msg["msg_type"], msg["content"]
                if kind == "stream":
                    out.append(body["text"])
                elif kind in ("display_data", "execute_result"):
                    out.append(body.get("data", {}).get("text/plain", "") + "\n")
                elif kind == "error":
                    err.append(f"{body['ename']}: {body['evalue']}")
                elif kind == "status" and body["execution_state"] == "idle":
                    break
        finally:
            ws.close()
        return "".join(out), "\n".join(err)
