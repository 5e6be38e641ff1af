"""Self-healing end to end: a GPU that raises XID 79 is cordoned, and the checkpointing
job on it moves to the other GPU and resumes from its checkpoint.

The service is the real one (in-process, a stand-in hub API) with its real job queue,
local backend and training ranks. Only NVML is a stand-in (``support.fake_nvml``,
loaded through ``GPULAB_NVML_MODULE``): this machine has no NVIDIA driver to raise a
real XID, so the stand-in delivers XID 79 as an NVML event on the job's GPU, as the
driver would, through pynvml's own event structure.

Stalls and idle GPUs take their time on a fake clock (``support.clock``): the test
advances the minutes a setting asks for instead of waiting them.
"""

import re
import time

import pytest
from cells import LINEAR  # noqa: E402
from support.clock import fake_clock
from support.fake_nvml import FakeDriver
from support.service import running_service
from support.wait import wait_until_async

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

CONFIG = """
c.TelemetrySettings.local_sampler = True
c.TelemetrySettings.sample_interval = 0.2
c.Alerting.alert_interval_seconds = 0.3
c.UserAccounts.enabled = False
"""


#: How long a job may send no report() before JobStalled (the default, ten minutes).
STALL_S = 600
#: SliceIdle after a minute idle; the server is stopped 30 s after. Both stay under
#: node_stale_seconds (120 s) together: the local sampler's samples carry the real
#: time, and a frozen clock advanced further would find them stale.
IDLE_S = 60
CULL_S = 30


@pytest.fixture
def frozen_clock():
    """gpulab's clock, fake: time moves only by ``advance``."""
    with fake_clock() as clock:
        yield clock


@pytest.fixture
def ticking_clock():
    """gpulab's clock, fake and ticking: real time goes on (a rank stamps its reports
    with it) and ``advance`` jumps ahead of it."""
    with fake_clock(ticking=True) as clock:
        yield clock


async def until(check, what: str, timeout: float = 120.0, every: float = 0.2):
    """Await ``check()`` until it returns something truthy (a bound, not a sleep)."""
    return await wait_until_async(check, what, timeout, every)


