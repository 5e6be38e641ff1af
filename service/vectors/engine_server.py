"""The embedded vector engine's process: FAISS indexes behind gpulab's write-ahead log,
served on a Unix socket (:mod:`.engine_transport`).

``python -m gpulab.service.vectors.engine_server DATA_DIR SOCKET PARENT_PID`` serves
:mod:`.engine_protocol` over ``SOCKET`` only: no TCP port, so no user's process on the
host can reach it; the socket's directory is the engine account's and the service's
alone. Every write is in its collection's log, fsynced, before it is answered
(:mod:`.wal`), so a kill -9 of this process loses no acknowledged row; a start replays
the logs after the last snapshot. The HNSW index is built behind the log by a thread
of its own (:mod:`.indexer`); rows not in it yet are searched exactly. Collections an
older gpulab kept in Milvus Lite (``DATA_DIR`` itself) are copied in at the first
start (:mod:`.lite_migration`).
It dies with the service that started it (``PARENT_PID``): the kernel kills it when
its parent goes, so no engine outlives a killed service. One engine at a time holds
``DATA_DIR`` (a lock): a second would write the same logs, and could keep answering
on connections made before the first was replaced, so it exits, saying why.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import signal
import sys
import threading
import time

from . import engine_protocol as protocol
from . import filters
from .embedded_store import NotFound, Store
from .engine_transport import Server
from .faiss_collection import EF_SEARCH, IdsTaken
from .filter_match import predicate

log = logging.getLogger("gpulab.service.vectors.engine")

#: The folder, in DATA_DIR, of this engine's collections.
FOLDER = "faiss"
#: In DATA_DIR: held (flock) by the engine that serves it, for its whole life.
LOCK_FILE = "engine.lock"

PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """SIGKILL when the parent goes; if it went already (before this ran), exit now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit("the service that started the vector engine is gone")


class Handlers:
    """One method per call of :data:`.engine_protocol.METHODS`: header (and vectors)
    in, header out."""

    def __init__(self, store: Store):
        self.store = store

    def create(self, h, _):
        self.store.create(h["db"], h["cid"], h["dim"], h["metric"], h["index"])
        return {}

    def drop(self, h, _):
        self.store.drop(h["db"], h["cid"])
        return {}

    def names(self, h, _):
        return {"collections": self.store.names()}

    def write(self, h, vectors):
        collection = self.store.get(h["db"], h["cid"])
        if vectors is None or vectors.shape != (len(h["ids"]), collection.dim):
            raise ValueError(f"{len(h['ids'])} ids need as many {collection.dim}-d vectors")
        collection.write(h["ids"], vectors, h["metadata"], new_only=bool(h.get("insert")))
        return {}

    def existing(self, h, _):
        return {"ids": self.store.get(h["db"], h["cid"]).existing(h["ids"])}

    def delete(self, h, _):
        self.store.get(h["db"], h["cid"]).delete(h["ids"])
        return {}

    def count(self, h, _):
        collection = self.store.get(h["db"], h["cid"])
        answer = {"count": collection.count(), "pending_index_rows": collection.pending()}
        if h.get("bytes"):  # what its rows cost (one user's budget): asked for by writes
            answer["bytes"] = collection.held_bytes()
        return answer

    def flush(self, h, _):
        """Writes paused: the indexer folds the log into a snapshot once the index
        caught up (no one waits for it)."""
        self.store.get(h["db"], h["cid"]).idle = True
        self.store.indexer.wake()
        return {}

    def search(self, h, queries):
        collection = self.store.get(h["db"], h["cid"])
        # The service parsed and bounded this filter already; it is parsed again here
        # with the same grammar, so nothing unbounded runs even if a caller skipped that.
        match = predicate(filters.parse(h["filter"])) if h.get("filter") else None
        if match is not None and h.get("time_limit_s") is not None:
            match = within(match, float(h["time_limit_s"]))
        found = collection.search(queries, h["k"], match, search_ef(h.get("ef", EF_SEARCH)))
        check_reply_size(found)
        return {"results": [[list(hit) for hit in hits] for hits in found]}

    def ping(self, h, _):
        return {}


class SearchTimedOut(Exception):
    """A filter still going through rows when the service had given the call up."""


class ReplyTooLarge(Exception):
    """A search's hits, with their rows' metadata, over MAX_SEARCH_REPLY."""


#: The most bytes of hits one search answers: each hit carries its row's metadata (up
#: to 64 KiB), and the service reads the answer whole.
MAX_SEARCH_REPLY = 32 << 20


