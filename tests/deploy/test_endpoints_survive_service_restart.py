"""Endpoints keep answering while the gpulab service restarts after a kill -9.

A real hub, a real replica, calls through the hub's proxy one after another from a
thread; the service is killed with SIGKILL and the hub starts it again. Without the
standby router (killed first, as it was before there was one) calls get 503 until
the next service is up. With it, no call that starts after the kill fails: the
standby answers on the dead service's socket from the service's endpoint table.
Only the call the dead process was answering at that moment is lost with it. A
stranger's token is refused (403) throughout.
"""

import os
import select
import signal
import stat
import threading
import time

import pytest
import requests
import torch
from hubproc import fresh_user
from support.wait import wait_until

from gpulab.client import Client
from gpulab.service.endpoints.standby import PIDFILE
from gpulab.service.endpoints.table import TABLE_NAME, read_table
from gpulab.serving.export import export_model

pytestmark = pytest.mark.slow
CALLS_AFTER = 20  # calls the next service answers before the count ends
BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    path = tmp_path_factory.mktemp("model")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="ignored", max_batch_size=8)
    return str(path)


class Caller:
    """Calls the endpoint one after another in a thread: when each started, its status
    (0: no HTTP answer at all)."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token
        self.answers: list[tuple[float, int]] = []
        self.refusals: list[tuple[float, int, str]] = []  # what failed calls were told
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        session = requests.Session()
        headers = {"Authorization": f"token {self.token}"}
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                r = session.post(self.url, json=BODY, headers=headers, timeout=60)
                status, text = (
                    r.status_code,
                    r.text[:60]
                    if r.headers.get("Content-Type", "").startswith("application/json")
                    else r.reason,
                )
            except requests.RequestException as e:
                status, text = 0, type(e).__name__
            self.answers.append((started, status))
            if status not in (200, 403):
                self.refusals.append((started, status, text))

    def since(self, moment: float) -> list[int]:
        return [s for t, s in list(self.answers) if t >= moment]

    def before(self, moment: float) -> list[int]:
        return [s for t, s in list(self.answers) if t < moment]

    def down_for(self, moment: float) -> float:
        """Seconds from ``moment`` to the start of the first call answered after it."""
        return min(t for t, s in list(self.answers) if t >= moment and s == 200) - moment

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)


def standby_pid(hub) -> int | None:
    try:
        pid = int((hub.data_dir / PIDFILE).read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if b"endpoint-standby" in f.read() else None
    except (OSError, ValueError):
        return None


def table_has_ready(hub, user: str, name: str) -> bool:
    try:
        table = read_table(str(hub.data_dir / TABLE_NAME))
    except (OSError, ValueError):
        return False
    return any(
        e["user"] == user and e["name"] == name and any(v["ready"] for v in e["versions"])
        for e in table["endpoints"]
    )


def kill_service_while_called(hub, callers: list[Caller], ok: int = 200) -> float:
    """kill -9 the service while ``callers`` call; returns when the next service is up
    and has answered CALLS_AFTER more calls of the first caller. When the killed
    process was gone (its sockets closed: calls sent to it until then die with it)."""
    first = callers[0]
    wait_until(lambda: first.since(0).count(ok) >= 5, "calls to be answered before the kill")
    old = hub.service_pid()
    pidfd = os.pidfd_open(old)
    try:
        os.kill(old, signal.SIGKILL)
        select.select([pidfd], [], [])  # readable once it has exited
        gone = time.monotonic()
    finally:
        os.close(pidfd)
    hub.wait_service_restarted(old)
    back = time.monotonic()
    wait_until(
        lambda: first.since(back).count(ok) >= CALLS_AFTER,
        "calls answered by the next service",
        detail=lambda: str(first.since(back)[-20:]),
    )
    return gone


def test_endpoint_calls_are_answered_while_the_service_restarts(hub, model_dir):
    owner, stranger = fresh_user("steady"), fresh_user("stranger")
    token, other = hub.create_user(owner), hub.create_user(stranger)
    Client(hub.api, token=token).create_deployment(model_dir, {"name": "steady", "gpu_milli": 100})
    wait_until(
        lambda: (
            hub.gpulab("GET", "/deployments/steady", token=token).json().get("replicas_ready") == 1
        ),
        "the endpoint's replica ready",
    )
    url = f"{hub.url}/services/gpulab/endpoints/{owner}/steady/v2/models/steady/infer"
    table = hub.data_dir / TABLE_NAME
    wait_until(lambda: table_has_ready(hub, owner, "steady"), "the endpoint in the table")
    # It holds the replicas' token: the service's account alone reads it.
    assert stat.S_IMODE(table.stat().st_mode) == 0o600
    assert table.stat().st_uid == os.getuid()

    # As before the standby: without it, calls fail until the next service is up.
    old_standby = standby_pid(hub)
    assert old_standby, "no standby endpoint router runs beside the service"
    os.kill(old_standby, signal.SIGKILL)
    caller = Caller(url, token)
    try:
        gone = kill_service_while_called(hub, [caller])
    finally:
        caller.stop()
    without = [s for s in caller.since(gone) if s != 200]
    print(
        f"\nwithout the standby: {len(without)} failed calls ({set(without)}) in the "
        f"{caller.down_for(gone):.1f} s after the service was gone"
    )
    assert without, "no call failed while the service was down, standby or not"

    # With it: the next service has started a standby of its own.
    wait_until(lambda: standby_pid(hub) not in (None, old_standby), "a new standby router")
    wait_until(lambda: table_has_ready(hub, owner, "steady"), "the endpoint in the new table")
    caller, intruder = Caller(url, token), Caller(url, other)
    try:
        gone = kill_service_while_called(hub, [caller, intruder])
    finally:
        caller.stop()
        intruder.stop()
    failed = [s for s in caller.since(gone) if s != 200]
    lost = [s for c in (caller, intruder) for t, s, _ in c.refusals if t < gone]
    print(
        f"with the standby: {len(failed)} failed calls started after the service was gone, "
        f"{len(lost)} lost with it; {len(caller.since(gone))} calls after it"
    )
    told = [(round(t - gone, 3), s, m) for c in (caller, intruder) for t, s, m in c.refusals]
    assert failed == [], f"calls failed while the service restarted: {told}"
    # The stranger was refused throughout: by the service, the standby, the next service.
    assert set(intruder.since(gone)) == {403}, told
    log = (hub.data_dir / "endpoint-standby.log").read_text()
    assert "endpoint calls are answered here" in log, log[-2000:]
