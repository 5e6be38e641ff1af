"""The audit trail on the real service (in-process, a stand-in hub API): each change a
route makes is one entry with the right actor and owner, refusals are ``denied``,
users read only their own entries, filters and the JSON-lines export work, the hub's
events come in only with the service's token, and old entries are pruned."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest
import torch
from support.service import running_service

from gpulab.client.deployments import pack_model_dir
from gpulab.service.operations.audit import client_source
from gpulab.serving.export import export_model


async def entries(svc, token=None, **params) -> list[dict]:
    r = await svc.request("GET", "/audit", token=token, params=params)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def only(rows: list[dict], **match) -> dict:
    found = [e for e in rows if all(e[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, rows)
    return found[0]


@pytest.fixture(scope="module")
def model_tar(tmp_path_factory) -> bytes:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    path = tmp_path_factory.mktemp("audit-model")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="m", max_batch_size=4)
    return pack_model_dir(str(path))


async def test_each_change_is_one_entry_with_its_actor_and_owner(tmp_path, model_tar):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        svc.create_user("bob")

        # An admin allocates for alice and releases it (a ledger repair).
        body = {"user": "alice", "owner_kind": "job", "owner": "by-hand/0", "gpu_milli": 250}
        assert (await svc.request("POST", "/allocations", json=body)).status_code == 201
        # A retry (the spawner lost the answer) gets the same rows: not a second change.
        assert (await svc.request("POST", "/allocations", json=body)).status_code == 201
        # alice may not allocate directly: a denied attempt.
        r = await svc.request("POST", "/allocations", token=alice, json=body)
        assert r.status_code == 403
        r = await svc.request(
            "DELETE", "/allocations", params={"owner_kind": "job", "owner": "by-hand/0"}
        )
        assert r.json()["released"]

        # alice submits a job; the admin cancels it for her.
        r = await svc.request(
            "POST", "/jobs", token=alice, json={"code": "import time; time.sleep(60)", "name": "t"}
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        assert (await svc.request("DELETE", f"/jobs/{job}")).status_code == 200

        # alice deploys (scaled to zero: no replica starts), shares, changes, deletes.
        r = await svc.request(
            "POST",
            "/deployments",
            token=alice,
            files={
                "spec": (None, json.dumps({"name": "m", "min_replicas": 0, "max_replicas": 1})),
                "model": ("model.tar.gz", model_tar),
            },
        )
        assert r.status_code == 201, r.text
        r = await svc.request("PATCH", "/deployments/m", token=alice, json={"share_users": ["bob"]})
        assert r.status_code == 200, r.text
        r = await svc.request(
            "PATCH",
            "/deployments/m",
            params={"user": "alice"},
            json={"stop_with_server": True},
        )
        assert r.status_code == 200, r.text
        assert (await svc.request("DELETE", "/deployments/m", token=alice)).status_code == 200

        rows = await entries(svc, user="alice")
        got = [(e["action"], e["actor"], e["actor_kind"], e["result"]) for e in rows[::-1]]
        assert got == [
            ("allocation.create", "admin", "admin", "ok"),
            ("allocation.create", "alice", "user", "denied"),
            ("allocation.release", "admin", "admin", "ok"),
            ("job.submit", "alice", "user", "ok"),
            ("job.cancel", "admin", "admin", "ok"),
            ("deployment.create", "alice", "user", "ok"),
            ("deployment.share", "alice", "user", "ok"),
            ("deployment.update", "admin", "admin", "ok"),
            ("deployment.delete", "alice", "user", "ok"),
        ]
        assert all(e["user"] == "alice" and e["source"] == "127.0.0.1" for e in rows)
        create = only(rows, action="allocation.create", result="ok")
        assert create["subject"] == "by-hand/0"
        assert create["detail"] == {"gpu_milli": 250, "kind": "job"}
        assert only(rows, action="job.submit")["subject"] == job
        assert only(rows, action="job.submit")["detail"]["name"] == "t"
        assert only(rows, action="deployment.share")["detail"] == {"share_users": ["bob"]}
        assert only(rows, action="deployment.delete")["subject"] == "alice/m"
        # Nothing of a secret: no token, no request body, no code.
        text = json.dumps(rows)
        assert alice not in text and "time.sleep" not in text


async def test_users_read_their_own_entries_admins_all_filters_and_export(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")
        trail = svc.app.audit
        await trail.record("job.submit", "j1", actor="alice", actor_kind="user", user="alice")
        await trail.record("job.submit", "j2", actor="bob", actor_kind="user", user="bob")
        # An admin acting for bob, and gpulab itself on a GPU (nobody's).
        await trail.record("job.cancel", "j2", actor="admin", actor_kind="admin", user="bob")
        await trail.record("gpu.cordon", "GPU-1", reason="xid 79")

        mine = await entries(svc, alice)
        assert [e["subject"] for e in mine] == ["j1"]
        theirs = await entries(svc, bob)
        assert [(e["action"], e["actor"]) for e in theirs] == [
            ("job.cancel", "admin"),
            ("job.submit", "bob"),
        ]
        # Not with a filter either.
        r = await svc.request("GET", "/audit", token=alice, params={"user": "bob"})
        assert r.status_code == 403 and "your own" in r.json()["error"]
        assert await entries(svc, alice, actor="bob") == []
        assert await entries(svc, alice, subject="j2") == []
        r = await svc.request("GET", "/audit", token=bob, params={"format": "jsonl"})
        assert {json.loads(x)["user"] for x in r.text.splitlines()} == {"bob"}

        # Admins read everything, and filter.
        every = await entries(svc)
        assert len(every) == 4 and every[0]["action"] == "gpu.cordon"
        assert every[0]["actor_kind"] == "system" and every[0]["user"] is None
        assert every[0]["detail"] == {"reason": "xid 79"}
        assert [e["subject"] for e in await entries(svc, action="job.*")] == ["j2", "j2", "j1"]
        assert [e["actor"] for e in await entries(svc, user="bob", action="job.cancel")] == [
            "admin"
        ]
        assert await entries(svc, result="denied") == []
        future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
        assert await entries(svc, since=future) == []
        assert len(await entries(svc, until=future, since="2020-01-01")) == 4
        # The same instant in another zone is the same filter.
        later = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).astimezone(
            dt.timezone(dt.timedelta(hours=-5))
        )
        assert len(await entries(svc, until=later.isoformat())) == 4
        assert await entries(svc, since=later.isoformat()) == []

        # Pages, newest first.
        r = (await svc.request("GET", "/audit", params={"limit": 3})).json()
        assert len(r["entries"]) == 3 and r["next_before"] == r["entries"][-1]["id"]
        r2 = (await svc.request("GET", "/audit", params={"before": r["next_before"]})).json()
        assert [e["subject"] for e in r2["entries"]] == ["j1"] and r2["next_before"] is None

        # The export: every entry, one JSON object a line, as a download.
        r = await svc.request("GET", "/audit", params={"format": "jsonl"})
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        assert "attachment" in r.headers["Content-Disposition"]
        lines = [json.loads(x) for x in r.text.splitlines()]
        assert [x["id"] for x in lines] == [e["id"] for e in every]

        # Bad filters: 400 with what to do.
        for params, says in [
            ({"since": "yesterday"}, "ISO 8601"),
            ({"limit": "0"}, "limit must be from 1"),
            ({"limit": "x"}, "integer"),
            ({"result": "maybe"}, "ok, denied, failed"),
            ({"action": "DROP TABLE"}, "action name"),
            ({"format": "xml"}, "json or jsonl"),
            ({"since": "2026-02-01", "until": "2026-01-01"}, "before until"),
        ]:
            r = await svc.request("GET", "/audit", params=params)
            assert r.status_code == 400, (params, r.text)
            assert says in r.json()["error"], (params, r.json())
        r = await svc.request("GET", "/audit", anonymous=True)
        assert r.status_code == 401


async def test_only_the_hubs_token_records_hub_events(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        event = {
            "ts": "2026-01-02T03:04:05+00:00",
            "actor": "admin",
            "actor_kind": "admin",
            "user": "alice",
            "action": "server.start",
            "subject": "alice/",
            "result": "ok",
            "peer": "127.0.0.1",
            # The client wrote the first hop; the proxy on 127.0.0.1 added the second.
            "forwarded_for": "6.6.6.6, 203.0.113.7",
            # The hub found its peer's socket to be its own account's: the proxy.
            "peer_is_platform": True,
            "detail": {"gpu_milli": 250, "token": "never kept"},
        }
        r = await svc.request("POST", "/audit", token=alice, json={"entries": [event]})
        assert r.status_code == 403
        hub = svc.fake_hub.service_token
        r = await svc.request("POST", "/audit", token=hub, json={"entries": [event]})
        assert r.status_code == 201, r.text
        [e] = await entries(svc, alice)
        assert e["actor"] == "admin" and e["user"] == "alice"
        assert e["ts"] == "2026-01-02T03:04:05+00:00"
        assert e["source"] == "203.0.113.7"
        assert e["detail"] == {"gpu_milli": 250}
        # A peer on loopback that is not the proxy (a user's kernel): its header is its own.
        for platform in (False, None):
            kernel = {**event, "subject": f"kernel-{platform}", "peer_is_platform": platform}
            r = await svc.request("POST", "/audit", token=hub, json={"entries": [kernel]})
            assert r.status_code == 201, r.text
            [k] = [x for x in await entries(svc, alice) if x["subject"] == kernel["subject"]]
            assert k["source"] == "127.0.0.1"
        for bad in ({**event, "action": "Bad Name"}, {**event, "result": "?"}, "x"):
            r = await svc.request("POST", "/audit", token=hub, json={"entries": [bad]})
            assert r.status_code == 400, r.text
        assert len(await entries(svc)) == 3  # alice's forged one is not there


def test_the_client_address_is_the_last_untrusted_hop():
    assert client_source("203.0.113.9", "6.6.6.6") == "203.0.113.9"  # no proxy: the peer
    # Through the hub's proxy (a loopback peer whose socket is the platform's own).
    assert client_source("127.0.0.1", "6.6.6.6, 203.0.113.7", peer_is_platform=True) == (
        "203.0.113.7"
    )
    assert client_source("127.0.0.1", None) == "127.0.0.1"
    assert client_source("10.1.2.3", "198.51.100.4, 10.0.0.5", ["127.0.0.1/8", "10.0.0.0/8"]) == (
        "198.51.100.4"
    )
    assert client_source("127.0.0.1", "not-an-ip, 127.0.0.1") == "127.0.0.1"


async def test_old_entries_are_pruned_by_the_retention_setting(tmp_path):
    config = "c.AuditTrail.audit_retention_days = 30\n"
    async with running_service(tmp_path / "svc", config) as svc:
        trail = svc.app.audit
        old = dt.datetime.now(dt.UTC) - dt.timedelta(days=31)
        await trail.record("job.submit", "old", ts=old)
        await trail.record("job.submit", "new")
        # The hourly pass ran at start (nothing to do then); run it again now.
        assert trail.prune_sync() == 1
        assert [e["subject"] for e in await entries(svc)] == ["new"]
        trail.retention_days = 0  # keep forever
        await trail.record("job.submit", "older", ts=old)
        assert trail.prune_sync() == 0


def test_every_action_is_documented():
    from gpulab.hub_ext.audit_hook import RULES
    from gpulab.service.operations.audit import ACTIONS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "audit.md").read_text()
    for action in ACTIONS:
        assert f"`{action}`" in doc, f"{action} is missing from docs/howto/audit.md"
    assert {a for _, _, a in RULES} <= set(ACTIONS)


def test_a_bad_trusted_proxy_stops_the_start(tmp_path, monkeypatch):
    from gpulab.service.app import GpuLabService
    from gpulab.service.plugins import ConfigError

    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:9/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "unused")
    monkeypatch.setenv("GPULAB_SIMULATE_GPUS", "1xA100-80GB")
    path = tmp_path / "gpulab_config.py"
    path.write_text('c.AuditTrail.audit_trusted_proxies = ["proxy.example.org"]\n')
    app = GpuLabService(data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="'proxy.example.org' is not an address or network"):
        app.initialize([f"--config={path}"])


def test_past_the_minutes_refusals_a_caller_is_counted_then_told():
    from gpulab.service.operations.denials import DenialThrottle

    now = [1000.0]
    throttle = DenialThrottle(per_minute=3, clock=lambda: now[0])
    assert [throttle.admit("mallory") for _ in range(5)] == [0, 0, 0, None, None]
    assert throttle.admit("alice") == 0  # another caller's minute is their own
    now[0] += 30
    assert throttle.admit("mallory") is None  # the same minute
    now[0] += 31
    # The next minute's first entry says how many went unwritten before it.
    assert [throttle.admit("mallory") for _ in range(4)] == [3, 0, 0, None]
    now[0] += 60
    assert throttle.admit("mallory") == 1


async def test_a_loop_of_refused_changes_writes_a_minutes_worth_then_counts(tmp_path):
    config = "c.AuditTrail.denials_per_minute = 5\n"
    async with running_service(tmp_path / "svc", config) as svc:
        alice, bob = svc.create_user("alice"), svc.create_user("bob")
        body = {"user": "alice", "owner_kind": "job", "owner": "x/0", "gpu_milli": 250}
        for _ in range(40):
            r = await svc.request("POST", "/allocations", token=alice, json=body)
            assert r.status_code == 403
        r = await svc.request("POST", "/allocations", token=bob, json=body)
        assert r.status_code == 403
        await asyncio.gather(*svc.app.audit._soon)  # noqa: SLF001 - the writes in flight
        denied = await entries(svc, result="denied")
        assert [e["actor"] for e in denied].count("alice") == 5
        assert [e["actor"] for e in denied].count("bob") == 1
        # The minute past, alice's next refusal says how many were not written.
        svc.app.audit.denials._callers["alice"].start -= 60  # noqa: SLF001
        r = await svc.request("POST", "/allocations", token=alice, json=body)
        await asyncio.gather(*svc.app.audit._soon)  # noqa: SLF001
        newest = (await entries(svc, result="denied"))[0]
        assert newest["actor"] == "alice" and newest["detail"]["unwritten_denials"] == 35


def test_a_body_nested_past_pythons_limit_reads_as_no_body():
    """The hub answers it 400; the trail's reading of it must not fail the log hook."""
    from types import SimpleNamespace

    from gpulab.hub_ext.audit_hook import _body_json

    deep = SimpleNamespace(request=SimpleNamespace(body=b"[" * 100_000 + b"]" * 100_000))
    assert _body_json(deep) is None
    fine = SimpleNamespace(request=SimpleNamespace(body=b'{"note": "x"}'))
    assert _body_json(fine) == {"note": "x"}
