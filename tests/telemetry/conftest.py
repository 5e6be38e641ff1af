import http.server
import json
import os
import subprocess
import sys
import threading

import pytest


class SinkHandler(http.server.BaseHTTPRequestHandler):
    """Records each POST; answers with the next scripted status (default 200)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        sink = self.server.sink
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with sink.lock:
            status = sink.script.pop(0) if sink.script else 200
            sink.posts.append(
                {"status": status, "headers": dict(self.headers), "body": json.loads(body)}
            )
            sink.lock.notify_all()
        # Echo the Authorization header in errors: the agent must not log it.
        reply = json.dumps(
            {"error": f"status {status} for {self.headers.get('Authorization')}"}
            if status >= 400
            else {"ok": True}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


class Sink:
    def __init__(self):
        self.posts = []
        self.script = []
        self.lock = threading.Condition()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SinkHandler)
        self.httpd.sink = self
        port = self.httpd.server_port
        self.url = f"http://127.0.0.1:{port}/services/gpulab/api/v1/telemetry"

    def delivered(self):
        return [p["body"] for p in self.posts if p["status"] < 300]

    def wait_for_posts(self, n, timeout=30):
        with self.lock:
            return self.lock.wait_for(lambda: len(self.posts) >= n, timeout=timeout)


@pytest.fixture
def sink():
    """A real HTTP server on 127.0.0.1 standing in for the service's receiving route."""
    sink = Sink()
    thread = threading.Thread(target=sink.httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield sink
    sink.httpd.shutdown()
    sink.httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture
def hub_user_process():
    """A real process tree: a parent with JUPYTERHUB_USER=alice, a child without it."""
    env = {**os.environ, "JUPYTERHUB_USER": "alice"}
    code = (
        "import subprocess, sys; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "env={}); print(child.pid, flush=True); child.wait()"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    child_pid = int(parent.stdout.readline())
    yield parent.pid, child_pid
    os.kill(child_pid, 9)
    parent.wait(timeout=30)
