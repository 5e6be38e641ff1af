"""Python client of the gpulab service (async inside, sync face for notebooks)."""

from .base import AsyncClient, Client, GpuLabError, run_sync

__all__ = ["AsyncClient", "Client", "GpuLabError", "run_sync"]
