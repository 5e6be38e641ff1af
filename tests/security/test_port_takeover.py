"""A user's kernel that takes the port of the hub or the service while it is down (a
crash, a restart) must not be sent the platform's tokens: the hub's and the service's
clients ask the kernel whose socket listens there first."""

import os
import pwd
import subprocess
import sys
import time

import pytest
from tornado import web

from gpulab.enforcement.peer_account import foreign_listener, listener_uid
from gpulab.service.hubapi import HubAPI
from gpulab.spawner.service_client import ServiceClient

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="another account's socket needs root")

#: What the attacker runs: listen on a port of loopback and print what comes in.
CATCHER = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
s.settimeout(20)
try:
    c, _ = s.accept()
    print(c.recv(65536).decode(errors="replace"), flush=True)
except OSError:
    pass
"""


@pytest.fixture
def catcher():
    nobody = pwd.getpwnam("nobody")
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", CATCHER],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        stdout=subprocess.PIPE,
        text=True,
    )
    port = int(proc.stdout.readline())
    yield port, nobody.pw_uid, proc
    proc.kill()


async def test_no_token_goes_to_a_port_another_account_listens_on(catcher):
    port, uid, proc = catcher
    assert listener_uid(port) == uid
    assert f"held by uid {uid}" in foreign_listener(f"http://127.0.0.1:{port}/hub/api")
    assert foreign_listener("http://10.1.2.3:8081/hub/api") is None  # not this machine

    client = ServiceClient(f"http://127.0.0.1:{port}/services/gpulab/api/v1", "svc-token")
    with pytest.raises(web.HTTPError) as refused:
        await client.request("GET", "/inventory")
    assert refused.value.status_code == 503 and "held by uid" in refused.value.log_message
    with pytest.raises(ConnectionRefusedError, match="held by uid"):
        await HubAPI(f"http://127.0.0.1:{port}/hub/api", "hub-token")._get("/users")
    time.sleep(0.2)
    proc.kill()
    out, _ = proc.communicate()
    assert "svc-token" not in out and "hub-token" not in out and "GET" not in out


async def test_the_hubs_proxys_and_users_servers_tokens_go_to_no_taken_port(catcher):
    """The same check for every other platform token sent to a port of this machine:
    the service's own token to the hub's API (an OAuth callback while the hub was
    down sent it as the client secret), the proxy's token to its API (the endpoint
    router's route check, every 15 s), and a hibernation's token for a user's
    server (to the hub's public port, while the proxy was down), the proxy's token from
    the hub's own client, and the MLflow run recorder's."""
    from types import SimpleNamespace

    from gpulab.service.auth import GuardedHubAuth, GuardedHubOAuth
    from gpulab.service.endpoints.router import EndpointRouter
    from gpulab.service.hibernation.servers import ServerCalls, ServerRefused

    port, uid, proc = catcher
    url = f"http://127.0.0.1:{port}"
    for auth in (GuardedHubAuth, GuardedHubOAuth):
        hub_auth = auth(api_url=f"{url}/hub/api", api_token="service-token")
        with pytest.raises(ConnectionRefusedError, match="held by uid"):
            await hub_auth._api_request("POST", f"{url}/hub/api/oauth2/token")  # noqa: SLF001
    router = SimpleNamespace(
        address=SimpleNamespace(proxy_api_url=url), _routespec=lambda: "/services/gpulab"
    )
    with pytest.raises(OSError, match="held by uid"):
        await EndpointRouter._proxy_api(router, "GET")  # noqa: SLF001
    calls = ServerCalls(hub=None, servers_url=url)
    with pytest.raises(ServerRefused, match="held by uid"):
        await calls._call(f"{url}/user/alice/api/gpulab/hibernate", "server-token", "GET", None, 5)  # noqa: SLF001
    from gpulab.hub_ext.guarded_proxy import GuardedProxy
    from gpulab.service.experiments.recorder import RunRecorder

    # The MLflow run recorder (the service's token, on behalf of a job's owner).
    recorder = RunRecorder(f"{url}/services/mlflow", "svc-token", 1 << 20)
    with pytest.raises(ConnectionRefusedError, match="held by uid"):
        await recorder._call("alice", "GET", "api/2.0/mlflow/experiments/search")  # noqa: SLF001

    proxy = GuardedProxy(api_url=url, auth_token="proxy-token")
    with pytest.raises(ConnectionRefusedError, match="held by uid"):
        await proxy.api_request("/hub", method="GET")
    time.sleep(0.2)
    proc.kill()
    out, _ = proc.communicate()
    assert "token" not in out and "GET" not in out and "POST" not in out


def test_the_node_agent_sends_its_token_to_no_taken_port(catcher):
    """The agent posts samples with its token (whose samples steer self-healing): not to
    a port of this machine another account took while the service was down."""
    from gpulab.telemetry.agent import HttpSender

    port, uid, proc = catcher
    send = HttpSender(f"http://127.0.0.1:{port}/services/gpulab/api/v1/telemetry", "agent-tok")
    with pytest.raises(OSError, match="held by uid"):
        send({"node": "n0", "gpus": []})
    time.sleep(0.2)
    proc.kill()
    out, _ = proc.communicate()
    assert "agent-tok" not in out and "POST" not in out
