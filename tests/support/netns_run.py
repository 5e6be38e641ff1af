"""Processes in a node's network namespace (a "node" of the multi-node tests), and
waiting for all of them."""

from __future__ import annotations

import os
import subprocess
import time


def start_in_namespace(ns: str, argv: list[str], env: dict, log_path: str, **popen):
    """``argv`` in namespace ``ns`` (``ip netns exec``), in a session of its own, its
    output (both streams) to ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **popen,
        )


def wait_all(procs: list[subprocess.Popen], timeout: float | None = None) -> None:
    """Wait for every process (``timeout`` for all together); kill what is left."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=None if deadline is None else max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
