"""Searches of one collection that arrive while one is with the engine go to it together.

Eight clients searching one collection each sent their own call to the engine: eight
round trips, eight of the engine's threads waking, each for a FAISS search of 0.2 ms.
Here the first search of a (caller, owner, collection, k, filter) goes at once, alone
(one client waits for nothing); those that arrive while it is with the engine wait
for it and then go as one call of all their vectors, FAISS searching them together,
and each gets back the hits of its own vectors. A batch is one caller's, so it takes
one of that caller's slots in the work queues (:mod:`.owner_queues`): bob's burst of
searches becomes fewer calls, and alice's still has its own slot.

A batch that fails fails each search in it with the same error (a 504 past the call's
time limit, a 503 when the engine is gone); a search whose caller went away (its
request cancelled) is left out of its batch's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np

#: Query vectors in one batch at most; more wait for the next (past a few dozen a
#: batch took longer per query here, not less: its answer is one JSON message).
MAX_BATCH = 32

Send = Callable[[str, str, np.ndarray, int, str, str], Awaitable[list]]


class SearchBatches:
    def __init__(self, send: Send):
        #: (owner, cid, queries, k, filter, caller) -> one list of hits per query vector.
        self.send = send
        self._busy: set[tuple] = set()
        self._waiting: dict[tuple, list[tuple[np.ndarray, asyncio.Future]]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def search(
        self, owner: str, cid: str, queries: np.ndarray, k: int, filter: str, caller: str
    ):
        key = (owner, cid, k, filter, caller)
        if key not in self._busy:
            self._busy.add(key)
            try:
                return await self.send(owner, cid, queries, k, filter, caller)
            finally:
                self._next(key)
        answer = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((queries, answer))
        return await answer

    def _next(self, key: tuple) -> None:
        """The searches that waited for ``key``'s last call, as one call; none: idle."""
        waiting = self._waiting.pop(key, [])
        batch, total = [], 0
        for queries, answer in waiting:
            if answer.done():  # its caller went away
                continue
            if batch and total + len(queries) > MAX_BATCH:
                self._waiting.setdefault(key, []).append((queries, answer))
                continue
            batch.append((queries, answer))
            total += len(queries)
        if not batch:
            if key in self._waiting:  # only callers that went away were left
                self._waiting.pop(key)
            self._busy.discard(key)
            return
        task = asyncio.get_running_loop().create_task(self._send_batch(key, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_batch(self, key: tuple, batch: list[tuple[np.ndarray, asyncio.Future]]):
        owner, cid, k, filter, caller = key
        try:
            queries = np.concatenate([q for q, _ in batch])
            found = await self.send(owner, cid, queries, k, filter, caller)
        except asyncio.CancelledError:  # the service stops: so do those waiting
            for _, answer in batch + self._waiting.pop(key, []):
                answer.cancel()
            self._busy.discard(key)
            raise
        except Exception as e:
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(e)
        else:
            start = 0
            for queries, answer in batch:
                if not answer.done():
                    answer.set_result(found[start : start + len(queries)])
                start += len(queries)
        self._next(key)
