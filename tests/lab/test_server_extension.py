"""The server extension (gpulab.lab) in a real jupyter_server, against the real
gpulab service (in-process, with its stand-in hub API: tests/support/service.py).

What the browser relies on: the slice in words, the proxy to the service with this
server's token (and nothing of the caller's), jupyter_server's login in front of
both, and short JSON errors when the service is down or slow.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import requests
from hubproc import free_port
from support.jupyter_server import SERVER_TOKEN, jupyter_server
from support.service import running_service

from gpulab.enforcement.slice_env import slice_env

pytestmark = pytest.mark.slow


async def get(url, path, token=SERVER_TOKEN, **kw):
    headers = {"Authorization": f"token {token}"} if token else {}
    return await asyncio.to_thread(
        requests.request, kw.pop("method", "GET"), f"{url}{path}", headers=headers, timeout=60, **kw
    )


async def test_slice_and_proxy_through_a_real_jupyter_server(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        svc.create_user("bob")
        slices = {}
        for user in ("alice", "bob"):
            r = await svc.request(
                "POST",
                "/allocations",
                json={"user": user, "owner_kind": "server", "owner": f"{user}/", "gpu_milli": 250},
            )
            assert r.status_code in (200, 201), r.text
            slices[user] = r.json()
        env = slice_env(
            slices["alice"] if isinstance(slices["alice"], list) else [slices["alice"]],
            simulated=True,
            mps_dir=None,
        )
        env.update(GPULAB_API_URL=svc.api, JUPYTERHUB_API_TOKEN=alice)
        with jupyter_server(tmp_path / "alice", env, "--GpuLabLab.max_body_bytes=1000") as url:
            activity = (await get(url, "/api/status")).json()["last_activity"]

            # The slice, in the words of the status bar.
            r = await get(url, "/gpulab/slice")
            assert r.status_code == 200, r.text
            s = r.json()
            assert s["text"] == "1/4 A100-80GB · 20 GiB · simulated", s
            assert s["model"] == "A100-80GB" and s["milli"] == 250
            assert s["memory_used_mib"] is None and "simulated" in s["memory_note"]

            # Nobody without this server's login gets in: no token, a wrong one, or
            # another user's hub token (which only the service would know).
            for token in (None, "wrong", alice):
                for path in ("/gpulab/slice", "/gpulab/api/v1/allocations"):
                    r = await get(url, path, token=token)
                    assert r.status_code == 403, (token, path, r.status_code, r.text)

            # The proxy asks as alice: the service shows her slice, not bob's.
            r = await get(url, "/gpulab/api/v1/allocations")
            assert r.status_code == 200, r.text
            assert {a["user"] for a in r.json()} == {"alice"}
            r = await get(url, "/gpulab/api/v1/allocations?user=bob")
            assert r.status_code == 403 and "error" in r.json(), r.text

            # Status codes and the service's JSON errors pass through.
            r = await get(url, "/gpulab/api/v1/jobs/no-such-job")
            assert r.status_code == 404 and r.json()["error"], r.text

            # A path cannot climb out of the service's /api/v1/.
            r = await get(url, "/gpulab/api/v1/..%2F..%2F..%2Fhub%2Fapi%2Fusers")
            assert r.status_code == 400 and "not a gpulab API path" in r.json()["error"]

            # The status bar's and the panel's polling (GETs) is not the user at work:
            # it must not keep the server from being culled as idle.
            assert (await get(url, "/api/status")).json()["last_activity"] == activity
            # Nor is the service's idle probe.
            assert (await get(url, "/gpulab/activity")).status_code == 200
            assert (await get(url, "/api/status")).json()["last_activity"] == activity

            # Bodies are bounded.
            r = await get(url, "/gpulab/api/v1/jobs", method="POST", data=b"{" + b" " * 2000 + b"}")
            assert r.status_code == 413 and "1000 bytes" in r.json()["error"], r.text
            # A POST is something the user did.
            assert (await get(url, "/api/status")).json()["last_activity"] != activity

        # The service gone: 502, in words, with the fix.
        down = {**env, "GPULAB_API_URL": f"http://127.0.0.1:{free_port()}/services/gpulab/api/v1"}
        with jupyter_server(tmp_path / "down", down) as url:
            r = await get(url, "/gpulab/api/v1/jobs")
            assert r.status_code == 502, r.text
            assert "is the hub running?" in r.json()["error"]
            s = (await get(url, "/gpulab/slice")).json()
            # The slice is still known from the environment, only the model is missing.
            assert s["text"] == "1/4 GPU · 20 GiB · simulated", s
            assert "unreachable" in s["service_problem"]

    # A service that takes the connection and never answers: 504 after the timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        slow = {**env, "GPULAB_API_URL": f"http://127.0.0.1:{silent.getsockname()[1]}/api/v1"}
        with jupyter_server(tmp_path / "slow", slow, "--GpuLabLab.request_timeout=2") as url:
            r = await get(url, "/gpulab/api/v1/jobs")
            assert r.status_code == 504, r.text
            assert "did not answer within 2 s" in r.json()["error"]


def test_pyproject_ships_the_prebuilt_extension():
    """A wheel carries the built labextension and the server extension's switch."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    tool = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "labextension/static/*" in tool["package-data"]["gpulab.lab"]
    data = tool["data-files"]
    assert data["share/jupyter/labextensions/@gpulab/lab/static"] == ["lab/labextension/static/*"]
    assert data["etc/jupyter/jupyter_server_config.d"] == ["lab/jupyter-config/gpulab.json"]


READ_ONLY_AUTHORIZER = '''
from jupyter_server.auth.authorizer import Authorizer


class ReadOnly(Authorizer):
    """A site's granular permissions: this caller may read, not act."""

    def is_authorized(self, handler, user, action, resource):
        return action == "read"
'''


async def test_a_read_only_sharer_cannot_act_through_the_proxy(tmp_path):
    """The proxy acts with the owner's token: where the site's authorizer gives a
    server's sharers read-only access (JupyterHub's granular permissions), they read
    through it but cannot submit, cancel or delete."""
    (tmp_path / "authz").mkdir()
    (tmp_path / "authz" / "read_only_authorizer.py").write_text(READ_ONLY_AUTHORIZER)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        env = {
            "GPULAB_API_URL": svc.api,
            "JUPYTERHUB_API_TOKEN": alice,
            "PYTHONPATH": str(tmp_path / "authz"),
        }
        authz = "--ServerApp.authorizer_class=read_only_authorizer.ReadOnly"
        with jupyter_server(tmp_path / "alice", env, authz) as url:
            assert (await get(url, "/gpulab/api/v1/jobs")).status_code == 200
            assert (await get(url, "/gpulab/slice")).status_code == 200
            job = {"code": "print(1)", "gpu_milli": 0}
            r = await get(url, "/gpulab/api/v1/jobs", method="POST", json=job)
            assert r.status_code == 403, r.text
            r = await get(url, "/gpulab/api/v1/jobs/x", method="DELETE")
            assert r.status_code == 403, r.text
        assert (await svc.request("GET", "/jobs", token=alice)).json() == []
