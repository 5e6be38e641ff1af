"""The gpulab page (``/services/gpulab/``) with the real service in-process: the hub's
look (JupyterHub's page.html, styles from ``/hub/static/``), allocations by name (a
server, a real torchrun job, a real model-server deployment), relative times, and who
sees what. The hub's REST API is the stand-in of tests/support/service.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import re

import pytest
import requests
import torch
from support.service import PREFIX, running_service
from support.wait import wait_until_async

from gpulab.client.base import AsyncClient
from gpulab.service.api.page_views import ago
from gpulab.serving.export import export_model

#: Ranks and replicas run as the service's own account (no per-user accounts in tmp).
CONFIG = "c.UserAccounts.enabled = False\n"
WAIT_S = 180  # a bound on a loaded 2-core machine, not a sleep
#: A job that keeps its slice until cancelled.
SLEEPS = """
import time
from gpulab.training import setup, report
ctx = setup()
for step in range(100000):
    time.sleep(0.2)
    report(step=step)
"""


async def until(check, what: str):
    return await wait_until_async(check, what, WAIT_S, every=0.3)


async def page(svc, token: str) -> str:
    r = await asyncio.to_thread(
        requests.get, f"{svc.url}{PREFIX}", headers=svc.auth(token), timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/html")
    return r.text


def test_relative_times():
    now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    assert ago("2026-12-01T11:57:00+00:00", now)["text"] == "3 min ago"
    assert ago("2026-12-01T11:59:50+00:00", now)["text"] == "just now"
    assert ago("2026-12-01T09:00:00+00:00", now)["text"] == "3 h ago"
    assert ago("2026-11-29T12:00:00", now) == {
        "text": "2 days ago",
        "iso": "2026-11-29T12:00:00+00:00",
    }


@pytest.mark.asyncio
async def test_page_lists_everything_by_name_in_the_hubs_look(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    model_dir = tmp_path / "model"
    export_model(model.eval(), torch.randn(2, 4), str(model_dir), name="m", max_batch_size=4)
    async with running_service(tmp_path / "svc", CONFIG) as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        r = await svc.request(
            "POST",
            "/allocations",
            json={"user": "alice", "owner_kind": "server", "owner": "alice/", "gpu_milli": 250},
        )
        assert r.status_code == 201, r.text
        r = await svc.request(
            "POST",
            "/jobs",
            token=alice,
            json={"code": SLEEPS, "name": "sleepy-train", "gpu_milli": 100},
        )
        assert r.status_code == 201, r.text
        job = r.json()
        client = AsyncClient(svc.api, token=alice)
        try:
            dep = await client.create_deployment(
                str(model_dir), {"name": "tiny-linear", "gpu_milli": 100}
            )

            async def placed():
                mine = (await svc.request("GET", "/allocations", token=alice)).json()
                kinds = {a["owner_kind"] for a in mine}
                return mine if kinds == {"server", "job", "deployment"} else None

            allocations = await until(placed, "a server, a job and a deployment placed")
            raw_owners = [a["owner"] for a in allocations if a["owner_kind"] != "server"]

            html = await page(svc, alice)
            # JupyterHub's own page: its styles and navigation bar, served by the hub.
            assert 'href="/hub/static/css/style.min.css"' in html
            assert 'class="navbar' in html and 'href="/hub/home"' in html
            assert "admin" not in re.findall(r'href="/hub/(\w+)"', html)  # alice is no admin
            # Allocations by name, in fractions; never the ledger's owner ids.
            assert "alice&#39;s server" in html
            assert "job sleepy-train (rank 0)" in html
            assert "tiny-linear version 1 (replica 0)" in html
            for owner in raw_owners:
                assert f">{owner}<" not in html
            assert "1/4 GPU" in html and "1/10 GPU" in html and "milli" not in html
            # Jobs and endpoints with their state, owner, submitted time and URL.
            assert f'id="job-{job["id"]}"' in html and "sleepy-train" in html
            assert f'id="endpoint-{dep["id"]}"' in html
            assert "/services/gpulab/endpoints/alice/tiny-linear</code>" in html
            # Relative times, the full time in the title.
            times = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', html)
            assert times and all(d == t and dt.datetime.fromisoformat(d) for d, t, _ in times)
            recent = {"just now", "1 min ago", "2 min ago", "3 min ago"}
            assert {text for _, _, text in times} <= recent

            # Bob sees the GPUs, but none of alice's things.
            other = await page(svc, bob)
            assert "sleepy-train" not in other and "tiny-linear" not in other
            assert "alice&#39;s server" not in other and "A100-80GB" in other

            # The admin sees everyone's, and the hub's Admin link.
            everyone = await page(svc, svc.admin_token)
            assert "alice&#39;s server" in everyone and "tiny-linear version 1" in everyone
            assert 'href="/hub/admin"' in everyone
            assert 'id="shared"' not in everyone  # everything is listed above already

            # Shared with bob: his page lists it under "Shared with you"; carol's does not.
            carol = svc.create_user("carol")
            assert 'id="shared"' in other and f'id="shared-{dep["id"]}"' not in other
            r = await svc.request(
                "PATCH", "/deployments/tiny-linear", token=alice, json={"share_users": ["bob"]}
            )
            assert r.status_code == 200, r.text
            shared = await page(svc, bob)
            row = re.search(rf'<tr id="shared-{dep["id"]}">(.*?)</tr>', shared, re.S)
            assert row and "tiny-linear" in row.group(1) and "alice" in row.group(1)
            assert "/services/gpulab/endpoints/alice/tiny-linear</code>" in row.group(1)
            assert "sleepy-train" not in shared  # only the endpoint, not alice's other things
            assert f'id="shared-{dep["id"]}"' not in await page(svc, carol)
            # Alice's own row says with whom, and carries the share form.
            mine = await page(svc, alice)
            cell = re.search(r'<td class="gpulab-shared-with">(.*?)</td>', mine, re.S).group(1)
            assert "bob" in cell and "Share…" in cell
            assert 'data-name="tiny-linear" data-user="alice"' in mine
            assert re.search(r'xsrf_token: "[^"]+"', mine)  # what the form sends back

        finally:
            # Ranks and replicas run in sessions of their own: stop them, also after
            # a failed assertion.
            await svc.request("DELETE", f"/jobs/{job['id']}", token=alice)
            await svc.request("DELETE", "/deployments/tiny-linear", token=alice)
