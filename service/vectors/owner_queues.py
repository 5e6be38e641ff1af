"""Work queues, one per user: a slow user cannot stall another.

Keyed by whoever makes the calls (the service's engine clients key them by the
caller, whosever collections the calls touch: bob, given carol's collection, holds
no more slots for it than for his own). "Owner" below is that key.

The engine has ``slots`` calls' worth of threads. One owner may hold at most
``per_owner`` of them at a time; the rest of their calls wait in their own queue. A
freed slot goes to the next owner in turn (round robin over those waiting), not to
whoever queued first, so alice's search runs as soon as a slot frees even when bob
has a hundred expensive ones queued before it, and with ``per_owner`` below
``slots`` a slot is free for her while bob's run.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque


class OwnerQueues:
    def __init__(self, slots: int, per_owner: int):
        self.slots = slots
        self.per_owner = per_owner
        self.running: dict[str, int] = {}
        #: Owners with calls waiting, in turn order; each with its waiting calls' futures.
        self.waiting: OrderedDict[str, deque[asyncio.Future]] = OrderedDict()

    @property
    def busy(self) -> int:
        return sum(self.running.values())

    async def run(self, owner: str, call):
        """``await call()`` once ``owner`` has a slot."""
        await self._acquire(owner)
        try:
            return await call()
        finally:
            self._release(owner)

    async def _acquire(self, owner: str) -> None:
        if not self.waiting.get(owner) and self._may_start(owner):
            self.running[owner] = self.running.get(owner, 0) + 1
            return
        turn = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(owner, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release(owner)  # a slot was given as it was cancelled: pass it on
            else:
                self._forget(owner, turn)
            raise

    def _may_start(self, owner: str) -> bool:
        return self.busy < self.slots and self.running.get(owner, 0) < self.per_owner

    def _release(self, owner: str) -> None:
        self.running[owner] -= 1
        if not self.running[owner]:
            del self.running[owner]
        if owner in self.waiting:  # just served: the others waiting go first
            self.waiting.move_to_end(owner)
        self._dispatch()

    def _dispatch(self) -> None:
        """Give free slots to waiting owners in turn; one served goes to the back."""
        progressed = True
        while progressed and self.busy < self.slots:
            progressed = False
            for owner in list(self.waiting):
                if self.busy >= self.slots:
                    break
                if self.running.get(owner, 0) >= self.per_owner:
                    continue
                turn = self.waiting[owner].popleft()
                if not self.waiting[owner]:
                    del self.waiting[owner]
                else:
                    self.waiting.move_to_end(owner)
                self.running[owner] = self.running.get(owner, 0) + 1
                turn.set_result(None)
                progressed = True

    def _forget(self, owner: str, turn: asyncio.Future) -> None:
        queue = self.waiting.get(owner)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self.waiting[owner]
