"""Cordoned GPUs: placement passes them by, the inventory and metrics show them, and
only admins cordon and uncordon (the real service in-process, a stand-in hub API)."""

import asyncio

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support.service import PREFIX, running_service

from gpulab.db.engine import make_engine
from gpulab.scheduler.inventory import Gpu, parse_simulated
from gpulab.scheduler.ledger import Ledger, NoCapacity, UnknownGpu
from gpulab.scheduler.policy import get_policy
from gpulab.spawner.form import render_form


def make_ledger(tmp_path, gpus):
    return Ledger(make_engine(f"sqlite:///{tmp_path}/ledger.sqlite"), gpus, get_policy("gpulab"))


def test_no_placement_chooses_a_cordoned_gpu(tmp_path):
    gpus = parse_simulated("3xA100-80GB", node="n1")
    ledger = make_ledger(tmp_path, gpus)
    kept = ledger.allocate("alice", "server", "alice/", 250)[0]["gpu_uuid"]
    cordon, made = ledger.cordon(kept, "XID 79 (GPU has fallen off the bus)", "gpulab")
    assert made and cordon["by"] == "gpulab" and cordon["since"].endswith("Z")
    assert ledger.cordon(kept, "another reason", "admin") == (cordon, False)  # the first stays

    # What it holds stays; nothing new goes there, however small.
    assert [a["gpu_uuid"] for a in ledger.list()] == [kept]
    for n in range(4):
        assert ledger.allocate("bob", "server", f"bob{n}/", 250)[0]["gpu_uuid"] != kept
    gang = ledger.allocate_gang("carol", "job", [("j/0", 0), ("j/1", 1000)])
    assert {r["gpu_uuid"] for r in gang} - {kept} == {r["gpu_uuid"] for r in gang}
    assert {f["milli"]: f["count"] for f in ledger.free_sizes([250, 1000])["n1"]} == {
        250: 0,
        1000: 0,
    }
    [size] = ledger.availability("dave", [1000])
    assert size.count == 0
    assert "1 of 3 GPUs cordoned" in size.reason
    with pytest.raises(NoCapacity, match="1 cordoned GPU"):
        ledger.allocate("dave", "server", "dave/", 250)

    assert ledger.uncordon(kept)["reason"].startswith("XID 79")
    assert ledger.uncordon(kept) is None
    assert ledger.allocate("dave", "server", "dave/", 500)[0]["gpu_uuid"] == kept
    with pytest.raises(UnknownGpu):
        ledger.cordon("GPU-nope", "x", "admin")


def test_cordoning_a_mig_parent_cordons_its_devices(tmp_path):
    gpus = [
        Gpu("MIG-a", 0, "A100 MIG", 20 * 1024, "n1", mig_parent="GPU-parent"),
        Gpu("MIG-b", 1, "A100 MIG", 20 * 1024, "n1", mig_parent="GPU-parent"),
        Gpu("GPU-other", 2, "A100", 40 * 1024, "n1"),
    ]
    ledger = make_ledger(tmp_path, gpus)
    ledger.cordon("GPU-parent", "2 uncorrectable ECC errors", "gpulab")
    placed = {ledger.allocate("u", "server", f"u{n}/", 500)[0]["gpu_uuid"] for n in range(2)}
    assert placed == {"GPU-other"}
    assert ledger.cordons()["GPU-parent"]["node"] == "n1"


def gpus_of(inventory):
    return {g["uuid"]: g for n in inventory["nodes"] for g in n["gpus"]}


def cordoned_series(text):
    for family in text_string_to_metric_families(text):
        if family.name == "gpulab_gpu_cordoned":
            return {s.labels["UUID"]: s.value for s in family.samples}
    return None


async def test_admins_cordon_and_uncordon_through_the_api(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        user = svc.create_user("alice")
        first, second = (g.uuid for g in svc.app.gpus)
        inventory = (await svc.request("GET", "/inventory", token=user)).json()
        assert [g["cordoned"] for g in gpus_of(inventory).values()] == [None, None]

        # Who may: admins; users are refused, strangers are not identified.
        path = f"/gpus/{first}/cordon"
        r = await svc.request("POST", path, token=user, json={"reason": "mine now"})
        assert r.status_code == 403 and "only admins" in r.json()["error"]
        r = await svc.request("POST", path, anonymous=True, json={"reason": "x"})
        assert r.status_code in (401, 403), r.text
        r = await svc.request("POST", f"/gpus/{second}/uncordon", token=user)
        assert r.status_code == 403
        r = await svc.request("POST", "/gpus/GPU-nope/cordon", json={"reason": "x"})
        assert r.status_code == 404 and "GET /api/v1/inventory" in r.json()["error"]
        assert (await svc.request("POST", "/gpus/GPU-nope/uncordon")).status_code == 404
        r = await svc.request("POST", path, json={})
        assert r.status_code == 400 and "'reason'" in r.json()["error"]

        r = await svc.request("POST", path, json={"reason": "RMA: fan failure"})
        assert r.status_code == 200, r.text
        cordon = r.json()["cordoned"]
        assert (cordon["reason"], cordon["by"]) == ("RMA: fan failure", "admin")
        assert r.json()["changed"] is True
        shown = gpus_of((await svc.request("GET", "/inventory", token=user)).json())
        assert shown[first]["cordoned"] == cordon and shown[second]["cordoned"] is None

        # The spawn form's answer counts only the healthy GPU.
        available = (await svc.request("GET", "/availability", token=user)).json()
        assert {s["milli"]: s["count"] for s in available["sizes"]}[1000] == 1
        assert available["cordoned"] == [
            {"uuid": first, "index": 0, "node": svc.app.inventory_settings.node_name, **cordon}
        ]
        form = render_form(available, demo=False)
        assert "1 GPU out of service (cordoned)" in form and "RMA: fan failure" in form
        r = await svc.request(
            "POST",
            "/allocations",
            json={"user": "alice", "owner_kind": "server", "owner": "alice/", "gpu_milli": 1000},
        )
        assert r.status_code == 201 and r.json()[0]["gpu_uuid"] == second

        metrics = await asyncio.to_thread(
            requests.get, f"{svc.url}{PREFIX}metrics", headers=svc.auth(user), timeout=30
        )
        assert metrics.status_code == 200, metrics.text
        metrics = metrics.text
        assert cordoned_series(metrics) == {first: 1.0, second: 0.0}

        r = await svc.request("POST", f"/gpus/{first}/uncordon")
        assert r.status_code == 200 and r.json()["was"] == cordon and r.json()["changed"]
        again = await svc.request("POST", f"/gpus/{first}/uncordon")
        assert again.status_code == 200 and again.json()["changed"] is False
        shown = gpus_of((await svc.request("GET", "/inventory")).json())
        assert shown[first]["cordoned"] is None

        if getattr(svc.app, "audit", None) is not None:  # the audit trail records both
            r = await svc.request("GET", "/audit", params={"action": "gpu.*"})
            done = [(e["action"], e["subject"], e["result"]) for e in r.json()["entries"]]
            assert ("gpu.cordon", first, "ok") in done
            assert ("gpu.uncordon", first, "ok") in done
            assert ("gpu.cordon", first, "denied") in done  # alice's attempt
