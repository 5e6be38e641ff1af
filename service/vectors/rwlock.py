"""A readers-writer lock that prefers writers: many searches at once, or one change.

A waiting writer holds back new readers, so a stream of searches (eight clients that
never pause) cannot starve a write or the indexer's add. Not reentrant: a thread that
holds it for reading must not ask for it again while a writer waits.
"""

from __future__ import annotations

import threading


class RWLock:
    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    def read(self) -> _Held:
        return _Held(self, False)

    def write(self) -> _Held:
        return _Held(self, True)

    def _acquire(self, write: bool) -> None:
        with self._cond:
            if write:
                self._writers_waiting += 1
                try:
                    while self._writing or self._readers:
                        self._cond.wait()
                finally:
                    self._writers_waiting -= 1
                self._writing = True
            else:
                while self._writing or self._writers_waiting:
                    self._cond.wait()
                self._readers += 1

    def _release(self, write: bool) -> None:
        with self._cond:
            if write:
                self._writing = False
            else:
                self._readers -= 1
            self._cond.notify_all()


class _Held:
    def __init__(self, lock: RWLock, write: bool):
        self.lock, self.write = lock, write

    def __enter__(self):
        self.lock._acquire(self.write)

    def __exit__(self, *exc):
        self.lock._release(self.write)
