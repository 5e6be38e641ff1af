"""Work on a real hub for tests of its lifecycle (Ctrl-C, a killed hub): a user's server,
a job and an endpoint, and what of them runs on the host."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import psutil
import requests
import torch
from support.wait import wait_until

from gpulab.client import Client
from gpulab.serving.export import export_model

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def model_dir(tmp_path: Path) -> str:
    torch.manual_seed(0)
    path = tmp_path / "model"
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    export_model(model, torch.randn(2, 4), str(path), name="ignored", max_batch_size=8)
    return str(path)


def deploy(hub, token: str, tmp_path: Path, name: str, gpu_milli: int = 100) -> dict:
    """Deploy a small model as ``name`` and wait until its replica is ready."""
    dep = Client(hub.api, token=token).create_deployment(
        model_dir(tmp_path), {"name": name, "gpu_milli": gpu_milli}
    )
    wait_until(lambda: ready_replicas(hub, token, name) == 1, f"{name}'s replica ready")
    return dep


def ready_replicas(hub, token: str, name: str) -> int:
    return hub.gpulab("GET", f"/deployments/{name}", token=token).json().get("replicas_ready", 0)


def infer(hub, token: str, user: str, name: str) -> requests.Response:
    url = f"{hub.url}/services/gpulab/endpoints/{user}/{name}/v2/models/{name}/infer"
    return requests.post(url, json=BODY, headers=hub.auth(token), timeout=60, verify=hub.verify)


def server_processes(hub) -> list[psutil.Process]:
    """Processes started for the hub's users: servers, ranks, replicas (HOME under the
    data dir's homes)."""
    found = []
    for p in psutil.process_iter(["environ"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if (p.info["environ"] or {}).get("HOME", "").startswith(str(hub.data_dir / "home")):
                found.append(p)
    return found


def rank_pids(hub, job_id: str) -> list[int]:
    folder = hub.data_dir / "jobs" / job_id / "pids"
    return sorted(json.loads(p.read_text())["pid"] for p in folder.glob("rank*.json"))
