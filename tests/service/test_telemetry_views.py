"""What ``GET /telemetry`` shows each viewer of one stored sample: a user sees their
own GPU processes, and of others' only that they are there; the sample stored for
everyone stays whole."""

import time

import pytest
from support.service import running_service

from gpulab.telemetry.sample import empty_sample

pytestmark = pytest.mark.asyncio


def process(user: str, pid: int) -> dict:
    return {"pid": pid, "user": user, "unix_user": user, "cmdline": f"python {user}.py"}


async def test_others_processes_are_hidden_and_the_stored_sample_stays_whole(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        sample = empty_sample("agent-node", time.time())
        sample["gpus"] = [
            {"uuid": "GPU-a", "processes": [process("alice", 11), process("bob", 22)]},
            {"uuid": "GPU-b", "processes": []},
            {
                "uuid": "GPU-c",
                "processes": [],
                "mig": [{"uuid": "MIG-c0", "processes": [process("bob", 33)]}],
            },
        ]
        r = await svc.request("POST", "/telemetry", json=sample)
        assert r.status_code == 201, r.text

        async def shown(token=None) -> list[dict]:
            r = await svc.request("GET", "/telemetry", token=token)
            assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
            [last] = r.json()["nodes"]["agent-node"]["samples"]
            return last["gpus"]

        seen = await shown(alice)
        assert seen[0]["processes"] == [
            process("alice", 11),
            {"pid": None, "user": None, "unix_user": None, "cmdline": None, "other_user": True},
        ]
        assert seen[1] == {"uuid": "GPU-b", "processes": []}
        # A MIG device's processes too.
        assert seen[2]["mig"][0]["processes"] == [
            {"pid": None, "user": None, "unix_user": None, "cmdline": None, "other_user": True}
        ]
        # The admin, after alice's view, sees bob's process as it was sent.
        everything = await shown()
        assert everything[0]["processes"] == [process("alice", 11), process("bob", 22)]
        assert everything[2]["mig"][0]["processes"] == [process("bob", 33)]
