"""Run inside a network namespace: move a known number of bytes over TCP and
report this namespace's NIC counters before and after, as one JSON line.

    netns_traffic.py recv ADDR PORT NBYTES
    netns_traffic.py send ADDR PORT NBYTES
"""

import json
import socket
import sys
import time

from gpulab.telemetry.nic import NicSampler

CHUNK = 64 * 1024


def counters() -> dict:
    return {n["device"]: n for n in NicSampler().sample()}


def recv(addr: str, port: int, nbytes: int) -> dict:
    with socket.create_server((addr, port)) as server:
        before = counters()
        print("listening", flush=True)  # the test starts the sender after this
        conn, _ = server.accept()
        with conn:
            got = 0
            while got < nbytes:
                data = conn.recv(CHUNK)
                if not data:
                    break
                got += len(data)
            conn.sendall(b"ok")
    return {"got": got, "before": before, "after": counters()}


def send(addr: str, port: int, nbytes: int) -> dict:
    before = counters()
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=20)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        block = b"\xab" * CHUNK
        sent = 0
        while sent < nbytes:
            sent += conn.send(block[: min(CHUNK, nbytes - sent)])
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(2) == b"ok"
    return {"sent": sent, "before": before, "after": counters()}


if __name__ == "__main__":
    role, addr, port, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    result = recv(addr, port, nbytes) if role == "recv" else send(addr, port, nbytes)
    print(json.dumps(result), flush=True)
