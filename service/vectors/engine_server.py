"""The vector engine's process: Milvus Lite on a Unix socket.

``python -m gpulab.service.vectors.engine_server DATA_DIR SOCKET PARENT_PID`` serves the Milvus
gRPC API over ``SOCKET`` only: no TCP port, so no user's process on the host can reach
it; the socket's directory is the engine account's and the service's alone. Milvus
Lite writes every insert to its write-ahead log (flushed to the OS before it answers),
so a kill -9 of this process loses no acknowledged row; it replays the log on start.
It dies with the service that started it (``PARENT_PID``): the kernel kills it when
its parent goes, so no engine outlives a killed service and holds its data's lock.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from concurrent import futures

#: gRPC worker threads: the service sends calls from a pool of the same size.
WORKERS = 8
#: Messages up to this size (a 1,000-row batch of 4,096-d vectors is 16 MB).
MAX_MESSAGE = 64 * 2**20


PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """SIGKILL when the parent goes; if it went already (before this ran), exit now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit("the service that started the vector engine is gone")


def serve(data_dir: str, socket_path: str) -> None:
    import grpc
    from milvus_lite.adapter.grpc.servicer import MilvusServicer
    from milvus_lite.db import MilvusLite
    from pymilvus.grpc_gen import milvus_pb2_grpc

    db = MilvusLite(data_dir)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            # pymilvus pings every 10 s, idle or not; gRPC's defaults answer a client
            # that pings an idle server with GOAWAY (too_many_pings), a reconnect.
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
        ],
    )
    milvus_pb2_grpc.add_MilvusServiceServicer_to_server(MilvusServicer(db), server)
    if os.path.exists(socket_path):  # a socket left by a killed engine
        os.unlink(socket_path)
    server.add_insecure_port("unix:" + socket_path)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"vector engine ready on {socket_path}", flush=True)
    stop.wait()
    server.stop(grace=5).wait()
    db.close()


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
