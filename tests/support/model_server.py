"""A real model server (``python -m gpulab.serving.server``) as a test's child process,
and the OIP v2 request body of texts in tritonclient's binary form."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

START_TIMEOUT_S = 120  # a loaded 2-core machine imports torch slowly; a bound, not a sleep


class ServerProcess:
    """``python -m gpulab.serving.server`` as a child process; ``url`` is host:port."""

    def __init__(self, model_dir: str, *flags: str):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulab.serving.server",
                "--model-dir",
                model_dir,
                "--port",
                "0",
                "--threads",
                "1",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(
            target=self._pump, args=(self.proc.stdout, self._lines.put), daemon=True
        ).start()
        threading.Thread(
            target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True
        ).start()
        self.url = None

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)
        put(None)

    def wait_listening(self) -> str:
        try:
            line = self._lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            line = None
        if not line or "listening on http" not in line:  # http:// or https://
            self.stop()
            raise RuntimeError(f"model server did not start: {line!r}\n{''.join(self.stderr)}")
        self.url = line.rsplit("://", 1)[1].strip()
        return self.url

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.wait_stopped()

    def wait_stopped(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def binary_texts(elements: list[bytes], name: str = "text") -> tuple[bytes, int]:
    """``(body, json_length)`` of a request with one BYTES input in binary form: each
    element a 4-byte little-endian length and its bytes (tritonclient's layout). The
    JSON's length goes in the ``Inference-Header-Content-Length`` header."""
    blob = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "BYTES",
                    "shape": [len(elements)],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    return head + blob, len(head)
