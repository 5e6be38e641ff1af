"""Fixtures: small exported models and real model-server subprocesses on free ports."""

import os
import queue
import subprocess
import sys
import threading

import pytest
import torch

from gpulab.serving.export import export_model

START_TIMEOUT_S = 120  # a loaded 2-core machine imports torch slowly; a bound, not a sleep


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()


def heavy_mlp() -> torch.nn.Module:
    """Enough work per 256-row request that a burst of requests outruns the model."""
    torch.manual_seed(1)
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


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
        if not line or "listening on http://" not in line:
            self.stop()
            raise RuntimeError(f"model server did not start: {line!r}\n{''.join(self.stderr)}")
        self.url = line.rsplit("http://", 1)[1].strip()
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


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_mlp()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("models")
    tiny = os.path.join(root, "tiny")
    heavy = os.path.join(root, "heavy")
    export_model(tiny_model, torch.randn(4, 16), tiny, name="tiny")
    export_model(heavy_mlp(), torch.randn(4, 512), heavy, name="heavy")
    return {"tiny": tiny, "heavy": heavy}


@pytest.fixture(scope="session")
def servers(model_dirs):
    """Both servers start together (imports overlap), stop at the end of the session.

    * ``batching``: tiny model, batches up to 8 rows, a request waits up to 200 ms
      for company — a wide window so concurrent requests meet even on a busy machine.
    * ``overload``: heavy model, no waiting, room for 2 queued requests — a burst
      of large requests fills it.
    """
    procs = {
        "batching": ServerProcess(
            model_dirs["tiny"],
            "--max-batch-size",
            "8",
            "--max-latency-ms",
            "200",
            "--max-queue",
            "64",
        ),
        "overload": ServerProcess(
            model_dirs["heavy"],
            "--max-batch-size",
            "256",
            "--max-latency-ms",
            "0",
            "--max-queue",
            "2",
        ),
    }
    try:
        for p in procs.values():
            p.wait_listening()
        yield procs
    finally:
        for p in procs.values():  # SIGTERM both first: they exit in parallel
            if p.alive():
                p.proc.terminate()
        for p in procs.values():
            p.wait_stopped()


@pytest.fixture
def start_server():
    """``start_server(model_dir, *flags)``: a model server process on a model directory,
    as a replica runs it, listening when returned; stopped when the test ends."""
    started: list[ServerProcess] = []

    def start(model_dir: str, *flags: str) -> ServerProcess:
        server = ServerProcess(model_dir, *flags)
        started.append(server)
        server.wait_listening()
        return server

    yield start
    for server in started:
        server.stop()
