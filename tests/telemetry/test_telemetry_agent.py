"""The agent posting to a real local HTTP server."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest

from gpulab.telemetry.agent import Agent, HttpSender, main
from gpulab.telemetry.sample import validate_sample

TOKEN = "s3cret-token-value"


@pytest.fixture(autouse=True)
def token_env(monkeypatch, tmp_path):
    monkeypatch.setenv("GPULAB_AGENT_TOKEN", TOKEN)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.setenv("GPULAB_CACHE_DIR", str(tmp_path / "no-cache-here"))


def test_main_posts_samples_with_the_token(sink, caplog):
    caplog.set_level(logging.DEBUG)
    rc = main(["--service-url", sink.url, "--count", "3", "--interval", "0.05", "--node", "node-7"])
    assert rc == 0
    assert len(sink.posts) == 3
    for post in sink.posts:
        assert post["headers"]["Authorization"] == f"token {TOKEN}"
        assert post["headers"]["Content-Type"] == "application/json"
        assert validate_sample(post["body"]) == []
        assert post["body"]["node"] == "node-7"
        assert "no dataset cache" in post["body"]["missing"]["cache"]
    timestamps = [p["body"]["ts"] for p in sink.posts]
    assert timestamps == sorted(timestamps)
    assert TOKEN not in caplog.text


def numbered_agent(sink, count: int) -> Agent:
    """An agent sending samples 0, 1, 2... to the sink, ``count`` of them, quickly."""
    samples = iter(range(100))
    sender = HttpSender(sink.url, TOKEN, 10)
    return Agent(
        lambda: {"n": next(samples)}, sender, interval_s=0.02, count=count, max_backoff_s=0.05
    )


def test_failures_are_retried_in_order_and_the_token_never_logged(sink, caplog):
    caplog.set_level(logging.DEBUG)
    sink.script = [503, 401]  # the 401 reply body echoes the token
    agent = numbered_agent(sink, count=4)
    assert agent.run() == 0
    assert [b["n"] for b in sink.delivered()] == [0, 1, 2, 3]
    assert agent.sent == 4 and agent.dropped == 0
    assert "HTTP 401" in caplog.text and "***" in caplog.text
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(agent._send)


def test_a_rejected_sample_is_dropped_not_retried(sink, caplog):
    sink.script = [200, 400]
    agent = numbered_agent(sink, count=3)
    assert agent.run() == 0
    assert [b["n"] for b in sink.delivered()] == [0, 2]
    assert agent.dropped == 1
    assert "rejected" in caplog.text


def test_an_unreachable_service_gives_up_after_the_last_sample(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/telemetry"  # nothing listens
    agent = Agent(
        lambda: {"n": 1},
        HttpSender(url, TOKEN, 5),
        interval_s=0.01,
        count=2,
        backlog=5,
        max_backoff_s=0.02,
    )
    assert agent.run() == 1
    assert len(agent.backlog) == 2
    assert "retrying" in caplog.text


def test_the_backlog_is_bounded():
    agent = Agent(
        lambda: {},
        lambda s: (_ for _ in ()).throw(OSError("down")),
        interval_s=0.001,
        count=10,
        backlog=3,
        max_backoff_s=10,
    )
    assert agent.run() == 1
    assert len(agent.backlog) == 3 and agent.dropped == 7


def test_usage_errors_return_a_status(capsys, monkeypatch):
    assert main([]) == 2
    assert "--service-url" in capsys.readouterr().err
    monkeypatch.delenv("GPULAB_AGENT_TOKEN")
    assert main(["--service-url", "http://127.0.0.1:9/x"]) == 2
    assert "GPULAB_AGENT_TOKEN" in capsys.readouterr().err
    assert main(["--interval", "0", "--print"]) == 2


def test_token_file(sink, tmp_path, monkeypatch):
    monkeypatch.delenv("GPULAB_AGENT_TOKEN")
    (tmp_path / "token").write_text(TOKEN + "\n")
    assert (
        main(["--service-url", sink.url, "--count", "1", "--token-file", str(tmp_path / "token")])
        == 0
    )
    assert sink.posts[0]["headers"]["Authorization"] == f"token {TOKEN}"


@pytest.mark.timeout(60)
def test_the_agent_process_stops_cleanly_on_sigterm(sink):
    env = {**os.environ, "GPULAB_AGENT_TOKEN": TOKEN}
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulab.telemetry.agent",
            "--service-url",
            sink.url,
            "--interval",
            "0.2",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.wait_for_posts(2, timeout=40)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 0
    assert "stopped" in err and TOKEN not in err


def test_print_mode_writes_json_lines(capsys):
    assert main(["--print", "--count", "2", "--interval", "0.01"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(validate_sample(json.loads(line)) == [] for line in lines)