def check_reply_size(found: list[list[tuple]]) -> None:
    """Refuse a search whose answer would pass MAX_SEARCH_REPLY, before writing it: a
    row's metadata is measured once however many queries found it."""
    size, measured = 0, {}
    for hits in found:
        for rid, _, meta in hits:
            n = measured.get(id(meta))
            if n is None:
                n = measured[id(meta)] = len(json.dumps(meta, separators=(",", ":")))
            size += n + len(str(rid)) + 32  # the id, the score and the brackets
            if size > MAX_SEARCH_REPLY:
                raise ReplyTooLarge(
                    f"the hits and their rows' metadata are over {MAX_SEARCH_REPLY >> 20} "
                    f"MiB, the most one search answers: ask for fewer (a smaller k, fewer "
                    f"queries)"
                )


#: Rows a timed filter reads between two looks at the clock.
ROWS_BETWEEN_CLOCK_LOOKS = 256


def within(match, seconds: float):
    """``match``, which raises SearchTimedOut once ``seconds`` have passed: the service
    abandons a call at its time limit, and the engine then stops the filter's work
    rather than go on for a caller who is gone (while others' calls wait)."""
    deadline = time.monotonic() + seconds
    seen = 0

    def timed(rid, meta):
        nonlocal seen
        seen += 1
        if seen % ROWS_BETWEEN_CLOCK_LOOKS == 0 and time.monotonic() > deadline:
            raise SearchTimedOut(
                "the filter was still reading rows when the call's time ran out "
                "(c.VectorSettings.vector_call_timeout); narrow it (fewer values, an id "
                "or a plain comparison first)"
            )
        return match(rid, meta)

    return timed


#: The widest search breadth a call may ask for (the service's setting is checked too).
MAX_EF = 4096


def search_ef(ef) -> int:
    """HNSW's search breadth a call asked for, an int within 1..MAX_EF."""
    if not isinstance(ef, int) or isinstance(ef, bool) or not 1 <= ef <= MAX_EF:
        raise ValueError(f"ef must be an integer from 1 to {MAX_EF}, not {ef!r}")
    return ef


#: Ids an insert's 409 names at most.
TAKEN_SHOWN = 5


def handler(fn):
    def call(request: bytes) -> bytes:
        try:
            header, vectors = protocol.unpack(request)
            return protocol.pack(fn(header, vectors))
        except NotFound as e:
            return protocol.pack({"status": 404, "error": str(e)})
        except IdsTaken as e:  # the service names the collection and the ids
            taken = sorted(e.ids)
            return protocol.pack(
                {"status": 409, "error": str(e), "taken": taken[:TAKEN_SHOWN], "n": len(taken)}
            )
        except filters.FilterError as e:
            return protocol.pack({"status": 400, "error": str(e)})
        except SearchTimedOut as e:
            return protocol.pack({"status": 504, "error": str(e)})
        except ReplyTooLarge as e:
            return protocol.pack({"status": 413, "error": str(e)})
        except (ValueError, KeyError, TypeError, FileExistsError) as e:
            return protocol.pack({"status": 400, "error": f"{type(e).__name__}: {e}"})
        except Exception as e:  # the engine's own failure: one line to the caller and the log
            log.exception("vector engine call failed")
            return protocol.pack({"status": 500, "error": f"{type(e).__name__}: {e}"})

    return call


def hold(data_dir: str) -> int:
    """Lock ``data_dir`` for this process's life (the kernel lets go when it exits, a
    kill -9 too); another engine holding it: exit, naming it."""
    os.makedirs(data_dir, exist_ok=True)
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        sys.exit(f"another vector engine (pid {holder}) serves {data_dir}; not starting")
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def serve(data_dir: str, socket_path: str) -> None:
    from . import lite_migration

    hold(data_dir)
    store = Store(os.path.join(data_dir, FOLDER))
    lite_migration.migrate(data_dir, store)
    handlers = Handlers(store)
    if os.path.exists(socket_path):  # a socket left by a killed engine
        os.unlink(socket_path)
    server = Server(
        socket_path, {name: handler(getattr(handlers, name)) for name in protocol.METHODS}
    )
    threading.Thread(target=server.serve_forever, name="engine-accept", daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"vector engine ready on {socket_path}", flush=True)
    stop.wait()
    server.stop()
    store.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m gpulab.service.vectors.engine_server DATA_DIR SOCKET PARENT_PID")
        return 2
    die_with(int(args[2]))
    logging.basicConfig(level=logging.WARNING)
    serve(args[0], args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
