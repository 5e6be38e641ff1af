"""The fine-tuning API against what a user can send or write: bodies and lines nested
past Python's stack, report() records and a summary of any shape, requests at once,
a budget spent, and a user deleted and a new one given the name. Pure functions and
the parts in this process (fakes for the job and deployment managers), and for the
deletion the real service with a stand-in hub."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import types

import pytest
import requests
from hubproc import fresh_user, let_accounts_reach
from support.service import PREFIX, running_service
from tornado.httputil import HTTPFile

from gpulab.backend.jobdir import JobDir
from gpulab.db.engine import make_engine
from gpulab.db.fine_tuning import FineTuningStore
from gpulab.hub_ext.user_removal import stop_work
from gpulab.scheduler.budget import BudgetExceeded
from gpulab.service.auth import Identity
from gpulab.service.endpoints import fine_tuning as ft_module
from gpulab.service.endpoints.fine_tuning import FineTuning
from gpulab.service.endpoints.fine_tuning_api import _json_body
from gpulab.service.endpoints.fine_tuning_files import TrainingFiles, check_training_file
from gpulab.service.endpoints.fine_tuning_publish import PublishFailed, serve_adapter
from gpulab.service.endpoints.openai_errors import OpenAIError
from gpulab.service.jobs.manager import JobRefused
from gpulab.spawner.service_client import ServiceClient
from gpulab.training.sft import examples

ALICE = Identity("alice", "user")
GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def jsonl(*rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


# -- what a user sends ----------------------------------------------------------------
def test_a_line_separator_inside_a_string_is_part_of_the_line():
    """splitlines() cut a line at U+2028 (which JSON allows raw in a string): a good
    file was refused; the job gets it with the character escaped, so its loop reads
    the same examples."""
    from gpulab.service.endpoints.fine_tuning_files import for_training

    said = {"role": "assistant", "content": "one\u2028two\u2029three\x85four"}
    data = json.dumps({"messages": [GOOD["messages"][0], said]}, ensure_ascii=False).encode()
    data += b"\n" + jsonl(GOOD)
    assert check_training_file(data) == 2
    (first, second) = examples(for_training(data))
    assert first[1]["content"] == said["content"] and second == GOOD["messages"]
    assert for_training(jsonl(GOOD)) == jsonl(GOOD)  # nothing to escape: the same bytes


def test_a_line_or_a_body_nested_past_the_stack_is_a_400():
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(OpenAIError) as e:
        check_training_file(jsonl(GOOD) + deep + b"\n")
    assert e.value.status == 400 and "training file line 2: not JSON" in str(e.value)
    for nested in (100_000, 100):
        body = b'{"model": "chat", "hyperparameters": ' + b"[" * nested + b"]" * nested + b"}"
        with pytest.raises(OpenAIError) as e:
            _json_body(body)
        assert e.value.status == 400 and "more than 64 deep" in str(e.value)
    assert _json_body(b'{"model": "chat", "suffix": "x"}')["model"] == "chat"


@pytest.mark.parametrize(
    "record",
    [
        [1, 2],
        "loss step",
        {"step": 1, "loss": "low"},
        {"step": 1, "loss": [0.5]},
        {"step": "1", "loss": 0.5},
        {"step": 1, "loss": 10**400},
        {"step": 1, "loss": float("nan")},
        {"step": True, "loss": 0.5},
    ],
)
def test_a_report_record_that_is_not_a_steps_loss_is_left_out_of_the_events(record):
    """The records are what the user's code reported: a string loss or a list record
    made every listing of the job's events a 500."""
    from gpulab.service.endpoints.fine_tuning import metric_event

    assert metric_event(record, 1000) is None


def test_a_steps_loss_is_an_event_and_odd_extras_are_dropped():
    from gpulab.service.endpoints.fine_tuning import metric_event

    at, _, kind, text, data = metric_event(
        {"step": 3, "loss": 0.25, "total_steps": "many", "time": "now"}, 1000
    )
    assert (at, kind, text) == (1000, "metrics", "Step 3/None: training loss=0.2500")
    assert data == {"step": 3, "total_steps": None, "train_loss": 0.25}


