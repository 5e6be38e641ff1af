"""``gpulab agent``: sample this node at an interval and POST it to the service.

Usage (the CLI wires ``gpulab agent`` to ``main``)::

    GPULAB_AGENT_TOKEN=… python -m gpulab.telemetry.agent \\
        --service-url http://hub:8000/services/gpulab/api/v1/telemetry

Each POST carries one sample (see ``gpulab.telemetry.sample``) as its JSON
body, with ``Content-Type: application/json`` and ``Authorization: token
<token>``. The token comes from ``$GPULAB_AGENT_TOKEN``, else
``$JUPYTERHUB_API_TOKEN``, else ``--token-file``; it is never taken on the
command line (where ``ps`` shows it) and never logged.

When the service cannot be reached, answers 5xx, 401/403 or 429, samples wait
in a bounded backlog (oldest dropped first) and sending is retried with
exponential backoff (with jitter, capped by ``--max-backoff``), oldest first,
while sampling goes on at the interval. A sample the service rejects as
malformed (400, 413, 422) is dropped and logged, so one bad sample cannot
block the rest.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable

from gpulab.client.tls import client_context
from gpulab.enforcement.peer_account import foreign_listener

from .collect import NodeSampler

log = logging.getLogger("gpulab.telemetry.agent")

TOKEN_ENVS = ("GPULAB_AGENT_TOKEN", "JUPYTERHUB_API_TOKEN")
DROP_STATUSES = {400, 413, 422}


class Rejected(Exception):
    """The service refused this sample for good; don't send it again."""


class HttpSender:
    """POSTs one sample as JSON over a kept-alive connection; raises unless 2xx.

    One connection for the agent's life (reopened after any failure) keeps a
    1 Hz agent from paying a TCP and TLS handshake every second. Proxy
    variables are not consulted: the service is inside the cluster.
    """

    def __init__(self, url: str, token: str | None, timeout_s: float = 10.0):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--service-url must be an http(s) URL, not {url!r}")
        self.url = url
        self._token = token
        self.timeout_s = timeout_s
        self._parts = parts
        self._target = parts.path or "/"
        if parts.query:
            self._target += "?" + parts.query
        self._conn: http.client.HTTPConnection | None = None

    def __repr__(self) -> str:  # keep the token out of any log line or traceback
        return f"HttpSender({self.url!r})"

    def redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            # A new connection to a port of this machine: not if another account took
            # it while the service was down (root's service, or this account's, only).
            foreign = foreign_listener(self.url, also=(0,))
            if foreign:
                raise ConnectionRefusedError(f"not sending the agent's token: {foreign}")
            host, port = self._parts.hostname, self._parts.port
            if self._parts.scheme == "https":
                # The chart's internal TLS: the service's CA is in GPULAB_CA_FILE.
                self._conn = http.client.HTTPSConnection(
                    host, port, timeout=self.timeout_s, context=client_context()
                )
            else:
                self._conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __call__(self, sample: dict) -> None:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"token {self._token}"
        try:
            conn = self._connection()
            conn.request("POST", self._target, body=json.dumps(sample).encode(), headers=headers)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise OSError(f"POST to {self.url} failed: {err!r}") from None
        if response.will_close:
            self.close()
        if response.status >= 300:
            text = self.redact(body[:500].decode(errors="replace"))
            if response.status in DROP_STATUSES:
                raise Rejected(f"HTTP {response.status}: {text}")
            raise OSError(f"HTTP {response.status}: {text}")


