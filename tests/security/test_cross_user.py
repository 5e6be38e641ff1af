"""Users are separated on the host: the attacks of issue 11, from alice's kernel,
alice's job rank and alice's model replica, against bob and the hub.

Everything is real: a hub run as root, a Unix account per user
(``gpulab-alice``, ``gpulab-bob``), JupyterLab servers, kernels driven over
their websocket, torchrun ranks and model-server replicas. Only the GPUs are
declared. Needs root (CI runs as root): without it there are no accounts to
separate, and the test says so.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
import requests
import torch
from hubproc import fresh_user
from kernelexec import run_in_kernel
from support.wait import wait_until

from gpulab.client import Client
from gpulab.enforcement.accounts import unix_name
from gpulab.serving.export import export_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="per-user accounts need root"),
]
#: The users: names no other test of the session has (their accounts gpulab-<name>).
ALICE, BOB = fresh_user("alice"), fresh_user("bob")
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep
ATTACKS = (Path(__file__).with_name("attacks.py")).read_text()
SECRETS = (
    "admin-token",
    "service-token",
    "proxy-token",
    "admin-password",
    "jupyterhub_cookie_secret",
    "jupyterhub.sqlite",
    "gpulab.sqlite",
    "gpulab_config.py",
    "ports.json",
    "mlflow-token",
)


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub; this module's deployments, jobs and servers are
    stopped at its end."""
    return plain_hub


def until(what, check, timeout=WAIT_S):
    return wait_until(check, what, timeout)


def procs_of(uid: int, needle: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        try:
            if p.info["uids"].real == uid and needle in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, TypeError):
            pass
    return found


def attack(run, targets: dict) -> dict:
    """Run the attack script through ``run(source) -> output``; its parsed result."""
    out = run(f"TARGETS = {json.dumps(targets)}\n{ATTACKS}")
    line = next((ln for ln in out.splitlines() if "ATTACK-RESULT " in ln), None)
    assert line, f"no result in the output:\n{out}"
    return json.loads(line.split("ATTACK-RESULT ", 1)[1])


def run_as_job(hub, token, source: str) -> str:
    job = hub.gpulab("POST", "/jobs", token=token, json={"code": source, "name": "probe"}).json()
    assert "id" in job, job
    done = until(
        "the probe job",
        lambda: (
            (j := hub.gpulab("GET", f"/jobs/{job['id']}", token=token).json())["state"]
            in ("succeeded", "failed")
            and j
        ),
    )
    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=token).text
    assert done["state"] == "succeeded", f"{done}\n{logs}"
    return logs


