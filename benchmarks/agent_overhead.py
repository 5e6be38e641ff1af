"""Node agent: CPU cost of sampling and posting at 1 Hz, as % of one core.

Runs ``gpulab agent`` as its own process, posting to a real HTTP server on
127.0.0.1, next to an anchor measured in the same run: a bare Python process
waking at the same interval and doing nothing. CPU time is read from
``/proc/<pid>/stat`` (user + system) after both have warmed up, so start-up
imports are not counted.

    python benchmarks/agent_overhead.py [--seconds 30] [--interval 1]
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import gpulab.cache as cache

TICKS = os.sysconf("SC_CLK_TCK")


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    posts = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts += 1
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="gpulab-agent-bench-")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    # A dataset cache with some history, so the cache sampler does real work.
    shard = os.path.join(work, "shard.bin")
    with open(shard, "wb") as f:
        f.write(os.urandom(2**20))
    for _ in range(3):
        cache.open(shard, cache_dir=os.path.join(work, "cache")).close()

    env = {
        **os.environ,
        "GPULAB_AGENT_TOKEN": "benchmark-token",
        "GPULAB_CACHE_DIR": os.path.join(work, "cache"),
    }
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulab.telemetry.agent",
            "--interval",
            str(args.interval),
            "--service-url",
            f"http://127.0.0.1:{httpd.server_port}/telemetry",
            "--log-level",
            "WARNING",
        ],
        env=env,
    )
    anchor = subprocess.Popen(
        [sys.executable, "-c", f"import time\nwhile True:\n    time.sleep({args.interval})"]
    )
    try:
        deadline = time.monotonic() + 60
        while Sink.posts < 2:  # imports done, NVML tried, first samples sent
            if time.monotonic() > deadline or agent.poll() is not None:
                print("the agent did not start posting", file=sys.stderr)
                return 1
            time.sleep(0.1)
        start = time.monotonic()
        cpu0 = {p.pid: cpu_seconds(p.pid) for p in (agent, anchor)}
        posts0 = Sink.posts
        time.sleep(args.seconds)
        wall = time.monotonic() - start
        cpu = {p.pid: cpu_seconds(p.pid) - cpu0[p.pid] for p in (agent, anchor)}
        posts = Sink.posts - posts0
        rss = rss_mib(agent.pid)
    finally:
        for p in (agent, anchor):
            p.send_signal(signal.SIGTERM)
        for p in (agent, anchor):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        httpd.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    agent_pct = 100 * cpu[agent.pid] / wall
    anchor_pct = 100 * cpu[anchor.pid] / wall
    print(
        f"{wall:.1f} s at {args.interval:g} s interval: {posts} samples posted "
        f"(CPU clock tick {1000 / TICKS:.0f} ms)"
    )
    print(
        f"agent:  {agent_pct:6.3f} % of one core, "
        f"{1000 * cpu[agent.pid] / max(posts, 1):.2f} ms CPU per sample, RSS {rss:.0f} MiB"
    )
    print(f"anchor: {anchor_pct:6.3f} % of one core (a Python process waking at the same rate)")
    print(f"agent / 1 % budget of one core: {agent_pct / 1.0:.2f}x")
    print(f"agent - anchor: {agent_pct - anchor_pct:.3f} percentage points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
