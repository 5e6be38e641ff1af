"""The job spec and the per-node command line: pure functions, literal expectations."""

import json
import sys

import pytest

from gpulab.backend.failures import parse_summary, root_cause
from gpulab.backend.render import render_node
from gpulab.backend.spec import JobSpec, SpecError


def spec(**kw):
    s = JobSpec(
        code="print(1)",
        nodes=2,
        nproc_per_node=2,
        gpu_milli=500,
        max_restarts=3,
        checkpoint_every=50,
        amp="bf16",
        comm_hook="powersgd",
        out="model",
        env={"FOO": "bar"},
        id="abc123",
        user="alice",
        **kw,
    )
    s.validate()
    return s


def test_round_trips_through_json():
    s = spec()
    assert JobSpec.from_json(s.to_json()) == s
    assert s.world_size == 4
    assert s.rank_owners() == ["abc123/0", "abc123/1", "abc123/2", "abc123/3"]


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "'code' is required"),
        ({"code": " "}, "'code' must be the cell's source"),
        ({"code": "x", "nodes": 0}, "'nodes' must be an integer from 1 to 64, got 0"),
        ({"code": "x", "nodes": True}, "'nodes' must be an integer"),
        ({"code": "x", "amp": "fp8"}, "'amp' must be bf16 or fp16"),
        ({"code": "x", "comm_hook": "int8"}, "'comm_hook' must be powersgd, fp16 or bf16"),
        ({"code": "x", "out": "not a name"}, "'out' must be a Python variable name"),
        ({"code": "x", "env": {"PET_NNODES": "9"}}, "set by gpulab for every rank"),
        ({"code": "x", "env": {"A": 1}}, "values strings"),
        ({"code": "x", "name": "has space"}, "'name' must be 1-63 letters"),
        ({"code": "x", "vars_b64": "!!"}, "'vars_b64' must be base64"),
        ({"code": "x", "timeout": -1}, "'timeout' must be seconds >= 0"),
        ({"code": "x", "bogus": 1}, "unknown field: bogus"),
    ],
)
def test_bad_specs_say_what_is_wrong(data, message):
    with pytest.raises(SpecError) as e:
        JobSpec.from_dict(data)
    assert message in str(e.value)


def test_node_0_hosts_the_rendezvous_and_the_pet_variables_agree():
    s = spec()
    n0 = render_node(
        s,
        0,
        job_dir="/jobs/abc123",
        rdzv_host="10.0.0.1",
        rdzv_port=29400,
        local_addr="10.0.0.1",
        ifname="eth0",
        node_gpus=["GPU-a", "GPU-b"],
        launcher=["torchrun"],
    )
    assert n0.argv == [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=gpulab",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=abc123",
        "--rdzv-conf=is_host=1,timeout=120",
        "--max-restarts=3",
        "--monitor-interval=0.5",
        "--log-dir=/jobs/abc123/torchrun/node0",
        "--local-addr=10.0.0.1",
        "--module",
        "gpulab.training.runner",
        "/jobs/abc123",
    ]
    assert {k: v for k, v in n0.env.items() if k.startswith("PET_")} == {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_RDZV_BACKEND": "gpulab",
        "PET_RDZV_ENDPOINT": "10.0.0.1:29400",
        "PET_RDZV_ID": "abc123",
        "PET_MAX_RESTARTS": "3",
        "PET_MASTER_ADDR": "10.0.0.1",
        "PET_MASTER_PORT": "29400",
    }
    assert n0.env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert n0.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert n0.env["GPULAB_NODE_GPUS"] == "GPU-a,GPU-b"
    assert n0.env["GPULAB_GPU_MILLI"] == "500"
    assert n0.env["GPULAB_CHECKPOINT_EVERY"] == "50"
    assert n0.env["GPULAB_AMP"] == "bf16" and n0.env["GPULAB_COMM_HOOK"] == "powersgd"
    assert n0.env["GPULAB_OUT"] == "model" and n0.env["FOO"] == "bar"
    # The rendezvous secret's file, never the secret itself.
    assert n0.env["GPULAB_RDZV_SECRET_FILE"] == "/jobs/abc123/rdzv.secret"
    assert "GPULAB_RDZV_SECRET" not in n0.env


def test_node_1_joins_as_a_guest_from_its_own_address():
    n1 = render_node(
        spec(),
        1,
        job_dir="/jobs/abc123",
        rdzv_host="10.0.0.1",
        rdzv_port=29400,
        local_addr="10.0.0.2",
        ifname="eth1",
    )
    assert n1.argv[:3] == [sys.executable, "-m", "gpulab.training.launch"]
    assert "--rdzv-conf=is_host=0,timeout=120" in n1.argv
    assert "--local-addr=10.0.0.2" in n1.argv
    assert n1.env["PET_NODE_RANK"] == "1" and n1.env["GLOO_SOCKET_IFNAME"] == "eth1"
    with pytest.raises(ValueError):
        render_node(spec(), 2, job_dir="/j", rdzv_host="h", rdzv_port=1)


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
gpulab.training.runner FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_15:59:28
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 26025)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 26025
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_15:59:27
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 26024)
  error_file: /j/error.json
  traceback : Traceback (most recent call last):
    File "cell.py", line 18, in <module>
  RuntimeError: Connection closed by peer
============================================================
"""


def test_a_killed_rank_is_the_root_cause_not_the_survivor_torchrun_names():
    failures = parse_summary(SUMMARY)
    assert [(f["rank"], f["exitcode"], f["root"]) for f in failures] == [
        (1, -9, False),
        (0, 1, True),
    ]
    cause = root_cause(
        failures,
        [
            {
                "rank": 0,
                "type": "RuntimeError",
                "message": "closed",
                "traceback": "tb",
                "error_file": "/j/error.json",
            }
        ],
    )
    assert cause["rank"] == 1 and cause["type"] == "Signal"
    assert cause["message"] == "Signal 9 (SIGKILL) received by PID 26025"


def test_the_sigterm_torchrun_sends_survivors_is_not_the_root_cause():
    stopped = {
        "root": False,
        "rank": 0,
        "exitcode": -15,
        "traceback": "Signal 15 (SIGTERM) received by PID 10",
    }
    killed = {
        "root": True,
        "rank": 1,
        "exitcode": -9,
        "traceback": "Signal 9 (SIGKILL) received by PID 11",
    }
    assert root_cause([stopped, killed], [])["rank"] == 1
    assert root_cause([stopped], [])["rank"] == 0
    raised = {
        "rank": 1,
        "type": "ValueError",
        "message": "bad",
        "traceback": "TB",
        "error_file": "/j/1/error.json",
    }
    assert root_cause([stopped], [raised]) == raised


def test_without_a_signal_the_earliest_rank_record_wins():
    failures = parse_summary(SUMMARY)[1:]  # torchrun names rank 0 (same second)
    first = {
        "rank": 1,
        "type": "ValueError",
        "message": "boom",
        "traceback": "TB1",
        "error_file": "/j/1/error.json",
    }
    later = {
        "rank": 0,
        "type": "RuntimeError",
        "message": "closed",
        "traceback": "TB0",
        "error_file": "/j/0/error.json",
    }
    assert root_cause(failures, [first, later]) == first
    assert root_cause([], [later]) == later
    assert root_cause([], []) is None
    only_torchrun = root_cause(failures, [])
    assert only_torchrun["rank"] == 0 and only_torchrun["type"] == "ExitCode"
    assert json.dumps(only_torchrun)  # JSON-safe for the jobs table
