"""benchmarks/_openai_floor.py, the server llm_serving.py's ``client-floor`` target
measures the openai client against (its time to first token is the client's own,
which llm_serving.py reports apart from the gateway's): a burst is let go together
once its last call is in, a call short of a burst after the wait, and the
unmodified ``openai`` client reads every token and the usage of each stream."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from llm_serving import free_port, messages, openai_rounds, wait_health  # noqa: E402

BURST = 3


@pytest.fixture(scope="module")
def floor(tmp_path_factory):
    port = free_port()
    argv = [sys.executable, str(REPO / "benchmarks" / "_openai_floor.py"), str(port), str(BURST)]
    with open(tmp_path_factory.mktemp("floor") / "floor.log", "w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_health(proc, log, f"http://127.0.0.1:{port}/health", "the floor server")
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            proc.wait(10)


def let_go_by(base_url: str, calls: int) -> list[str]:
    """``calls`` streamed chats at once; what let each go (its chunks' id)."""
    from openai import AsyncOpenAI

    async def run() -> list[str]:
        client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)

        async def one(chat) -> str:
            stream = await client.chat.completions.create(
                model="floor", messages=chat, max_tokens=2, stream=True
            )
            ids = {chunk.id async for chunk in stream}
            assert len(ids) == 1, ids
            return ids.pop()

        try:
            return await asyncio.gather(*(one(c) for c in messages(calls)))
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_burst_goes_together_and_a_short_one_after_the_wait(floor):
    assert let_go_by(floor, BURST) == ["floor-burst"] * BURST
    assert let_go_by(floor, BURST - 1) == ["floor-wait"] * (BURST - 1)
    assert let_go_by(floor, BURST) == ["floor-burst"] * BURST  # the next burst is its own


@pytest.mark.parametrize("connections", ["kept", "new"])
def test_the_benchmarks_rounds_read_every_token_of_every_stream(floor, connections):
    with openai_rounds(floor, "none", "floor", BURST, connections) as one_round:
        for _ in range(2):
            r = one_round(messages(BURST), 5)
            assert r["tokens"] == BURST * 5  # from each stream's usage chunk
            assert len(r["ttft"]) == BURST