class Agent:
    """The sampling/sending loop, separate from argument parsing for tests."""

    def __init__(
        self,
        sample: Callable[[], dict],
        send: Callable[[dict], None],
        *,
        interval_s: float = 1.0,
        count: int = 0,
        backlog: int = 300,
        max_backoff_s: float = 60.0,
        stop: threading.Event | None = None,
        redact: Callable[[str], str] = lambda text: text,
    ):
        if interval_s <= 0:
            raise ValueError("the interval must be a positive number of seconds")
        self._sample, self._send = sample, send
        self.interval_s = interval_s
        self.count = count
        self.max_backoff_s = max_backoff_s
        self.stop = stop or threading.Event()
        self.backlog: collections.deque[dict] = collections.deque(maxlen=backlog)
        self.sent = self.dropped = self.taken = 0
        self._redact = redact
        self._failures = 0
        self._next_send = 0.0

    def run(self) -> int:
        """Loop until stopped (or ``count`` samples); 0 when nothing is left unsent."""
        next_sample = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if self._sampling() and now >= next_sample:
                self._take()
                # Keep to the grid; after a stall, start afresh instead of bursting.
                next_sample = max(next_sample + self.interval_s, now)
            if self.backlog and now >= self._next_send:
                self._flush()
            if not self._sampling() and (not self.backlog or self._failures >= 3):
                break
            wake = [next_sample] if self._sampling() else []
            if self.backlog:
                wake.append(self._next_send)
            self.stop.wait(max(0.0, min(wake, default=now + 0.1) - time.monotonic()))
        return 0 if not self.backlog else 1

    def _sampling(self) -> bool:
        return not self.count or self.taken < self.count

    def _take(self) -> None:
        if len(self.backlog) == self.backlog.maxlen:
            self.dropped += 1  # the deque drops the oldest on append
        self.backlog.append(self._sample())
        self.taken += 1

    def _flush(self) -> None:
        while self.backlog and not self.stop.is_set():
            try:
                self._send(self.backlog[0])
            except Rejected as err:
                log.error("the service rejected a sample, dropping it: %s", err)
                self.backlog.popleft()
                self.dropped += 1
                continue
            except Exception as err:
                self._failures += 1
                delay = min(self.max_backoff_s, self.interval_s * 2 ** (self._failures - 1))
                delay *= random.uniform(0.5, 1.0)  # agents of many nodes shouldn't sync up
                self._next_send = time.monotonic() + delay
                log.warning(
                    "sending failed (%s); %d samples waiting, retrying in %.1fs",
                    self._redact(str(err)),
                    len(self.backlog),
                    delay,
                )
                return
            self.backlog.popleft()
            self.sent += 1
            if self._failures:
                log.info("sending works again after %d failures", self._failures)
            self._failures = 0


def _print_json(sample: dict) -> None:
    sys.stdout.write(json.dumps(sample) + "\n")
    sys.stdout.flush()


def read_token(token_file: str | None) -> str | None:
    for name in TOKEN_ENVS:
        if os.environ.get(name):
            return os.environ[name].strip()
    if token_file:
        with open(token_file) as f:
            return f.read().strip() or None
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpulab agent",
        description="Sample this node's GPUs, NICs, RDMA ports and dataset cache "
        "and send the samples to the gpulab service.",
        epilog="The token is read from $GPULAB_AGENT_TOKEN or $JUPYTERHUB_API_TOKEN "
        "(or --token-file), never from the command line.",
    )
    parser.add_argument(
        "--service-url",
        help="where to POST samples, e.g. http://hub:8000/services/gpulab/api/v1/telemetry",
    )
    parser.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="write samples to stdout as JSON lines instead of posting",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between samples (default 1)",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=0,
        metavar="N",
        help="stop after N samples (default 0: run until stopped)",
    )
    parser.add_argument("--node", help="node name in samples (default: the hostname)")
    parser.add_argument(
        "--cache-dir",
        help="dataset cache to report (default $GPULAB_CACHE_DIR or ~/.cache/gpulab/datasets)",
    )
    parser.add_argument(
        "--token-file", help="file holding the API token (when neither token variable is set)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="HTTP timeout per POST (default 10)",
    )
    parser.add_argument(
        "--max-backoff",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait between retries (default 60)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=300,
        metavar="N",
        help="samples kept while the service is unreachable (default 300)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the agent; returns the process exit status."""
    try:
        return _run(build_parser(), argv)
    except SystemExit as exit_:  # argparse's --help and usage errors
        return exit_.code if isinstance(exit_.code, int) else 2


def _run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.interval <= 0 or args.count < 0 or args.backlog < 1:
        parser.error("--interval must be > 0, --count >= 0 and --backlog >= 1")
    redact = lambda text: text  # noqa: E731
    if args.print_only:
        send: Callable[[dict], None] = _print_json
    elif not args.service_url:
        parser.error("give --service-url (or --print to write samples to stdout)")
    else:
        token = read_token(args.token_file)
        if not token:
            parser.error(
                "no API token: set GPULAB_AGENT_TOKEN (or JUPYTERHUB_API_TOKEN), "
                "or pass --token-file"
            )
        try:
            send = HttpSender(args.service_url, token, args.timeout)
        except ValueError as err:
            parser.error(str(err))
        redact = send.redact
        log.info("sending samples every %gs to %s", args.interval, args.service_url)

    sampler = NodeSampler(node=args.node, cache_dir=args.cache_dir)
    agent = Agent(
        sampler.sample,
        send,
        interval_s=args.interval,
        count=args.count,
        backlog=args.backlog,
        max_backoff_s=args.max_backoff,
        redact=redact,
    )
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: agent.stop.set())
    try:
        return agent.run()
    finally:
        sampler.close()
        if isinstance(send, HttpSender):
            send.close()
        log.info(
            "stopped: %d samples taken, %d sent, %d dropped, %d unsent",
            agent.taken,
            agent.sent,
            agent.dropped,
            len(agent.backlog),
        )


if __name__ == "__main__":
    sys.exit(main())
