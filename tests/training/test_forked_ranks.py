"""Ranks forked from their node's agent (training.launch) are the ranks a new
interpreter would have been: their own session, argv, seeds and environment."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "backend"))
from localrun import new_spec, run  # noqa: E402

from gpulab.backend.local import LocalBackend  # noqa: E402

WHO_AM_I = """
import json, os, random, socket, stat, sys
import numpy as np
from gpulab.training import setup

def listening():  # before setup(): then rank 0 listens for its peers itself
    found = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                s = socket.socket(fileno=fd)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    found.append(s.getsockname())
                s.detach()
        except OSError:
            pass
    return found

inherited = listening()
ctx = setup()
with open(os.path.join(os.environ["GPULAB_JOB_DIR"], f"who{ctx.rank}.json"), "w") as f:
    json.dump({
        "pid": os.getpid(), "sid": os.getsid(0),
        "parent": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode().split("\\0"),
        "argv": sys.argv,
        "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0"),
        "numpy": np.random.rand(), "random": random.random(), "listening": inherited,
        "rank_env": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"],
    }, f)
"""


def ranks_of(tmp_path, monkeypatch, start: str | None) -> list[dict]:
    if start:
        monkeypatch.setenv("GPULAB_RANK_START", start)
    backend = LocalBackend(str(tmp_path / "jobs"))
    status, jd = run(backend, new_spec(WHO_AM_I, nproc_per_node=2))
    assert status.state == "succeeded", (status, open(jd.p("logs", "rank0.log")).read())
    return [json.load(open(jd.p(f"who{r}.json"))) for r in (0, 1)], jd


def test_ranks_are_forked_from_the_agent_and_are_still_ranks_of_their_own(tmp_path, monkeypatch):
    ranks, jd = ranks_of(tmp_path, monkeypatch, None)
    for r, who in enumerate(ranks):
        # No new interpreter: the rank's command line is its agent's.
        assert "gpulab.training.launch" in who["cmdline"], who["cmdline"]
        assert who["parent"] == who["cmdline"]
        assert who["sid"] == who["pid"]  # a session of its own, as torchrun's workers
        assert who["argv"][1:] == [jd.path] and who["argv"][0].endswith("runner.py")
        assert (who["rank_env"], who["local_rank"]) == (str(r), str(r))
        assert json.load(open(jd.p("pids", f"rank{r}.json")))["pid"] == who["pid"]
        # Not the agent's rendezvous port: a rank that outlived it would hold it.
        assert who["listening"] == []
    # Forked from one process, the ranks still draw different random numbers.
    assert ranks[0]["numpy"] != ranks[1]["numpy"]
    assert ranks[0]["random"] != ranks[1]["random"]


def test_a_site_can_start_each_rank_as_a_new_interpreter(tmp_path, monkeypatch):
    ranks, jd = ranks_of(tmp_path, monkeypatch, "exec")
    for who in ranks:
        assert who["cmdline"][1:4] == ["-u", "-m", "gpulab.training.runner"], who["cmdline"]
        assert "gpulab.training.launch" in who["parent"]
        assert who["sid"] == who["pid"]
        assert who["argv"][1:] == [jd.path]