@pytest.fixture(scope="module")
def world(hub, tmp_path_factory):
    """alice and bob, each with a server; bob also with a kernel, a running job and
    a model replica: everything alice will go after."""
    tokens = {u: hub.create_user(u) for u in (ALICE, BOB)}
    hub.spawn_ready({ALICE: {"gpu_milli": 250}, BOB: {"gpu_milli": 250}})
    uid = {u: pwd.getpwnam(unix_name(u)).pw_uid for u in (ALICE, BOB)}
    bob_server = f"{hub.url}/user/{BOB}"

    # bob keeps a secret in his home and leaves a kernel running.
    run_in_kernel(
        bob_server,
        tokens[BOB],
        "import os; open(os.path.expanduser('~/secret.txt'), 'w').write('bob')",
    )
    r = requests.post(
        f"{bob_server}/api/kernels",
        json={},
        headers={"Authorization": f"token {tokens[BOB]}"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    bob_kernel = until("bob's kernel", lambda: procs_of(uid[BOB], "ipykernel_launcher"))[0]
    bob_lab = until("bob's server", lambda: procs_of(uid[BOB], "jupyterhub-singleuser"))[0]

    # bob's job: one rank that waits.
    job = hub.gpulab(
        "POST",
        "/jobs",
        token=tokens[BOB],
        json={"code": "import time\ntime.sleep(900)", "name": "long"},
    ).json()
    until(
        "bob's job running",
        lambda: (
            hub.gpulab("GET", f"/jobs/{job['id']}", token=tokens[BOB]).json()["state"] == "running"
        ),
    )
    job_dir = hub.data_dir / "jobs" / job["id"]
    bob_rank = until("bob's rank", lambda: procs_of(uid[BOB], "gpulab.training.runner"))[0]

    # bob's model replica.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    path = tmp_path_factory.mktemp("bobmodel")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="m", max_batch_size=4)
    dep = Client(hub.api, token=tokens[BOB]).create_deployment(
        str(path), {"name": "bobmodel", "gpu_milli": 100}
    )
    until(
        "bob's replica",
        lambda: (
            hub.gpulab("GET", "/deployments/bobmodel", token=tokens[BOB]).json()["replicas_ready"]
            == 1
        ),
    )
    bob_replica = until(
        "bob's replica process", lambda: procs_of(uid[BOB], "gpulab.serving.server")
    )[0]
    dep_dir = hub.data_dir / "deployments" / dep["id"]

    hub_proc = psutil.Process(hub.proc.pid)
    chp = [p for p in hub_proc.children() if "configurable-http-proxy" in " ".join(p.cmdline())]
    bobs_and_hubs = [
        bob_lab.pid,
        bob_kernel.pid,
        bob_rank.pid,
        bob_replica.pid,
        hub.proc.pid,
        hub.service_pid(),
    ]
    targets = {
        "read": [
            *(str(hub.data_dir / s) for s in SECRETS),
            str(hub.home(BOB) / "secret.txt"),
            str(job_dir / "cell.py"),
            str(job_dir / "spec.json"),
            str(job_dir / "logs" / "rank0.log"),
            str(dep_dir / "token"),
            str(dep_dir / "model" / "model.pt2"),
        ],
        "list": [
            str(hub.data_dir),
            str(hub.home(BOB)),
            str(job_dir),
            str(hub.data_dir / "jobs"),
            str(hub.data_dir / "deployments"),
        ],
        "write": [
            str(hub.home(BOB) / "planted.txt"),
            str(job_dir / "logs" / "planted.log"),
            str(hub.data_dir / "planted.txt"),
        ],
        "environ": [*bobs_and_hubs, *(p.pid for p in chp)],
        "signal": bobs_and_hubs,
    }
    # Every target exists (seen as root), so "refused" below is a refusal, not a typo.
    for path in targets["read"] + targets["list"]:
        assert os.path.exists(path), path
    return {
        "tokens": tokens,
        "uid": uid,
        "targets": targets,
        "job": job,
        "dep": dep,
        BOB: {"server": bob_lab.pid, "rank": bob_rank.pid, "replica": bob_replica.pid},
    }


def assert_all_refused(result: dict, world: dict) -> None:
    allowed = {k: v for k, v in result["results"].items() if v != "refused"}
    assert not allowed, f"not refused: {allowed}"
    assert result["uid"] == world["uid"][ALICE] and result["user"] == unix_name(ALICE)
    assert 0 not in result["groups"] and result["gid"] != 0


def test_alices_kernel_reaches_nothing_of_bobs_or_the_hubs(hub, world):
    own = str(hub.home(ALICE) / "mine.txt")
    run_in_kernel(
        f"{hub.url}/user/{ALICE}", world["tokens"][ALICE], f"open({own!r}, 'w').write('alice')"
    )
    result = attack(
        lambda src: run_in_kernel(f"{hub.url}/user/{ALICE}", world["tokens"][ALICE], src),
        {**world["targets"], "own": [own]},
    )
    assert_all_refused(result, world)
    assert result["own"] == {own: "ALLOWED"}  # her own home works
    assert os.stat(hub.home(ALICE)).st_mode & 0o777 == 0o700
    assert os.stat(own).st_uid == world["uid"][ALICE]


def test_alices_job_ranks_reach_nothing_of_bobs_or_the_hubs(hub, world):
    logs = run_as_job(
        hub, world["tokens"][ALICE], f"TARGETS = {json.dumps(world['targets'])}\n{ATTACKS}"
    )
    line = next(ln for ln in logs.splitlines() if "ATTACK-RESULT " in ln)
    assert_all_refused(json.loads(line.split("ATTACK-RESULT ", 1)[1]), world)


def test_a_compile_cache_alice_plants_in_tmp_never_holds_bobs_code(hub, world):
    """torch.compile keeps code it loads again in /tmp/torchinductor_<account> unless
    told otherwise: alice can make bob's folder first, writable by all, and swap code
    into it. bob's server, kernels, ranks and replicas keep theirs in his home."""
    planted = Path(tempfile.gettempdir(), f"torchinductor_{unix_name(BOB)}")
    shutil.rmtree(planted, ignore_errors=True)  # one an earlier run left
    run_in_kernel(
        f"{hub.url}/user/{ALICE}",
        world["tokens"][ALICE],
        f"import os; os.makedirs({str(planted)!r}); os.chmod({str(planted)!r}, 0o777)",
    )
    try:
        assert planted.stat().st_uid == world["uid"][ALICE]
        out = run_in_kernel(
            f"{hub.url}/user/{BOB}",
            world["tokens"][BOB],
            "import torch\n"
            "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
            "torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))\n"
            "print('CACHE', cache_dir())",
        )
        cache = Path(next(ln for ln in out.splitlines() if ln.startswith("CACHE ")).split()[1])
        assert cache.is_relative_to(hub.home(BOB)), cache
        assert cache.stat().st_uid == world["uid"][BOB]
        assert list(planted.iterdir()) == []
        for unit, pid in world[BOB].items():
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            env = dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)
            assert env.get("TORCHINDUCTOR_CACHE_DIR") == str(cache), unit
    finally:
        shutil.rmtree(planted, ignore_errors=True)


def test_alices_replica_runs_as_alice_and_her_job_files_are_hers(hub, world, tmp_path):
    torch.manual_seed(1)
    path = tmp_path / "m"
    export_model(
        torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(),
        torch.randn(2, 4),
        str(path),
        name="m",
        max_batch_size=4,
    )
    alice = Client(hub.api, token=world["tokens"][ALICE])
    dep = alice.create_deployment(str(path), {"name": "alicemodel", "gpu_milli": 0})
    until(
        "alice's replica",
        lambda: (
            hub.gpulab("GET", "/deployments/alicemodel", token=world["tokens"][ALICE]).json()[
                "replicas_ready"
            ]
            == 1
        ),
    )
    replica = until(
        "alice's replica process", lambda: procs_of(world["uid"][ALICE], "gpulab.serving.server")
    )
    creds = replica[0].uids(), replica[0].gids()
    assert set(creds[0]) == {world["uid"][ALICE]} and 0 not in set(creds[1])
    dep_dir = hub.data_dir / "deployments" / dep["id"]
    st = os.stat(dep_dir)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o750)  # root's; alice's group may read
    assert os.stat(dep_dir / "token").st_mode & 0o077 == 0  # the secret is root's alone
    # bob's job folder: root's, group bob's, nobody else.
    job_dir = hub.data_dir / "jobs" / world["job"]["id"]
    assert os.stat(job_dir).st_mode & 0o007 == 0
    assert os.stat(job_dir / "logs").st_uid == world["uid"][BOB]


