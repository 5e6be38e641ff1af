"""A fine-tuned LoRA adapter served on its base endpoint, as ``NAME:ADAPTER``.

The endpoint's replicas load the adapters its model card names
(:mod:`gpulab.serving.llm_export`), so an adapter joins by a new version of the
endpoint: the stable version's model folder with the adapter added under
``adapters/<name>/`` and named in ``model.json``, deployed beside it as a canary
(the same checks as any upload; its lineage names the training job), promoted
once a replica of it is ready. The old version stops after its calls are
answered; every adapter it served is served by the new one, and the base answers
as before. Nothing answers as the new model id until it can be called.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import tempfile
import time

from gpulab.scheduler.budget import BudgetExceeded
from gpulab.service.endpoints.settings import DeployRefused

#: Files an adapter folder holds (what the archive check and the replica ask for).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: How long a new version may take to have a ready replica before the job fails.
READY_TIMEOUT_S = 900.0


class PublishFailed(Exception):
    """The adapter could not be served; the message says why and what to do."""


def pack_with_adapter(model_dir: str, adapter: str, files: dict[str, bytes], tar_path: str) -> None:
    """A model archive of ``model_dir`` (a causal LM's card, ``hf/``, its adapters)
    with ``adapter`` (``files``: its two files) added."""
    with open(os.path.join(model_dir, "model.json")) as f:
        card = json.load(f)
    card["adapters"] = sorted({*(card.get("adapters") or []), adapter})
    with tarfile.open(tar_path, "w:gz", compresslevel=1) as tar:
        data = json.dumps(card, indent=2).encode()
        info = tarfile.TarInfo("model.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for top in ("hf", "adapters"):
            root = os.path.join(model_dir, top)
            for dirpath, _, names in os.walk(root):
                for name in sorted(names):
                    path = os.path.join(dirpath, name)
                    if os.path.isfile(path) and not os.path.islink(path):
                        tar.add(path, arcname=os.path.relpath(path, model_dir))
        for name in ADAPTER_FILES:
            info = tarfile.TarInfo(f"adapters/{adapter}/{name}")
            info.size = len(files[name])
            tar.addfile(info, io.BytesIO(files[name]))


async def serve_adapter(
    deployments,
    who,
    dep: dict,
    adapter: str,
    files: dict,
    job_id: str,
    *,
    refuse_over_budget=None,
):
    """Add ``adapter`` to ``dep`` (a new version, promoted once ready) for ``who``,
    its owner; ``job_id``: the training job, the version's lineage.
    ``refuse_over_budget(user, gpu_milli)``: the GPU-hour budget's check that
    ``POST /deployments`` makes of a new version, made here too (the version holds a
    GPU as any other); None: no budgets."""
    versions = deployments.store.versions(dep["id"])
    stable = versions[0]
    if len(versions) > 1:
        raise PublishFailed(
            f"{dep['name']} has a canary (version {versions[1]['version']}); promote it or "
            f"roll it back (%deploy --promote/--rollback {dep['name']}), then fine-tune again"
        )
    model_dir = deployments.serving.model_dir(stable["id"])
    if adapter in _adapters(model_dir):
        return  # served already (a service restarted after promoting, before it noted so)
    if refuse_over_budget is not None:
        try:
            # The canary takes its deployment's slice, as POST /deployments reads it.
            await refuse_over_budget(who.name, dep.get("gpu_milli") or 0)
        except BudgetExceeded as e:
            raise PublishFailed(f"the adapter could not join {dep['name']}: {e}") from None
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = os.path.join(tmp, "model.tar.gz")
        await asyncio.to_thread(pack_with_adapter, model_dir, adapter, files, tar_path)
        settings = {"name": dep["name"], "canary": 1, "lineage": {"job": {"id": job_id}}}
        try:
            await deployments.create(who, settings, tar_path)
        except DeployRefused as e:
            raise PublishFailed(f"the adapter could not join {dep['name']}: {e}") from None
    new = deployments.store.versions(dep["id"])[-1]
    await _until_ready(deployments, dep, new)
    try:
        await deployments.versions.promote(deployments.store.get(dep["id"]))
    except DeployRefused as e:
        raise PublishFailed(f"version {new['version']} of {dep['name']}: {e}") from None


def _adapters(model_dir: str) -> list[str]:
    try:
        with open(os.path.join(model_dir, "model.json")) as f:
            return list(json.load(f).get("adapters") or [])
    except (OSError, ValueError, AttributeError):
        return []


async def _until_ready(deployments, dep: dict, vrow: dict) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        current = deployments.store.version(vrow["id"])
        if current is None:
            raise PublishFailed(f"version {vrow['version']} of {dep['name']} was stopped")
        if current["state"] == "failed":
            raise PublishFailed(
                f"version {vrow['version']} of {dep['name']} with the adapter failed: "
                f"{current['message']}"
            )
        unit = deployments.live.unit(dep["id"], vrow["id"])
        if unit is not None and unit.ready > 0:
            return
        if time.monotonic() > deadline:
            raise PublishFailed(
                f"version {vrow['version']} of {dep['name']} had no ready replica after "
                f"{READY_TIMEOUT_S:.0f} s ({current['message']})"
            )
        await asyncio.sleep(0.5)