@pytest.mark.parametrize(
    ("summary", "tokens"),
    [([1], None), ({"trained_tokens": 10**30}, None), ({"trained_tokens": True}, None),
     ({"trained_tokens": -1}, None), ({"trained_tokens": 1.5}, None), ("x", None),
     ({"trained_tokens": 1234}, 1234)],
)  # fmt: skip
def test_trained_tokens_are_taken_only_as_a_count_the_table_holds(summary, tokens):
    from gpulab.service.endpoints.fine_tuning import trained_tokens

    assert trained_tokens(summary) == tokens


# -- the parts in this process ----------------------------------------------------------
class FakeJobs:
    """The job manager as fine-tuning uses it: the intake's checks, submit, rows."""

    def __init__(self, root: str):
        self.root = root
        self.limits = types.SimpleNamespace(max_job_vars_mib=256)
        self.refuse: JobRefused | None = None
        self.rows: dict[str, dict] = {}
        self.cancelled: list[str] = []
        self.intake = types.SimpleNamespace(check_room=self._check_room)
        self.queue = types.SimpleNamespace(get=self.rows.get)

    async def _check_room(self, who, body):
        if self.refuse:
            raise self.refuse

    async def submit(self, who, body):
        if self.refuse:
            raise self.refuse
        job = {"id": f"j{len(self.rows)}", "user": who.name, "state": "queued"}
        self.rows[job["id"]] = job
        return job

    async def cancel(self, job, why):
        self.cancelled.append(job["id"])
        job["state"] = "cancelled"

    def jobdir(self, job):
        return JobDir(self.root, job["id"])


def fake_deployments(tmp_path):
    hf = tmp_path / "model" / "hf"
    hf.mkdir(parents=True)
    (hf / "weights.bin").write_bytes(b"w" * 1000)
    (tmp_path / "model" / "model.json").write_text('{"kind": "causal-lm"}')
    dep = {"id": "d1", "user": "alice", "name": "chat", "gpu_milli": 250}
    version = {"id": "v1", "version": 1, "gpu_milli": 250}
    return types.SimpleNamespace(
        calls=types.SimpleNamespace(callable_endpoint=lambda who, owner, name: dep),
        store=types.SimpleNamespace(versions=lambda dep_id: [version], get=lambda i: dep),
        card=lambda vid: {"kind": "causal-lm"},
        serving=types.SimpleNamespace(model_dir=lambda vid: str(tmp_path / "model")),
        limits=types.SimpleNamespace(max_model_mib=1),
        created=[],
    )


@pytest.fixture
def parts(tmp_path):
    store = FineTuningStore(make_engine(f"sqlite:///{tmp_path}/ft.sqlite"))
    files = TrainingFiles(store, str(tmp_path / "files"), quota_mib=16)
    jobs = FakeJobs(str(tmp_path / "jobs"))
    ft = FineTuning(store, files, jobs, fake_deployments(tmp_path))
    ft.max_open_jobs = 3
    upload = HTTPFile(filename="t.jsonl", body=jsonl(GOOD), content_type="application/jsonl")
    fid = files.create(ALICE, upload, "fine-tune")["id"]
    reads = {"now": 0, "most": 0, "all": 0}
    read_all = FineTuning._read_all
    lock = threading.Lock()

    def counted(paths):
        with lock:
            reads["now"] += 1
            reads["all"] += 1
            reads["most"] = max(reads["most"], reads["now"])
        time.sleep(0.2)
        try:
            return read_all(paths)
        finally:
            with lock:
                reads["now"] -= 1

    ft._read_all = counted
    return types.SimpleNamespace(ft=ft, jobs=jobs, store=store, fid=fid, reads=reads)


