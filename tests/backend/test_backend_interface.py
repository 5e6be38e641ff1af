"""The job backends' one interface (backend/base.py): every hook declared there, with
one signature, and what a backend can do said by attributes, not by its class."""

from __future__ import annotations

import inspect

import pytest

from gpulab.backend.base import Backend
from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.local import LocalBackend
from gpulab.backend.slurm import SlurmBackend

BACKENDS = (LocalBackend, SlurmBackend, KubernetesBackend)
HOOKS = ("check", "start", "poll", "reattach", "cancel", "preempt", "resize", "close")


@pytest.mark.parametrize("cls", BACKENDS, ids=lambda c: c.name)
def test_each_hook_has_the_signature_the_base_declares(cls):
    for hook in HOOKS:
        assert hook in vars(Backend), f"Backend declares no {hook}"
        want = list(inspect.signature(getattr(Backend, hook)).parameters)
        got = list(inspect.signature(getattr(cls, hook)).parameters)
        assert got == want, f"{cls.__name__}.{hook}{got} is not Backend.{hook}{want}"


def test_what_a_backend_can_do_is_declared():
    assert [c.runs_on_this_host for c in BACKENDS] == [True, False, False]
    assert [c.can_resize_in_place for c in BACKENDS] == [False, False, True]


async def test_the_base_resize_says_it_cannot_and_close_holds_nothing():
    backend = Backend.__new__(Backend)
    assert await backend.resize(None, 2, []) is False
    assert await backend.close() is None


async def test_closing_the_kubernetes_backend_closes_its_client():
    """Backend's close comes before the client holder's in its bases: the override
    must reach the client."""

    class Client:
        closed = False

        async def close(self):
            self.closed = True

    backend = KubernetesBackend.__new__(KubernetesBackend)
    client = backend._client = Client()
    await backend.close()
    assert client.closed and backend._client is None
