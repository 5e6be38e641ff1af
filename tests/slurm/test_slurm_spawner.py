"""Users' servers as Slurm jobs: a real hub (`gpulab up` with the sandbox's settings
from ``gpulab.spawner.slurm.sandbox_settings``) spawns a 1/4-GPU server that runs as
a Slurm job on the node the ledger chose, as the user's Unix account, and the hub
reaches it through the proxy; stopping it leaves no Slurm job and no allocation.

Real Slurm, real namespaces as nodes, real JupyterHub and single-user server. The
GPUs are GRES without hardware (this machine has none).
"""

import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import hubproc
import psutil
import pytest
import requests
from hubproc import RunningHub, fresh_user
from kernelexec import run_in_kernel
from slurmhelpers import needs_slurm
from support.wait import wait_until

from gpulab.backend.slurm_sandbox import env as sandbox_env
from gpulab.enforcement.accounts import unix_name
from gpulab.spawner.slurm import env_file, sandbox_settings

pytestmark = [needs_slurm, pytest.mark.slow, pytest.mark.netns]


def squeue(sandbox) -> list[dict]:
    env = {**os.environ, **sandbox_env(sandbox["data_dir"])}
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i|%T|%N|%u|%b|%k"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    keys = ("id", "state", "node", "user", "gres", "comment")
    return [
        dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()
    ]


@pytest.fixture(scope="module")
def slurm_hub(sandbox, slurm_base):
    info = {
        "data_dir": sandbox["data_dir"],
        "slurm_conf": sandbox_env(sandbox["data_dir"])["SLURM_CONF"],
        "controller_address": sandbox["ctl_addr"],
        "nodes": [{"name": n["name"], "address": n["addr"]} for n in sandbox["nodes"]],
        "spawner": True,
    }
    # The spawner is off unless asked for: its lines come commented out.
    off = sandbox_settings({**info, "spawner": False})
    assert '# c.JupyterHub.spawner_class = "gpulab-slurm"' in off.splitlines()
    assert 'c.InventorySettings.inventory_class = "slurm"' in off.splitlines()
    addr = sandbox["ctl_addr"]
    on = sandbox_settings(info).splitlines()
    # The nodes reach the service on the bridge, as they reach the hub's API.
    assert f"c.GpuLabService.extra_listen_ips = [{addr!r}]" in on
    assert f"c.FractionalSlurmSpawner.gpulab_connect_ip = {addr!r}" in on
    # Servers outlive a hub restart (the last test restarts it and re-attaches). Jobs
    # run on Slurm too, as `gpulab slurm-sandbox up` configures them.
    config = (
        sandbox_settings(info)
        + 'c.GpuLabService.jobs_backend_class = "slurm"\n'
        + "c.JupyterHub.cleanup_servers = False\n"
    )
    hub = RunningHub(slurm_base / "hub", simulate="", config=config)
    try:
        yield hub
    finally:
        hub.stop()


def server_process(user: str) -> psutil.Process:
    return hubproc.server_process("JUPYTERHUB_USER", user)


def test_env_file_quotes_every_value_and_leaves_slurms_gpus_alone():
    text = env_file({"A": "it's $HOME", "CUDA_VISIBLE_DEVICES": "GPU-x", "bad-name": "x"})
    assert text == "A='it'\"'\"'s $HOME'\n"
    out = subprocess.run(
        ["sh", "-c", f'set -a\n{text}echo "$A"'], capture_output=True, text=True
    ).stdout
    assert out == "it's $HOME\n"


def server_jobs(sandbox, user: str) -> list[dict]:
    return [j for j in squeue(sandbox) if j["comment"] == f"gpulab-server:{user}/"]


def status(hub, user: str, token: str) -> requests.Response:
    return requests.get(
        f"{hub.url}/user/{user}/api/status",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )


