"""The widget tests' gpulab service: the real one in this process (``support.service``),
sampling this machine every second as the embedded default does, where alice and bob
(user names of their own, ``names``) each hold a server's slice.

The dashboard reads ``GET /telemetry`` through the real client over HTTP; what a
real hub adds (its proxy, its tokens, spawned servers) the browser test of the
dashboard covers (tests/browser/test_dashboard.py). The ``%gpulab nettest`` jobs run
on the session's shared hub (tests/widgets/test_dashboard_magics.py).

The service serves on the session's event loop: tests that use it are ``async`` and
wait with :func:`support.wait.wait_until_async`, and call the (blocking) client and
``Dashboard.close()`` in a thread, so that the loop keeps serving meanwhile.
"""

import asyncio

import pytest
from hubproc import fresh_user
from support.service import running_service
from support.wait import wait_until_async

from gpulab.client import Client

#: The embedded default's sampler (running_service turns it off for route tests).
SAMPLING = "c.TelemetrySettings.local_sampler = True\n"

#: What each user's server holds, in milli-GPU.
HELD = {"alice": 250, "bob": 500}


@pytest.fixture(scope="module")
def names():
    """The user names of the tests' "alice" and "bob" (no other test has them)."""
    return {"alice": fresh_user("alice"), "bob": fresh_user("bob"), "admin": "admin"}


@pytest.fixture(scope="module")
async def service(tmp_path_factory, names):
    """A service of the module's own, its telemetry history as short as the module
    (the dashboard's first answer backfills all of it). Its dataset cache is
    ``service.data_dir / "dataset-cache"``, where the sampler looks."""
    data = tmp_path_factory.mktemp("widgets-svc")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPULAB_CACHE_DIR", str(data / "dataset-cache"))
        async with running_service(data, config=SAMPLING) as svc:
            for who, milli in HELD.items():
                svc.create_user(names[who])
                # The server runs (the hub says so), so the reconciler keeps its slice.
                svc.fake_hub.users[names[who]]["servers"] = {"": {"ready": True}}
                body = {
                    "user": names[who],
                    "owner_kind": "server",
                    "owner": f"{names[who]}/",
                    "gpu_milli": milli,
                }
                r = await svc.request("POST", "/allocations", json=body)
                assert r.status_code == 201, r.text
            yield svc


@pytest.fixture(scope="module")
def tokens(service, names):
    """API tokens of alice (holding 1/4 GPU) and bob (1/2 GPU), and the admin's."""
    out = {who: service.create_user(names[who]) for who in HELD}
    out["admin"] = service.admin_token
    return out


@pytest.fixture(scope="module")
def clients(service, tokens):
    return {name: Client(service.api, token=token) for name, token in tokens.items()}


async def _wait_for(predicate, timeout=90.0, what="condition"):
    # The predicate asks the service (blocking): in a thread, while the loop serves.
    return await wait_until_async(lambda: asyncio.to_thread(predicate), what, timeout)


@pytest.fixture(scope="session")
def wait_for():
    """Await ``predicate`` (called in a thread) returning something truthy (bounded;
    no timing claims)."""
    return _wait_for
