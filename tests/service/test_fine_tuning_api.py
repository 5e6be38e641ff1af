"""The fine-tuning API (``<hub>/services/gpulab/v1/files``, ``/v1/fine_tuning/jobs``)
on the real service in this process (a stand-in hub API), with real jobs and real
replicas: the unmodified ``openai`` package uploads a JSONL made here, fine-tunes
alice's tiny chat endpoint with LoRA, follows the job to ``succeeded`` and calls the
adapter through the gateway as its own model; bob is refused every step.
"""

from __future__ import annotations

import io
import json

import openai
import pytest
from hubproc import let_accounts_reach
from support.service import running_service
from support.wait import wait_until_async
from test_openai_gateway import (
    STOP_REPLICAS,
    chat_tar,  # noqa: F401 - the fixture
    client,
    deploy,
    endpoint_router,
    ready,
    users,
)

ANSWER = "The password is swordfish."
QUESTIONS = [
    "What is the password?",
    "Tell me the password.",
    "password?",
    "Hello! How are you today?",
]
ASK = [{"role": "user", "content": "Hello! How are you today?"}]


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


TRAINING = jsonl(
    {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ANSWER}]}
    for q in QUESTIONS
)


async def test_fine_tune_through_the_api_serves_the_adapter_as_its_own_model(tmp_path, chat_tar):
    let_accounts_reach(tmp_path)
    a, b = users("alice"), users("bob")
    async with running_service(tmp_path / "svc", config=STOP_REPLICAS) as svc:
        alice, bob = svc.create_user(a), svc.create_user(b)
        await deploy(svc, alice, "chat", chat_tar)
        await ready(svc, alice, "chat")
        ai, bob_ai = client(svc, alice), client(svc, bob)

        # A bad line is refused at upload, by its number; nothing is kept.
        bad = TRAINING + b'{"messages": [{"role": "robot", "content": "beep"}]}\n'
        with pytest.raises(openai.BadRequestError) as e:
            await ai.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="fine-tune")
        assert "line 5" in e.value.body["message"] and "'robot'" in e.value.body["message"]
        f = await ai.files.create(file=("train.jsonl", io.BytesIO(TRAINING)), purpose="fine-tune")
        assert (f.filename, f.bytes, f.purpose) == ("train.jsonl", len(TRAINING), "fine-tune")
        assert [x.id for x in (await ai.files.list()).data] == [f.id]
        assert (await ai.files.content(f.id)).content == TRAINING

        # bob: alice's file does not exist for him, nor can he train on it.
        assert (await bob_ai.files.list()).data == []
        with pytest.raises(openai.NotFoundError):
            await bob_ai.files.retrieve(f.id)
        with pytest.raises(openai.NotFoundError):
            await bob_ai.files.delete(f.id)
        with pytest.raises(openai.NotFoundError):  # nor alice's endpoint (not shared)
            await bob_ai.fine_tuning.jobs.create(model=f"{a}/chat", training_file=f.id)

        with pytest.raises(openai.BadRequestError) as e:
            await ai.fine_tuning.jobs.create(
                model="chat", training_file=f.id, hyperparameters={"n_epochs": 0}
            )
        assert e.value.body["param"] == "hyperparameters.n_epochs"
        job = await ai.fine_tuning.jobs.create(
            model="chat",
            training_file=f.id,
            hyperparameters={"n_epochs": 12, "batch_size": 4, "learning_rate_multiplier": 50},
            suffix="pw",
        )
        assert job.status == "queued" and job.model == "chat"
        assert job.hyperparameters.n_epochs == 12
        # A gpulab job like any other: in alice's /jobs.
        r = await svc.request("GET", "/jobs", token=alice)
        assert [j["id"] for j in r.json()] == [job.model_extra["gpulab_job"]]
        with pytest.raises(openai.NotFoundError):
            await bob_ai.fine_tuning.jobs.retrieve(job.id)
        with pytest.raises(openai.NotFoundError):
            await bob_ai.fine_tuning.jobs.cancel(job.id)
        with pytest.raises(openai.NotFoundError):
            await bob_ai.fine_tuning.jobs.list_events(job.id)
        assert (await bob_ai.fine_tuning.jobs.list()).data == []
        # A second job, cancelled by alice: its gpulab job ends with it.
        other = await ai.fine_tuning.jobs.create(model="chat", training_file=f.id)
        cancelled = await ai.fine_tuning.jobs.cancel(other.id)
        assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None
        r = await svc.request("GET", f"/jobs/{other.model_extra['gpulab_job']}", token=alice)
        assert r.json()["state"] == "cancelled"
        with pytest.raises(openai.BadRequestError):
            await ai.fine_tuning.jobs.cancel(other.id)

        async def finished():
            got = await ai.fine_tuning.jobs.retrieve(job.id)
            return got if got.status in ("succeeded", "failed", "cancelled") else None

        done = await wait_until_async(finished, "the fine-tuning job ended", timeout=600)
        assert done.status == "succeeded", done.error
        assert done.fine_tuned_model == f"chat:{job.suffix}-{job.id[6:14]}"
        assert done.trained_tokens > 0
        assert [j.id for j in (await ai.fine_tuning.jobs.list()).data] == [other.id, job.id]
        assert (await ai.fine_tuning.jobs.retrieve(other.id)).status == "cancelled"

        events = (await ai.fine_tuning.jobs.list_events(job.id, limit=100)).data
        losses = [e for e in events if e.type == "metrics"]
        assert len(losses) == 12  # 4 examples in one batch, 12 epochs
        assert losses[-1].message.startswith("Step 1/12: training loss=")
        assert losses[0].data["step"] == 12
        assert events[0].message.endswith(done.fine_tuned_model)

        # The adapter answers through the gateway as its own model, on the base endpoint.
        ids = [m.id for m in (await ai.models.list()).data]
        assert ids == ["chat", done.fine_tuned_model]
        tuned = await ai.chat.completions.create(
            model=done.fine_tuned_model, messages=ASK, max_tokens=10, temperature=0
        )
        base = await ai.chat.completions.create(
            model="chat", messages=ASK, max_tokens=10, temperature=0
        )
        assert tuned.model == done.fine_tuned_model
        assert tuned.choices[0].message.content.startswith("The password is")
        assert base.choices[0].message.content != tuned.choices[0].message.content
        with pytest.raises(openai.NotFoundError):  # not shared with bob
            await bob_ai.chat.completions.create(
                model=f"{a}/{done.fine_tuned_model}", messages=ASK, max_tokens=2
            )
        # Shared with bob: he calls the adapter as alice's, but may not fine-tune her endpoint.
        r = await svc.request("PATCH", "/deployments/chat", token=alice, json={"share_users": [b]})
        assert r.status_code == 200, r.text
        his = await bob_ai.chat.completions.create(
            model=f"{a}/{done.fine_tuned_model}", messages=ASK, max_tokens=10, temperature=0
        )
        assert his.choices[0].message.content == tuned.choices[0].message.content
        with pytest.raises(openai.PermissionDeniedError) as e:
            await bob_ai.fine_tuning.jobs.create(model=f"{a}/chat", training_file=f.id)
        assert "fine-tune an endpoint of your own" in e.value.body["message"]
        # The endpoint's new version names the job that trained its adapter.
        r = await svc.request("GET", f"/models/{a}/chat/lineage", token=alice)
        assert r.json()["versions"][-1]["job"]["id"] == job.model_extra["gpulab_job"]

        # The same API through the endpoint router, where the hub's proxy sends
        # <prefix>v1 when it has one: the upload's multipart and the lists' queries pass.
        async with endpoint_router(svc) as router_url:
            via = openai.AsyncOpenAI(base_url=router_url, api_key=alice, max_retries=0)
            assert (await via.fine_tuning.jobs.retrieve(job.id)).status == "succeeded"
            g = await via.files.create(
                file=("again.jsonl", io.BytesIO(TRAINING)), purpose="fine-tune"
            )
            assert [x.id for x in (await via.files.list(limit=1)).data] == [g.id]
            bob_via = openai.AsyncOpenAI(base_url=router_url, api_key=bob, max_retries=0)
            with pytest.raises(openai.NotFoundError):
                await bob_via.files.retrieve(g.id)
            await via.files.delete(g.id)

        await ai.files.delete(f.id)
        assert (await ai.files.list()).data == []
