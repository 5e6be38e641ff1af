"""The lab's chat box for a language model ("Try it" of a causal-lm endpoint): the
server extension passes a chat turn on to the service's OpenAI-compatible gateway
(``<service>/v1/chat/completions``) with this server's token, in a real
jupyter_server against the real gpulab service (in-process, tests/support/service.py).

The chat itself, answered by a real replica through the hub, is
tests/deploy/test_llm_deploy.py; the box in the browser is lab/js/src/endpoints.ts.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import requests
from support.jupyter_server import SERVER_TOKEN, jupyter_server
from support.service import running_service

pytestmark = pytest.mark.slow

TURN = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}


async def post(url, body, token=SERVER_TOKEN):
    headers = {"Authorization": f"token {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await asyncio.to_thread(
        requests.post, f"{url}/gpulab/chat", data=data, headers=headers, timeout=60
    )


async def test_a_chat_turn_reaches_the_gateway_as_this_servers_user(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        env = {"GPULAB_API_URL": svc.api, "JUPYTERHUB_API_TOKEN": alice}
        with jupyter_server(tmp_path / "alice", env) as url:
            # The gateway's own answer, in OpenAI's shape: it was asked, as alice
            # (without her token it would be 401, not "no such model").
            r = await post(url, {"model": "nochat", **TURN})
            assert r.status_code == 404, r.text
            assert "The model `nochat` does not exist" in r.json()["error"]["message"]

            # What the box never sends is refused here, in one line.
            r = await post(url, b"not json")
            assert r.status_code == 400
            assert r.json()["error"] == 'a chat turn is a JSON object with "model" and "messages"'
            r = await post(url, {"model": "nochat", "stream": True, **TURN})
            assert r.status_code == 400 and '"stream": true' in r.json()["error"]

            # Only this server's login gets in.
            r = await post(url, {"model": "nochat", **TURN}, token=alice)
            assert r.status_code == 403
