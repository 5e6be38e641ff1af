"""Model endpoints through the service (``/deployments``): the calls ``%deploy`` makes.

A mixin of :class:`~.base.AsyncClient`; the sync :class:`~.base.Client` has the
same methods, blocking.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import aiohttp

#: A language model's Hugging Face folder inside its archive (gpulab.serving.llm_export).
HF_FOLDER = "hf"
#: Its LoRA adapters, ``adapters/<name>/`` each.
ADAPTERS_FOLDER = "adapters"


def pack_model_dir(model_dir: str) -> bytes:
    """A tar (gzip) of an exported model directory (model.json and model.pt2, an
    embedding model's model.st.tar, or a language model's Hugging Face folder ``hf/``
    and its LoRA adapters ``adapters/<name>/``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for name in ("model.pt2", "model.st.tar", "model.json"):
            if name == "model.json" or os.path.exists(os.path.join(model_dir, name)):
                tar.add(os.path.join(model_dir, name), arcname=name)
        hf = os.path.join(model_dir, HF_FOLDER)
        if os.path.isdir(hf):
            # Regular files only, by relative name: what the service's unpack accepts.
            for name in sorted(os.listdir(hf)):
                path = os.path.join(hf, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    tar.add(path, arcname=f"{HF_FOLDER}/{name}")
        adapters = os.path.join(model_dir, ADAPTERS_FOLDER)
        if os.path.isdir(adapters):
            # Its LoRA adapters: adapters/<name>/<file>, regular files one level down.
            for adapter in sorted(os.listdir(adapters)):
                folder = os.path.join(adapters, adapter)
                if not os.path.isdir(folder) or os.path.islink(folder):
                    continue
                for name in sorted(os.listdir(folder)):
                    path = os.path.join(folder, name)
                    if os.path.isfile(path) and not os.path.islink(path):
                        tar.add(path, arcname=f"{ADAPTERS_FOLDER}/{adapter}/{name}")
    return buf.getvalue()


class DeploymentsMixin:
    def endpoint_url(self, deployment: dict) -> str:
        """The endpoint's full URL: the hub's origin and the deployment's path."""
        origin = (
            self.api_url.split("/services/", 1)[0] if "/services/" in self.api_url else self.api_url
        )
        return origin + deployment["path"]

    async def create_deployment(self, model_dir: str, settings: dict) -> dict:
        """Upload an exported model and start it (``settings``: name, replicas,
        gpu_milli, max_batch_size, max_latency_ms, max_queue, share_users, ...)."""
        form = aiohttp.FormData()
        form.add_field("spec", json.dumps(settings), content_type="application/json")
        form.add_field(
            "model",
            pack_model_dir(model_dir),
            filename="model.tar.gz",
            content_type="application/gzip",
        )
        return await self.request("POST", "/deployments", form=form)

    async def list_deployments(self, user: str | None = None) -> list[dict]:
        return await self.request("GET", "/deployments", query={"user": user})

    async def get_deployment(self, name: str, user: str | None = None) -> dict:
        return await self.request("GET", f"/deployments/{name}", query={"user": user})

    async def share_deployment(self, name: str, user: str | None = None, **sharing) -> dict:
        """Change ``share_users``, ``share_groups`` or ``stop_with_server``."""
        return await self.request(
            "PATCH", f"/deployments/{name}", body=sharing, query={"user": user}
        )

    async def stop_deployment(self, name: str, user: str | None = None) -> dict:
        return await self.request("DELETE", f"/deployments/{name}", query={"user": user})

    async def deployment_logs(
        self, name: str, replica: int = 0, user: str | None = None, version: int | None = None
    ) -> str:
        """A replica's log (of ``version``; default: the stable one)."""
        data = await self.read_bytes(
            f"/deployments/{name}/logs", {"replica": replica, "user": user, "version": version}
        )
        return data.decode(errors="replace")

    async def promote_deployment(self, name: str, user: str | None = None) -> dict:
        """The canary takes every call; the old version stops."""
        return await self.request("POST", f"/deployments/{name}/promote", query={"user": user})

    async def rollback_deployment(self, name: str, user: str | None = None) -> dict:
        """The stable version takes every call again; the canary stops."""
        return await self.request("POST", f"/deployments/{name}/rollback", query={"user": user})

    async def models(self) -> list[dict]:
        """The catalog: every endpoint you may call (yours and those shared with you)."""
        return await self.request("GET", "/models")