async def test_a_users_creates_read_the_base_model_one_at_a_time_up_to_a_cap(parts):
    """Each create read and copied the whole base model before anything could refuse
    it: requests at once held as many copies in the service's memory."""
    doc = {"model": "chat", "training_file": parts.fid}
    got = await asyncio.gather(
        *(parts.ft.create(ALICE, dict(doc)) for _ in range(5)), return_exceptions=True
    )
    made = [g for g in got if isinstance(g, dict)]
    refused = [g for g in got if isinstance(g, OpenAIError)]
    assert parts.reads["most"] == 1  # one copy at a time
    assert len(made) == 3 and parts.reads["all"] == 3  # the cap: none read past it
    assert {e.status for e in refused} == {429}
    assert "3 fine-tuning jobs queued or running" in str(refused[0])
    assert "cancel" in str(refused[0])
    # One ended: room for another.
    await parts.ft.cancel(ALICE, made[0]["id"])
    assert (await parts.ft.create(ALICE, dict(doc)))["status"] == "queued"


async def test_a_create_over_the_budget_or_the_queue_cap_reads_nothing(parts):
    parts.jobs.refuse = JobRefused(403, "alice has used 0 of their 0 GPU-hours this month")
    with pytest.raises(OpenAIError) as e:
        await parts.ft.create(ALICE, {"model": "chat", "training_file": parts.fid})
    assert e.value.status == 403 and "GPU-hours" in str(e.value)
    assert parts.reads["all"] == 0


def _succeeded_job(parts, summary: bytes | None) -> tuple[dict, dict]:
    """A fine-tuning job whose training job succeeded and wrote ``summary``."""
    job = {"id": "j9", "user": "alice", "state": "succeeded"}
    parts.jobs.rows["j9"] = job
    out = os.path.join(parts.jobs.root, "j9", "out")
    os.makedirs(out)
    for name, data in (("adapter_config.json", b"{}"), ("adapter_model.safetensors", b"w")):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    if summary is not None:
        with open(os.path.join(out, "sft.json"), "wb") as f:
            f.write(summary)
    row = parts.store.add_job(
        {
            "id": "ftjob-1",
            "user": "alice",
            "model": "chat",
            "deployment_id": "d1",
            "training_file": parts.fid,
            "hyperparameters": {},
            "adapter": "ft-1",
            "job_id": "j9",
            "status": "running",
        }
    )
    return row, job


async def _follow_until_quiet(ft) -> None:
    for _ in range(5):
        await ft.follow()
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("summary", "tokens"),
    [(b"[1]", None), (b'{"trained_tokens": 1000000000000000000000000000000}', None),
     (b'{"trained_tokens": 77}', 77)],
)  # fmt: skip
async def test_a_summary_of_any_shape_never_holds_the_job_in_publishing(
    parts, monkeypatch, summary, tokens
):
    """out/sft.json is the user's: `[1]` (AttributeError) or a count past 64 bits
    (OverflowError in the table) escaped, and the adapter was served again every
    second, for ever."""
    served = []

    async def serve(*args, **kw):
        served.append(args[3])

    monkeypatch.setattr(ft_module, "serve_adapter", serve)
    _succeeded_job(parts, summary)
    await _follow_until_quiet(parts.ft)
    row = parts.store.job("ftjob-1")
    assert (row["status"], row["trained_tokens"]) == ("succeeded", tokens)
    assert served == ["ft-1"]


async def test_serving_that_fails_in_any_way_fails_the_job_once_saying_why(parts, monkeypatch):
    served = []

    async def broken(*args, **kw):
        served.append(args[3])
        raise KeyError("model.json")

    monkeypatch.setattr(ft_module, "serve_adapter", broken)
    _succeeded_job(parts, b"{}")
    await _follow_until_quiet(parts.ft)
    row = parts.store.job("ftjob-1")
    assert row["status"] == "failed" and "KeyError" in row["error"]
    assert served == ["ft-1"]  # not again
    assert len(parts.ft.notes["ftjob-1"]) == 1
    for n in range(200):  # what is said of a job is capped
        parts.ft._note("ftjob-1", f"note {n}")
    assert len(parts.ft.notes["ftjob-1"]) == ft_module.MAX_NOTES


