"""An OpenAI chat server that computes nothing: the floor of the ``openai`` client.

    python benchmarks/_openai_floor.py PORT BURST

``POST /v1/chat/completions`` (streamed) holds each call until ``BURST`` calls are
in (or 1 s after the first), then answers all of them at once: the role chunk,
``max_tokens`` one-word chunks, the finish and usage chunks, ``[DONE]``; each
chunk's id says what let it go (``floor-burst``, or ``floor-wait``). A batching
engine answers a burst the same way (all first tokens after one prefill), so the
time to first token a client measures here is what the client itself, its event
loop and the loopback spend to send a burst and read its first events: what any
server it calls pays too. llm_serving.py's ``client-floor`` target runs it in its
own process, so that it does not share the client's CPU time.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

#: The longest the first call of a burst waits for the others.
BURST_WAIT_S = 1.0


class Burst:
    """The calls let go together, and what let them go."""

    def __init__(self):
        self.open = asyncio.Event()
        self.opened_by = ""


class Floor:
    def __init__(self, burst: int):
        self.burst = burst
        self.waiting = 0
        self.current = Burst()
        self.timer: asyncio.TimerHandle | None = None

    async def arrive(self) -> str:
        """Wait until this call's burst opens; what opened it."""
        burst = self.current  # this call's (opening it starts the next one)
        self.waiting += 1
        if self.waiting == 1:
            self.timer = asyncio.get_running_loop().call_later(BURST_WAIT_S, self._open, "wait")
        if self.waiting >= self.burst:
            self._open("burst")
        await burst.open.wait()
        return burst.opened_by

    def _open(self, by: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
        burst, self.current, self.waiting, self.timer = self.current, Burst(), 0, None
        burst.opened_by = by
        burst.open.set()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        tokens = int(doc.get("max_tokens") or 16)
        opened_by = await self.arrive()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {
            "id": f"floor-{opened_by}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "floor",
        }

        async def send(choices, **more) -> None:
            await resp.write(
                f"data: {json.dumps({**base, 'choices': choices, **more})}\n\n".encode()
            )

        await send([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        for _ in range(tokens):
            await send([{"index": 0, "delta": {"content": " word"}, "finish_reason": None}])
        await send([{"index": 0, "delta": {}, "finish_reason": "length"}])
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        await send([], usage=usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main() -> None:
    port, burst = int(sys.argv[1]), int(sys.argv[2])
    floor = Floor(burst)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", floor.chat)
    app.router.add_get("/health", lambda request: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    main()