async def test_xid_79_cordons_the_gpu_and_the_job_resumes_on_the_other(tmp_path, monkeypatch):
    driver = FakeDriver(tmp_path / "nvml.json")
    for name, value in driver.env().items():
        monkeypatch.setenv(name, value)
    async with running_service(tmp_path / "svc", CONFIG) as svc:
        for gpu in svc.app.gpus:  # the stand-in's boards are the simulated inventory's
            driver.add_gpu(gpu.uuid)
        bob = svc.create_user("bob")
        r = await svc.request(
            "POST",
            "/jobs",
            token=bob,
            json={
                "code": LINEAR,
                "env": {"STEPS": "18", "STEP_DELAY": "0.2"},
                "checkpoint_every": 5,
                "gpu_milli": 1000,
            },
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        async def job():
            return (await svc.request("GET", f"/jobs/{job_id}", token=bob)).json()

        async def holding():
            rows = (await svc.request("GET", "/allocations", token=bob)).json()
            return [a["gpu_uuid"] for a in rows if a["owner"] == f"{job_id}/0"]

        async def past_first_checkpoint():
            m = (await svc.request("GET", f"/jobs/{job_id}/metrics", token=bob)).json()
            return len(m["records"]) >= 7

        await until(past_first_checkpoint, "7 steps of the job")
        [broken] = await holding()
        await until(lambda: registered(svc, broken), "the sampler listening to the GPU")
        driver.raise_xid(broken, 79)

        async def cordoned():
            inv = (await svc.request("GET", "/inventory", token=bob)).json()
            gpus = {g["uuid"]: g for n in inv["nodes"] for g in n["gpus"]}
            return gpus[broken]["cordoned"]

        cordon = await until(cordoned, "the GPU cordoned", 30)
        assert cordon["by"] == "gpulab"
        assert cordon["reason"] == "XID 79 (GPU has fallen off the bus)"

        async def xid_alert():
            got = (await svc.request("GET", "/alerts?state=firing")).json()["alerts"]
            return [a for a in got if a["name"] == "GpuXidErrors" and a["subject"] == broken]

        [alert] = await until(xid_alert, "GpuXidErrors firing for the admin", 30)
        assert alert["severity"] == "critical" and "XID 79" in alert["message"], alert
        mine = (await svc.request("GET", "/alerts", token=bob)).json()["alerts"]
        assert all(a["name"] != "GpuXidErrors" for a in mine)  # a shared GPU: admins'

        async def moved():
            j = await job()
            return j if j["preemptions"] == 1 and j["state"] == "running" else None

        await until(moved, "the job running again after its move")
        [now_on] = await until(holding, "the job's new slice")
        assert now_on != broken

        done = await until(lambda: ended(job), "the job to end", 180)
        assert done["state"] == "succeeded", done
        assert done["preemptions"] == 1
        logs = (await svc.request("GET", f"/jobs/{job_id}/logs", token=bob)).text
        assert f"{broken} was cordoned: XID 79 (GPU has fallen off the bus)" in logs
        saved = re.search(r"\[gpulab\] preempted: saved a checkpoint at step (\d+)", logs)
        resumed = re.search(r"\[gpulab\] resumed from the checkpoint at step (\d+)", logs)
        assert saved and resumed, logs[-3000:]
        assert int(resumed.group(1)) == int(saved.group(1)) > 0
        # The cordon stays until an admin lifts it.
        assert (await cordoned())["reason"].startswith("XID 79")


async def registered(svc, uuid: str) -> bool:
    """The local sampler has sampled the GPU and listens to its XID events."""
    for sample in svc.app.telemetry.latest():
        for gpu in sample["gpus"]:
            if gpu.get("uuid") == uuid and gpu.get("xids") is not None:
                return True
    return False


async def ended(job):
    j = await job()
    return j if j["state"] in ("succeeded", "failed", "cancelled") else None


async def test_a_stalled_job_is_restarted_and_resumes_from_its_checkpoint(tmp_path, ticking_clock):
    """c.Alerting.job_stall_restarts: a job that stops reporting fires JobStalled
    for its owner, the service restarts it and it resumes from its latest checkpoint.
    The job's own code stalls (it waits for a file at step 5) until the test lets it
    on after the restart; ten minutes of the stall pass on the fake clock."""
    gate = tmp_path / "go"
    config = CONFIG + (
        f"c.Thresholds.job_stall_seconds = {STALL_S}\nc.Alerting.job_stall_restarts = 1\n"
    )
    async with running_service(tmp_path / "svc", config) as svc:
        carol = svc.create_user("carol")
        dave = svc.create_user("dave")
        r = await svc.request(
            "POST",
            "/jobs",
            token=carol,
            json={
                "code": LINEAR,
                "env": {"STEPS": "8", "GATE": str(gate)},
                "checkpoint_every": 4,
                "gpu_milli": 500,
            },
        )
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]

        async def job():
            return (await svc.request("GET", f"/jobs/{job_id}", token=carol)).json()

        async def at_the_gate():  # steps 0-4 reported (a checkpoint at 4): it waits
            m = (await svc.request("GET", f"/jobs/{job_id}/metrics", token=carol)).json()
            return len(m["records"]) >= 5

        await until(at_the_gate, "carol's job waiting at step 5")
        assert not (await svc.request("GET", "/alerts", token=carol)).json()["alerts"]
        ticking_clock.advance(STALL_S)  # ten minutes without a report()

        async def stalled_alert():
            got = (await svc.request("GET", "/alerts", token=carol)).json()["alerts"]
            return [a for a in got if a["name"] == "JobStalled" and a["subject"] == job_id]

        [alert] = await until(stalled_alert, "JobStalled for carol", 120)
        assert alert["owner"] == "carol"
        others = (await svc.request("GET", "/alerts", token=dave)).json()["alerts"]
        assert others == []
        restarted = await until(
            lambda: _when(job, lambda j: j["preemptions"] == 1), "the stalled job restarted", 30
        )
        assert restarted["state"] in ("queued", "running")
        gate.write_text("go")
        done = await until(lambda: ended(job), "the job to end", 180)
        assert done["state"] == "succeeded" and done["preemptions"] == 1, done
        logs = (await svc.request("GET", f"/jobs/{job_id}/logs", token=carol)).text
        assert "made no progress (JobStalled)" in logs
        # The restart named its latest checkpoint; the new run started from there.
        saved = re.search(r"resumes from its checkpoint at step (\d+)", logs)
        resumed = re.search(r"\[gpulab\] resumed from the checkpoint at step (\d+)", logs)
        assert saved and resumed, logs[-3000:]
        assert int(resumed.group(1)) == int(saved.group(1)) > 0
        audit = (await svc.request("GET", "/audit?action=job.restart")).json()["entries"]
        assert [(e["actor"], e["user"], e["subject"]) for e in audit] == [
            ("gpulab", "carol", job_id)
        ]


async def _when(get, check):
    got = await get()
    return got if check(got) else None