async def test_an_adapter_is_not_served_past_the_owners_gpu_hour_budget(tmp_path):
    """A new version through deployments.create skipped the budget check POST
    /deployments makes: fine-tuning served GPUs to a user over their budget."""
    deployments = fake_deployments(tmp_path)

    async def create(who, settings, tar):
        deployments.created.append(settings)

    deployments.create = create
    asked = []

    async def refuse(user, milli):
        asked.append((user, milli))
        raise BudgetExceeded("alice has used 12 of their 10 GPU-hours this month")

    dep = deployments.store.get("d1")
    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"w"}
    with pytest.raises(PublishFailed, match="12 of their 10 GPU-hours"):
        await serve_adapter(deployments, ALICE, dep, "a1", files, "j1", refuse_over_budget=refuse)
    assert asked == [("alice", 250)] and deployments.created == []


# -- a user deleted, and a new one given the name ----------------------------------------
async def test_deleting_a_hub_user_removes_their_fine_tuning_files_and_jobs(tmp_path):
    """Files and fine-tuning jobs are kept by their owner's name and outlived the
    user: a new user of the name listed the old one's training data and read it."""
    let_accounts_reach(tmp_path)  # the training job runs as alice's account
    a, b = fresh_user(f"alice{os.getpid()}"), fresh_user(f"bob{os.getpid()}")
    config = "c.GpuLabService.stop_work_on_exit = True\n"
    async with running_service(tmp_path / "svc", config) as svc:
        alice, bob = svc.create_user(a), svc.create_user(b)
        ft = svc.app.fine_tuning
        secret = jsonl({"messages": [{"role": "user", "content": "pw?"},
                                     {"role": "assistant", "content": "swordfish"}]})  # fmt: skip
        ids = {}
        for name in (a, b):
            upload = HTTPFile(filename="t.jsonl", body=secret, content_type="application/jsonl")
            ids[name] = ft.files.create(Identity(name, "user"), upload, "fine-tune")["id"]
        r = await svc.request("POST", "/jobs", alice, json={"code": "import time; time.sleep(60)"})
        training = r.json()["id"]
        for n, status in enumerate(("queued", "succeeded")):
            ft.store.add_job(
                {"id": f"ftjob-{n}", "user": a, "model": "chat", "deployment_id": "d1",
                 "training_file": ids[a], "hyperparameters": {}, "adapter": f"a{n}",
                 "job_id": training if status == "queued" else None, "status": status}
            )  # fmt: skip
        gateway = f"{svc.url}{PREFIX}v1"

        async def get(path, token, **params):
            return await asyncio.to_thread(
                requests.get, f"{gateway}{path}", headers=svc.auth(token), params=params
            )

        # Another user's listing is not a user's to ask for.
        assert (await get("/files", bob, user=a)).status_code == 403
        assert [f["id"] for f in (await get("/files", None, user=a)).json()["data"]] == [ids[a]]

        hub = ServiceClient(svc.api, svc.fake_hub.service_token, retry_seconds=0)
        await stop_work(hub, a)

        # The new alice (the same name: the stand-in hub's token is still hers).
        assert (await get("/files", alice)).json()["data"] == []
        assert (await get(f"/files/{ids[a]}/content", alice)).status_code == 404
        assert (await get("/fine_tuning/jobs", alice)).json()["data"] == []
        assert ft.store.files(a) == [] and ft.store.jobs(a) == []
        assert not os.path.exists(ft.files.path(ids[a]))
        job = (await svc.request("GET", f"/jobs/{training}")).json()
        assert job["state"] == "cancelled" and "fine-tuning job cancelled" in job["message"]
        # bob's are his still.
        assert [f["id"] for f in (await get("/files", bob)).json()["data"]] == [ids[b]]
        assert (await get(f"/files/{ids[b]}/content", bob)).content == secret


async def test_the_open_jobs_cap_is_the_sites_setting(tmp_path):
    config = "c.LlmSettings.max_open_fine_tuning_jobs = 3\n"
    async with running_service(tmp_path / "svc", config=config) as svc:
        assert svc.app.fine_tuning.max_open_jobs == 3
