"""A Slurm job's rendezvous against another account on the cluster's network (issue 24).

A real 2-node job on the sandbox, through the real service, as alice's account;
from the submit host (which reaches the nodes over the sandbox's bridge, as any
machine on a cluster's network does) the ``nobody`` account writes a pickle, a
state naming itself as a node, and junk into the job's rendezvous store while the
job runs. The pickle never runs, and the job finishes untouched.
"""

import glob
import os
import stat
import subprocess
import sys
import uuid

import pytest
from cells import LINEAR
from slurmhelpers import needs_slurm, service_config
from support.service import running_service
from support.wait import wait_until, wait_until_async

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "security"))
from test_rendezvous_secret import ATTACKER  # noqa: E402

pytestmark = [needs_slurm, pytest.mark.slow, pytest.mark.netns]


@pytest.fixture
async def svc(slurm_base, sandbox):
    async with running_service(slurm_base / "service", service_config(sandbox), simulate="") as s:
        yield s


def listening(port: int) -> list[str]:
    """The addresses port ``port`` listens on, in any of the sandbox nodes' namespaces."""
    found = []
    for path in glob.glob("/run/netns/gplsb*"):
        ns = os.path.basename(path)
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{port}"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        found += [line.split()[3] for line in out.splitlines() if line.strip()]
    return found


async def test_a_slurm_job_survives_another_accounts_pickle_join_and_junk(svc, sandbox, slurm_base):
    # Paths alice's ranks can reach: the gate they wait at, and where a pickle run as
    # alice would leave its mark.
    shared = slurm_base / f"attack-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    shared.chmod(0o777)
    gate, marker = shared / "go", shared / "pwned"
    alice = svc.create_user("alice")
    body = {
        "code": LINEAR,
        "backend": "slurm",
        "nodes": 2,
        "nproc_per_node": 1,
        "env": {"STEPS": "12", "GATE": str(gate)},
    }
    r = await svc.request("POST", "/jobs", alice, json=body)
    assert r.status_code in (200, 201), r.text
    job_id = r.json()["id"]
    jd = svc.data_dir / "jobs" / job_id

    async def training():
        m = (await svc.request("GET", f"/jobs/{job_id}/metrics", alice)).json()
        assert m["state"] not in ("succeeded", "failed", "cancelled"), m
        return len(m["records"]) >= 2

    await wait_until_async(training, f"job {job_id} training on both nodes", every=0.3)

    # The secret: alice's only (root's file, alice's private group, no one else).
    st = os.stat(jd / "rdzv.secret")
    account = (jd / "logs").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, account.st_gid, 0o640)
    secret = (jd / "rdzv.secret").read_text().strip()
    for node in (0, 1):
        assert secret not in (jd / "slurm" / f"node{node}.json").read_text()
    # The store: node rank 0's agent, on its node's address only.
    [port_file] = glob.glob(str(jd / "pids" / "rdzv-port.*"))
    port = int(open(port_file).read())
    # One node's agent listens, on that node's own address (not 0.0.0.0 or *).
    [where] = listening(port)
    addr = where.rsplit(":", 1)[0]
    assert addr in {n["addr"] for n in sandbox["nodes"]}, where

    attack_log = shared / "attacker.log"

    def logs() -> str:
        paths = [*glob.glob(str(jd / "logs" / "*.log")), str(attack_log)]
        return "\n".join(
            f"--- {p}\n{open(p, errors='replace').read()[-2000:]}"
            for p in paths
            if os.path.exists(p)
        )

    with open(attack_log, "wb") as out:
        attacker = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             sys.executable, "-c", ATTACKER, addr, str(port), job_id, str(marker)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: (
                "round 20:" in attack_log.read_text()
                and all(
                    "not signed with this job's secret"
                    in (jd / "logs" / f"node{n}.log").read_text()
                    for n in (0, 1)
                )
            ),
            "the attack running and both agents refusing its states",
            detail=logs,
        )
        assert "connected as uid 65534" in attack_log.read_text()
    finally:
        os.killpg(attacker.pid, 9)
        attacker.wait()
        gate.touch()

    async def ended():
        job = (await svc.request("GET", f"/jobs/{job_id}", alice)).json()
        return job if job["state"] in ("succeeded", "failed", "cancelled") else None

    job = await wait_until_async(ended, f"job {job_id} to end", every=0.3)
    assert not marker.exists(), "the attacker's pickle ran as alice"
    assert job["state"] == "succeeded", logs()
    assert job["restarts"] == 0
    for r in (0, 1):
        assert f"rank {r}/2 done" in (jd / "logs" / f"rank{r}.log").read_text()