async def test_a_gpu_idle_server_is_warned_then_stopped(tmp_path, monkeypatch, frozen_clock):
    """c.Thresholds.gpu_idle_cull_seconds: SliceIdle warns the owner of a server
    whose GPU idles, and the server is stopped (through the hub's API: here the
    stand-in hub, which records it) that long after; a server whose GPU works stays.
    NVML is the stand-in (this machine has no GPU to sit idle or busy)."""
    driver = FakeDriver(tmp_path / "nvml.json")
    for name, value in driver.env().items():
        monkeypatch.setenv(name, value)
    config = CONFIG + (
        f"c.Thresholds.alert_slice_idle_seconds = {IDLE_S}\n"
        f"c.Thresholds.gpu_idle_cull_seconds = {CULL_S}\n"
    )
    async with running_service(tmp_path / "svc", config) as svc:
        idle, busy = (g.uuid for g in svc.app.gpus)
        driver.add_gpu(idle, gpu_util=0)
        driver.add_gpu(busy, gpu_util=60)
        tokens = {}
        for user, uuid in (("erin", idle), ("frank", busy)):
            tokens[user] = svc.create_user(user)
            svc.fake_hub.users[user]["servers"] = {"": {"ready": True}}
            r = await svc.request(
                "POST",
                "/allocations",
                json={"user": user, "owner_kind": "server", "owner": f"{user}/", "gpu_milli": 1000},
            )
            assert r.status_code in (200, 201) and r.json()[0]["gpu_uuid"] == uuid, r.text

        async def warned():
            got = (await svc.request("GET", "/alerts", token=tokens["erin"])).json()["alerts"]
            return [a for a in got if a["name"] == "SliceIdle"]

        await until(lambda: idle_seen(svc, idle), "an alert round seeing erin's GPU idle", 30)
        frozen_clock.advance(IDLE_S)
        [warning] = await until(warned, "SliceIdle for erin", 30)
        assert warning["subject"] == "erin/" and warning["subject_kind"] == "server"
        assert "idle for over 1 min" in warning["message"], warning
        assert "gpulab stops it 30 s after this warning" in warning["message"], warning
        # Warned, not yet stopped: the 30 s count from the warning.
        assert await svc.app.alert_actions.cull() == [] and svc.fake_hub.stopped == []
        frozen_clock.advance(CULL_S)
        await until(lambda: _when(_stopped(svc), bool), "erin's server stopped", 30)
        # A further round stops nothing: erin's server once, and frank's busy GPU is kept.
        assert await svc.app.alert_actions.cull() == []
        assert svc.fake_hub.stopped == ["erin/"]
        frank = (await svc.request("GET", "/alerts", token=tokens["frank"])).json()["alerts"]
        assert not [a for a in frank if a["name"] == "SliceIdle"]

        async def stops():
            return (await svc.request("GET", "/audit?action=server.stop")).json()["entries"]

        # The stop's audit entry is written just after the hub stopped the server.
        audit = await until(stops, "the stop in the audit trail", 30)
        assert [(e["actor"], e["actor_kind"], e["user"]) for e in audit] == [
            ("gpulab", "system", "erin")
        ]
        assert "idle" in audit[0]["detail"]["reason"]


async def idle_seen(svc, uuid: str) -> bool:
    """An alert round has seen the GPU idle under a slice: SliceIdle's minute runs."""
    facts = svc.app.alerts.last_facts
    return (
        facts is not None
        and any(g["uuid"] == uuid and g["utilization_max"] == 0 for g in facts.gpus)
        and any(a["gpu_uuid"] == uuid for a in facts.allocations)
    )


def _stopped(svc):
    async def get():
        return list(svc.fake_hub.stopped)

    return get


async def test_an_agents_sample_with_new_ecc_errors_cordons_the_gpu(tmp_path):
    """The agent's path: a sample POSTed to /telemetry is judged like the local one.
    A server's slice on the GPU stays where it is; only new slices avoid the GPU."""
    async with running_service(tmp_path / "svc") as svc:
        first, second = (g.uuid for g in svc.app.gpus)
        node = svc.app.inventory_settings.node_name
        svc.create_user("alice")
        svc.fake_hub.users["alice"]["servers"] = {"": {"ready": True}}
        r = await svc.request(
            "POST",
            "/allocations",
            json={"user": "alice", "owner_kind": "server", "owner": "alice/", "gpu_milli": 250},
        )
        held = r.json()[0]["gpu_uuid"]

        def sample(ts, ecc):
            gpus = [
                {
                    "index": i,
                    "uuid": u,
                    "xids": [],
                    "xid_errors_total": 0,
                    "lost": False,
                    "ecc_uncorrected_errors_total": ecc if u == held else 0,
                    "errors": {},
                }
                for i, u in enumerate((first, second))
            ]
            gpus.append({"index": 9, "uuid": "GPU-elsewhere", "lost": True, "errors": {}})
            return {
                "version": 1,
                "ts": ts,
                "node": node,
                "gpus": gpus,
                "nics": [],
                "rdma": [],
                "cache": None,
                "missing": {},
            }

        async def cordons():
            return await svc.app.ledger.aio.run(svc.app.ledger.cordons)

        for ts, ecc in ((1.0, 4), (2.0, 4)):  # an old count: not a fault
            r = await svc.request("POST", "/telemetry", json=sample(time.time() + ts, ecc))
            assert r.status_code == 201, r.text
        await until(lambda: _judged(svc, 2), "both samples judged")
        assert await cordons() == {}
        await svc.request("POST", "/telemetry", json=sample(time.time() + 3, 6))
        got = await until(cordons, "the GPU cordoned", 10)
        assert list(got) == [held]  # a GPU outside the inventory is not the ledger's
        assert got[held]["reason"] == "2 uncorrectable ECC errors"
        assert got[held]["by"] == "gpulab"
        rows = (await svc.request("GET", "/allocations")).json()
        assert [(a["owner"], a["gpu_uuid"]) for a in rows] == [("alice/", held)]


async def _judged(svc, count: int) -> bool:
    return svc.app.healer.judged >= count