def test_a_quarter_gpu_server_runs_as_a_slurm_job_of_the_user(slurm_hub, sandbox):
    hub = slurm_hub
    user = fresh_user("slurm")
    token = hub.create_user(user)
    node_names = {n["name"] for n in sandbox["nodes"]}
    inventory = hub.gpulab("GET", "/inventory").json()
    assert {n["name"] for n in inventory["nodes"]} == node_names

    r = hub.spawn(user, {"gpu_milli": 250})
    assert r.status_code in (201, 202), r.text
    try:
        hub.wait_server(user, timeout=240)
    except AssertionError:
        raise AssertionError(f"server did not start:\n{hub.log_tail(6000)}") from None

    # The ledger placed a quarter of one GPU on a sandbox node...
    rows = [a for a in hub.gpulab("GET", "/allocations").json() if a["user"] == user]
    assert [(a["owner_kind"], a["milli"]) for a in rows] == [("server", 250)]
    node = rows[0]["node"]
    assert node in node_names

    # ...and Slurm runs the server there, as the user's account, holding that share.
    account = unix_name(user)
    jobs = server_jobs(sandbox, user)
    assert len(jobs) == 1, squeue(sandbox)
    job = jobs[0]
    assert (job["state"], job["node"], job["user"]) == ("RUNNING", node, account)
    assert job["gres"] == "gres:shard:5"  # 40 shards over 2 GPUs: 20 per GPU, 1/4 = 5

    proc = server_process(user)
    assert proc.username() == account
    env = proc.environ()
    assert env["GPULAB_GPU_MILLI"] == "250"
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")  # Slurm's choice, not the ledger's UUID
    assert env["JUPYTERHUB_SERVICE_URL"].startswith("http://0.0.0.0:")
    # The node's namespace: the server's hostname is the Slurm node's.
    assert Path(f"/proc/{proc.pid}/root/etc/hostname").exists()
    uts = subprocess.run(
        ["nsenter", "-t", str(proc.pid), "-u", "hostname"], capture_output=True, text=True
    ).stdout.strip()
    assert uts == node

    # The hub's API token travels in a file only the user reads, never on a command line.
    api_token = env["JUPYTERHUB_API_TOKEN"]
    job_dir = Path(hub.home(user)) / ".gpulab" / "slurm" / "default"
    st = (job_dir / "env.sh").stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == proc.uids().real
    for p in psutil.process_iter(["cmdline"]):
        assert api_token not in " ".join(p.info["cmdline"] or []), p

    # The hub reaches it through the proxy.
    r = status(hub, user, token)
    assert r.status_code == 200, r.text
    assert "started" in r.json()

    # Stop: no Slurm job, no allocation.
    r = hub.hub_api("DELETE", f"/users/{user}/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_server(user, ready=False)
    wait_until(
        lambda: not [j for j in squeue(sandbox) if j["comment"] == f"gpulab-server:{user}/"],
        "the server's Slurm job to be gone",
        timeout=60,
        detail=lambda: str(squeue(sandbox)),
    )
    assert [a for a in hub.gpulab("GET", "/allocations").json() if a["user"] == user] == []
    with pytest.raises(LookupError):
        server_process(user)


def test_two_gpus_on_a_shard_partition_are_refused_and_nothing_is_kept(slurm_hub, sandbox):
    hub = slurm_hub
    user = fresh_user("slurm")
    hub.create_user(user)
    r = hub.spawn(user, {"gpu_milli": 2000})
    assert r.status_code == 400, r.text
    assert "cannot be held with shards" in r.json()["message"]
    hub.wait_server(user, ready=False)
    assert [a for a in hub.gpulab("GET", "/allocations").json() if a["user"] == user] == []
    assert server_jobs(sandbox, user) == []


#: Run in the kernel of a server on a Slurm node: %gpulab's status, a request with no
#: token, and %%train_distributed across both nodes (the site's backend: no --backend).
ON_A_NODE = """
import json, os, urllib.error, urllib.request
from IPython.utils.capture import capture_output

api = os.environ["GPULAB_API_URL"]
with capture_output() as status:
    get_ipython().run_line_magic("gpulab", "")
print("STATUS " + json.dumps([status.stdout, *(o.data["text/plain"] for o in status.outputs)]))
try:
    urllib.request.urlopen(api + "/inventory", timeout=30)
    print("ANONYMOUS 200")
except urllib.error.HTTPError as e:
    print("ANONYMOUS", e.code)
cell = "import os\\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\\n"
get_ipython().run_cell_magic("train_distributed", TRAIN_FLAGS, cell)
token = {"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]}
with urllib.request.urlopen(urllib.request.Request(api + "/jobs", headers=token)) as r:
    (job,) = [j for j in json.load(r) if j["name"] == "on-slurm"]
print("JOB", job["id"])
# A forwarded-for header from a node: not believed (the audit keeps the node's address).
spoof = {**token, "X-Forwarded-For": "203.0.113.9"}
req = urllib.request.Request(api + "/jobs/" + job["id"], method="DELETE", headers=spoof)
urllib.request.urlopen(req, timeout=30).close()
"""
TRAIN_FLAGS = "--nodes 2 --gpu 0 --name on-slurm"


def test_magics_in_a_server_on_a_slurm_node_reach_the_service(slurm_hub, sandbox):
    hub = slurm_hub
    user = fresh_user("slurm")
    token = hub.create_user(user)
    r = hub.spawn(user, {"gpu_milli": 0})
    assert r.status_code in (201, 202), r.text
    try:
        hub.wait_server(user, timeout=240)
    except AssertionError:
        raise AssertionError(f"server did not start:\n{hub.log_tail(6000)}") from None
    (server_job,) = server_jobs(sandbox, user)
    node_addr = {n["name"]: n["addr"] for n in sandbox["nodes"]}[server_job["node"]]
    env = server_process(user).environ()
    api = env["GPULAB_API_URL"]
    # The bridge, on the service's own port (gpulab up's), not the public 127.0.0.1 URL.
    port = json.loads((hub.data_dir / "ports.json").read_text())["service_port"]
    assert api == f"http://{sandbox['ctl_addr']}:{port}/services/gpulab/api/v1", api

    code = f"TRAIN_FLAGS = {TRAIN_FLAGS!r}\n{ON_A_NODE}"
    try:
        out = run_in_kernel(f"{hub.url}/user/{user}", token, code, timeout=300)
    except RuntimeError:
        raise AssertionError(f"the cell failed; hub log:\n{hub.log_tail(4000)}") from None
    lines = out.splitlines()
    status = json.loads(next(ln for ln in lines if ln.startswith("STATUS "))[7:])
    said = "\n".join(status)
    assert f"API: {api}" in said, said
    # The alert line came from the service: "Alerts: ...", not "Alerts are not available".
    assert re.search(r"^Alerts: ", said, re.M), said
    # And where this site's GPUs are: the one Slurm pool, with its free slices.
    assert re.search(r"^Pools: slurm .*1/4 GPU x\d+", said, re.M), said
    # The service still wants a token on the bridge.
    assert "ANONYMOUS 401" in lines, out
    said_job = [ln[4:] for ln in lines if ln.startswith("JOB ")]
    assert said_job, out  # the magic said why it did not submit
    job_id = said_job[0]
    assert f"job {job_id} succeeded" in out, out

    job = hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
    assert (job["state"], job["world_size"]) == ("succeeded", 2), job
    # The site's backend, without --backend: a Slurm job.
    assert (job["backend"], job["pool"], job["slurm_job_id"].isdigit()) == ("slurm", "slurm", True)
    logs = hub.gpulab("GET", f"/jobs/{job_id}/logs", token=token).text
    assert "rank 0 of 2" in logs and "rank 1 of 2" in logs, logs

    # A peer on the bridge is not a trusted proxy: its X-Forwarded-For is not believed.
    entries = hub.gpulab("GET", f"/audit?action=job.cancel&subject={job_id}").json()["entries"]
    assert [e["source"] for e in entries] == [node_addr], entries

    hub.hub_api("DELETE", f"/users/{user}/server")
    hub.wait_server(user, ready=False)


def test_a_restarted_hub_finds_the_server_by_its_slurm_job(slurm_hub, sandbox):
    # Last in the module: it stops the module's hub and runs a new one on its data dir.
    hub = slurm_hub
    user = fresh_user("slurm")
    token = hub.create_user(user)
    r = hub.spawn(user, {"gpu_milli": 500})
    assert r.status_code in (201, 202), r.text
    hub.wait_server(user, timeout=240)
    (job,) = server_jobs(sandbox, user)
    pid = server_process(user).pid

    # The hub goes away (cleanup_servers is off): the Slurm job stays.
    hub.proc.send_signal(signal.SIGTERM)
    hub.proc.wait(timeout=120)
    assert [j["id"] for j in server_jobs(sandbox, user)] == [job["id"]]

    again = RunningHub(
        hub.data_dir, simulate="", config=(hub.data_dir / "gpulab_config.py").read_text()
    )
    try:
        model = again.wait_server(user, timeout=120)
        assert model["servers"][""]["ready"]
        r = status(again, user, token)
        assert r.status_code == 200, r.text
        assert server_process(user).pid == pid  # the same server, not a new one
        assert [
            a["milli"] for a in again.gpulab("GET", "/allocations").json() if a["user"] == user
        ] == [500]

        again.hub_api("DELETE", f"/users/{user}/server")
        again.wait_server(user, ready=False)
        wait_until(
            lambda: not server_jobs(sandbox, user), "the server's Slurm job to be gone", timeout=60
        )
        assert [a for a in again.gpulab("GET", "/allocations").json() if a["user"] == user] == []
    finally:
        again.stop()


def test_a_hub_user_named_as_a_system_account_gets_no_server_as_it(tmp_path):
    """With ``unix_user_template = "{username}"``, a hub user named root (an approved
    sign-up, an OAuth login) ran their server as root on the nodes."""
    import asyncio
    from types import SimpleNamespace

    from tornado import web

    from gpulab.enforcement.accounts import first_user_uid
    from gpulab.spawner.slurm import FractionalSlurmSpawner

    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t\t 1500\nUID_MAX 60000\n")
    assert first_user_uid(str(defs)) == 1500
    assert first_user_uid(str(tmp_path / "none")) == 1000
    for name in ("root", "daemon"):
        spawner = FractionalSlurmSpawner(unix_user_template="{username}")
        spawner.user = SimpleNamespace(name=name)
        with pytest.raises(web.HTTPError) as refused:
            asyncio.run(spawner._cluster_account())  # noqa: SLF001
        assert refused.value.status_code == 403
        assert "is a system account" in refused.value.log_message


def test_sbatch_reads_the_script_on_stdin_not_from_the_users_folder(tmp_path, monkeypatch):
    """sbatch runs as root: given ``<user's folder>/job.sh`` it opened whatever the
    user had linked there (a root-only file) as the script. It gets the text the
    spawner wrote, on stdin."""
    import asyncio
    from types import SimpleNamespace

    from gpulab.enforcement.accounts import Account
    from gpulab.spawner import slurm_job_dir
    from gpulab.spawner.slurm import FractionalSlurmSpawner

    secret = tmp_path / "shadow"
    secret.write_text("root's secret\n")
    written = {}

    def make_as(account, server, files):
        path = slurm_job_dir.path_in(account.home, server)
        os.makedirs(path)
        written.update(files)
        os.symlink(secret, os.path.join(path, "job.sh"))  # the user's race, won
        return path

    monkeypatch.setattr(slurm_job_dir, "make_as", make_as)
    spawner = FractionalSlurmSpawner()
    spawner.user = SimpleNamespace(name="ann")
    spawner.account = Account("ann", 1500, 1500, (1500,), str(tmp_path / "home"))
    spawner.get_env = lambda: {"A": "1"}
    runs = []

    async def run(argv, *, user=None, input=None, timeout=30):
        runs.append((argv, input))
        return "42\n"

    asyncio.run(spawner._submit(SimpleNamespace(run=run, partition=""), "n1", "", 250))  # noqa: SLF001
    [(argv, stdin)] = runs
    assert argv[0] == "sbatch" and not any(a.endswith("job.sh") for a in argv)
    assert stdin == written["job.sh"][0].encode() and stdin.startswith(b"#!/bin/sh")
    assert spawner.slurm_job_id == "42"