def memory_group(pid: int) -> str | None:
    """The cgroup v1 memory folder of a process, or None."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return f"/sys/fs/cgroup/memory{path}"
    return None


@pytest.mark.skipif(
    not os.path.isdir("/sys/fs/cgroup/memory") or os.path.exists("/run/systemd/system"),
    reason="checks cgroup v1 directly (this kind of host; CI's too)",
)
def test_bobs_server_rank_and_replica_are_held_to_limits_he_cannot_change(hub, world):
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for unit, pid in world[BOB].items():
        folder = memory_group(pid)
        assert folder and f"/gpulab/{unix_name(BOB)}/" in folder, (unit, folder)
        limit = int(Path(folder, "memory.limit_in_bytes").read_text())
        assert 0 < limit < host, (unit, limit)
        assert os.stat(Path(folder, "cgroup.procs")).st_uid == 0  # root's: he cannot leave
    # The server was started with the slice's limits, and says which in its environment.
    env = hub.server_env(BOB)
    assert env["GPULAB_LIMITS"].startswith("cgroup v1: ")
    assert env["GPULAB_GPU_ENFORCEMENT"] == "none: a simulated GPU"


def test_admins_still_see_and_manage_everything(hub, world):
    jobs = hub.gpulab("GET", "/jobs").json()  # the admin token
    assert world["job"]["id"] in {j["id"] for j in jobs}
    assert hub.gpulab("GET", f"/jobs/{world['job']['id']}/logs").status_code == 200
    deps = hub.gpulab("GET", "/deployments", params={"user": BOB}).json()
    assert "bobmodel" in {d["name"] for d in deps}
    # alice's token gets nothing of bob's through the API either.
    alice = world["tokens"][ALICE]
    for method, path in (
        ("GET", f"/jobs/{world['job']['id']}"),
        ("GET", f"/jobs/{world['job']['id']}/logs"),
        ("DELETE", f"/jobs/{world['job']['id']}"),
    ):
        assert hub.gpulab(method, path, token=alice).status_code == 404
    r = hub.gpulab("DELETE", f"/jobs/{world['job']['id']}")
    assert r.status_code == 200, r.text
