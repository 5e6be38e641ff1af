"""Run a JobSpec with the local backend, no service: the backend tests' harness."""

from __future__ import annotations

import asyncio
import uuid

import torch
from support.wait import wait_until_async

from gpulab.backend.local import LocalBackend
from gpulab.backend.spec import JobSpec


def new_spec(code: str, **fields) -> JobSpec:
    spec = JobSpec(code=code, **fields)
    spec.id = spec.id or uuid.uuid4().hex[:12]
    spec.user = spec.user or "tester"
    spec.validate()
    return spec


def prepare(backend: LocalBackend, spec: JobSpec):
    jd = backend.jobdir(spec.id)
    spec.checkpoint_dir = jd.p("checkpoints")
    jd.write_inputs(spec)
    return jd


async def wait(backend: LocalBackend, spec: JobSpec, timeout: float = 300, on_tick=None):
    async def ended():
        status = await backend.poll(spec)
        if status.state != "running":
            return status
        if on_tick is not None:
            on_tick()
        return None

    try:
        return await wait_until_async(ended, f"job {spec.id} to end", timeout, every=0.1)
    except AssertionError:
        await backend.cancel(spec)
        raise


def run(backend: LocalBackend, spec: JobSpec, timeout: float = 300, on_tick=None):
    """Start, wait, return (status, job dir)."""
    jd = prepare(backend, spec)

    async def go():
        await backend.start(spec, [])
        return await wait(backend, spec, timeout, on_tick)

    return asyncio.run(go()), jd


def weights(jd) -> dict:
    return torch.load(jd.p("out", "state_dict.pt"))
