"""Nothing an endpoint's replica listens on is reachable by another user (issue 24).

A real hub run as root, a real deployment (a model-server replica as its owner's
account) and a second real Unix account, the attacker's. The attacker does what
anyone on the host can: finds the replica in ``/proc/*/cmdline``, the ports its
owner listens on in ``/proc/net/tcp``, the sockets in ``/proc/net/unix``, and
tries to connect to each (a connection alone would let them fill its slots or
guess at its secret) and to read the replica's record in its deployment folder.
Every try is refused; the owner's call through the hub (``tritonclient``, OIP v2)
still works. Only the GPUs are declared. Needs root: without it there are no
accounts to separate.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import numpy as np
import psutil
import pytest
import torch
import tritonclient.http as httpclient
from hubproc import fresh_user
from support.unix_http import unix_request
from support.wait import wait_until
from tritonclient.utils import InferenceServerException

from gpulab.client import Client
from gpulab.enforcement.accounts import UserAccounts, unix_name
from gpulab.serving.export import export_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="per-user accounts need root"),
]
OWNER, ATTACKER = fresh_user("owner"), fresh_user("mallory")
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep

#: Run as the attacker's account: find the replica of deployment argv[1] of the account
#: argv[2] (a uid) and connect to whatever it listens on. Prints one JSON line.
ATTACK = r"""
import json, os, socket, sys

dep_id, owner_uid = sys.argv[1], sys.argv[2]
found = {"pids": [], "ports": [], "sockets": [], "records": []}
results = {}


def connect(family, address):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(address)
    except OSError as e:
        return f"refused: {type(e).__name__}: {e.strerror}"
    with s:  # a connection alone is too much: it holds one of the replica's slots
        try:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return f"ALLOWED: connected, answered {s.recv(60)!r}"
        except OSError as e:
            return f"ALLOWED: connected ({e})"


for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    except OSError:
        continue
    if "gpulab.serving.server" in argv and any(dep_id in a for a in argv):
        found["pids"].append(int(pid))
        if "--port" in argv:
            found["ports"].append(int(argv[argv.index("--port") + 1]))
        model_dir = argv[argv.index("--model-dir") + 1]
        found["records"].append(os.path.join(os.path.dirname(model_dir), "replica0.json"))
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and cols[7] == owner_uid:  # LISTEN, the owner's
            found["ports"].append(int(cols[1].rsplit(":", 1)[1], 16))
for line in open("/proc/net/unix").read().splitlines()[1:]:
    cols = line.split()
    if len(cols) == 8 and dep_id in cols[7]:
        found["sockets"].append(cols[7])

for port in sorted(set(found["ports"])):
    results[f"tcp 127.0.0.1:{port}"] = connect(socket.AF_INET, ("127.0.0.1", port))
for path in sorted(set(found["sockets"])):
    results[f"unix {path}"] = connect(socket.AF_UNIX, path)
for path in found["records"]:
    try:
        results[f"read {path}"] = "ALLOWED: " + open(path).read()[:80]
    except OSError as e:
        results[f"read {path}"] = f"refused: {type(e).__name__}: {e.strerror}"
print("ATTACK-RESULT " + json.dumps({"uid": os.getuid(), "found": found, "results": results}))
"""


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub; this module's deployments are stopped at its end."""
    return plain_hub


@pytest.fixture(scope="module")
def deployment(hub, tmp_path_factory):
    """The owner's model, deployed and ready; ``(tokens, dep, model)``."""
    tokens = {u: hub.create_user(u) for u in (OWNER, ATTACKER)}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    path = tmp_path_factory.mktemp("replica-model")
    export_model(model, torch.randn(2, 4), str(path), name="m", max_batch_size=4)
    dep = Client(hub.api, token=tokens[OWNER]).create_deployment(
        str(path), {"name": "guarded", "gpu_milli": 0}
    )
    wait_until(
        lambda: (
            hub.gpulab("GET", "/deployments/guarded", token=tokens[OWNER]).json()["replicas_ready"]
            == 1
        ),
        "the owner's replica to answer ready",
        WAIT_S,
        detail=hub.log_tail,
    )
    return tokens, dep, model


def attack(hub, dep: dict) -> dict:
    """The attack above, run as the attacker's own Unix account."""
    account = UserAccounts(home_root=str(hub.data_dir / "home")).ensure(ATTACKER)
    owner_uid = pwd.getpwnam(unix_name(OWNER)).pw_uid  # made by the hub for the replica
    out = subprocess.run(
        [sys.executable, "-c", ATTACK, dep["id"], str(owner_uid)],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        timeout=120,
        **account.popen_kwargs(),
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("ATTACK-RESULT ")), None)
    assert line, f"no result:\n{out.stdout}\n{out.stderr}"
    result = json.loads(line.split(" ", 1)[1])
    assert result["uid"] == account.uid != owner_uid
    return result


def infer(hub, name: str, x: np.ndarray, token: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(
        f"127.0.0.1:{hub.port}/services/gpulab/endpoints/{OWNER}/{name}"
    )
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    headers = {"Authorization": f"token {token}"}
    return client.infer(name, [inp], headers=headers).as_numpy("output")


def test_another_account_reaches_nothing_the_replica_listens_on(hub, deployment):
    tokens, dep, model = deployment
    result = attack(hub, dep)
    found = result["found"]
    # Every connection (and the replica's record) is refused...
    allowed = {k: v for k, v in result["results"].items() if not v.startswith("refused")}
    assert not allowed, f"reached: {allowed}"
    # ...though the attacker found the replica and its socket, as anyone on the host can.
    assert found["pids"] and found["sockets"], found
    assert all("PermissionError" in result["results"][f"unix {p}"] for p in found["sockets"])

    # Seen as root: the replica listens on no TCP or UDP port at all, only its socket,
    # and that socket is the live replica (the service reaches it; its secret still holds).
    [pid] = found["pids"]
    assert psutil.Process(pid).net_connections(kind="inet") == []
    [path] = set(found["sockets"])
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    status, body = unix_request(path, "GET", "/v2/models/guarded")
    assert status == 401 and "endpoint URL" in body["error"]


def test_the_owners_call_through_the_hub_still_works(hub, deployment):
    tokens, dep, model = deployment
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    expected = model(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(
        infer(hub, "guarded", x, tokens[OWNER]), expected, rtol=1e-5, atol=1e-6
    )
    # The attacker's own token at the hub's door: refused there too.
    with pytest.raises(InferenceServerException) as info:
        infer(hub, "guarded", x, tokens[ATTACKER])
    assert info.value.status() == "403"
