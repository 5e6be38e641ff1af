"""One ``kubernetes_asyncio`` client per backend, made when the cluster is first needed.

Importing gpulab loads no kubeconfig: :class:`ApiClientHolder` imports
``kubernetes_asyncio`` and reads the kubeconfig (or the pod's in-cluster
account) on the first :meth:`~ApiClientHolder.api` call.
"""

from __future__ import annotations

import asyncio


class ApiClientHolder:
    kubeconfig: str | None = None
    _client = None
    _client_lock: asyncio.Lock | None = None

    async def api(self):
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:  # two first callers must not make two clients
            if self._client is None:
                from kubernetes_asyncio import client, config

                if self.kubeconfig:
                    self._client = await config.new_client_from_config(config_file=self.kubeconfig)
                else:
                    config.load_incluster_config()
                    self._client = client.ApiClient()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
