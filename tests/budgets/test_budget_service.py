"""GPU-hour budgets on the real service (in-process, a stand-in hub API): a group at its
budget is refused new GPU work with the figure and who can raise it; a group allowed to
overdraw is not; the next month starts afresh; ``/usage`` prices the hours.

Time passes on the fake clock: a whole GPU held for ``clock.advance(3600)`` is one
GPU-hour, and the month ends when the clock says so.
"""

import asyncio
import datetime as dt

import pytest
from support.clock import fake_clock
from support.service import running_service

from gpulab.magics.status import status_bundle
from gpulab.spawner.form import render_form

pytestmark = pytest.mark.asyncio

#: Mid-December: the period is December, until 2027-01-01.
MID_MONTH = dt.datetime(2026, 12, 15, 9, 0, tzinfo=dt.UTC).timestamp()

CONFIG = """
c.BudgetSettings.group_budget_gpu_hours = {"students": 2, "vision": 1}
c.BudgetSettings.group_budget_overdraft = ["vision"]
c.BudgetSettings.price_per_gpu_hour = 2.5
c.BudgetSettings.price_currency = "EUR"
c.GpuLabService.stop_work_on_exit = True
"""


def running(svc, *users) -> None:
    """The stand-in hub says these users' servers run (so nothing reconciles them away)."""
    for name, model in svc.fake_hub.users.items():
        model["servers"] = {"": {"ready": True}} if name in users else {}


async def start_server(svc, user, milli, owner=None):
    return await svc.request(
        "POST",
        "/allocations",
        json={
            "user": user,
            "owner_kind": "server",
            "owner": owner or f"{user}/",
            "gpu_milli": milli,
        },
    )


async def test_a_group_at_its_budget_is_refused_with_the_figure_until_next_month(
    tmp_path, monkeypatch
):
    with fake_clock(start=MID_MONTH) as clock:
        async with running_service(tmp_path / "svc", CONFIG, simulate="4xA100-80GB") as svc:
            alice = svc.create_user("alice", groups=["students"])
            bob = svc.create_user("bob", groups=["students"])
            carol = svc.create_user("carol", groups=["vision"])
            running(svc, "alice", "bob", "carol")

            assert (await start_server(svc, "alice", 1000)).status_code == 201
            clock.advance(3600)
            assert (await start_server(svc, "bob", 1000)).status_code == 201
            clock.advance(1800)
            # alice 1.5 GPU-hours, bob 0.5: students have used their 2.

            mine = (await svc.request("GET", "/budget", token=bob)).json()
            assert mine["period"] == "month"
            assert (mine["since"], mine["until"]) == (
                "2026-12-01T00:00:00+00:00",
                "2027-01-01T00:00:00+00:00",
            )
            assert mine["user"]["used_gpu_hours"] == 0.5
            assert mine["user"]["cost"] == 1.25
            (students,) = mine["groups"]
            assert students["name"] == "students"
            assert (students["used_gpu_hours"], students["left_gpu_hours"]) == (2.0, 0.0)
            assert students["cost"] == 5.0
            assert mine["over"] == ["students"]

            figure = "Group students has used 2 of its 2 GPU-hours this month (until 2027-01-01)"
            # A server with a GPU, a job and a deployment are refused, with the figure
            # and who can raise it (the hub's admins by name).
            r = await start_server(svc, "bob", 250, owner="bob/second")
            assert r.status_code == 403
            assert figure in r.json()["error"]
            assert "ask an admin (admin)" in r.json()["error"]
            for size in (250, "250"):  # as text, as the job manager reads it
                r = await svc.request(
                    "POST", "/jobs", token=alice, json={"code": "print(1)", "gpu_milli": size}
                )
                assert r.status_code == 403, r.text
                assert figure in r.json()["error"]
            # The size as text ("1000" reads as 1000) is refused alike: it went past the
            # check as 0 and was deployed at 1000.
            for size in ("250", '"1000"'):
                r = await svc.request(
                    "POST",
                    "/deployments",
                    token=alice,
                    files={
                        "spec": (None, f'{{"name": "m", "gpu_milli": {size}}}'),
                        "model": ("model.tar", b"not read: refused before"),
                    },
                )
                assert r.status_code == 403, r.text
                assert figure in r.json()["error"]
            # Work without a GPU costs no GPU-hours: still allowed.
            assert (await start_server(svc, "bob", 0, owner="bob/cpu")).status_code == 201

            # The spawn form says it before the user tries: the GPU sizes are off.
            availability = (
                await svc.request("GET", "/availability", token=bob, params={"user": "bob"})
            ).json()
            html = render_form(availability, demo=False, shared_account="")
            assert figure in html
            assert 'value="250" disabled' in html and 'value="0" checked' in html
            assert "This month: 0.5 GPU-hours used" in html
            assert "group students: 2 used, 0 left of its 2" in html

            # %gpulab in bob's kernel says the same (the client, with bob's token).
            monkeypatch.setenv("GPULAB_API_URL", svc.api)
            monkeypatch.setenv("JUPYTERHUB_API_TOKEN", bob)
            shown = (await asyncio.to_thread(status_bundle, {"GPULAB_API_URL": svc.api}))[
                "text/plain"
            ]
            assert (
                "This month (until 2027-01-01): 0.5 GPU-hours used; group students: 2 used, "
                "0 left of its 2; cost so far 1.25 EUR"
            ) in shown
            assert figure in shown

            # A group an admin lets overdraw goes on past its budget.
            assert (await start_server(svc, "carol", 1000)).status_code == 201
            clock.advance(2 * 3600)
            assert (await start_server(svc, "carol", 500, owner="carol/two")).status_code == 201
            theirs = (await svc.request("GET", "/budget", token=carol)).json()
            assert theirs["groups"][0]["used_gpu_hours"] == 2.0
            assert theirs["groups"][0]["overdraft"] is True and theirs["over"] == []

            # /usage prices the hours when the site sets a price.
            usage = (await svc.request("GET", "/usage", params={"group_by": "group"})).json()
            assert usage["price_per_gpu_hour"] == 2.5 and usage["currency"] == "EUR"
            # alice's whole GPU for 3.5 hours, bob's for 2.5 (the window: the last week)
            assert {r["group"]: r["cost"] for r in usage["rows"]}["students"] == 6.0 * 2.5
            csv = (await svc.request("GET", "/usage", params={"format": "csv"})).text
            assert csv.splitlines()[0] == "user,gpu_hours,cost,milli_gpu_seconds,allocations"

            # Every server stopped and its slice released; January starts afresh.
            running(svc)
            for owner in ("alice/", "bob/", "bob/cpu", "carol/", "carol/two"):
                r = await svc.request(
                    "DELETE", "/allocations", params={"owner_kind": "server", "owner": owner}
                )
                assert r.status_code == 200
            january = dt.datetime(2027, 1, 1, 0, 1, tzinfo=dt.UTC).timestamp()
            clock.advance(january - clock.now())
            mine = (await svc.request("GET", "/budget", token=bob)).json()
            assert mine["since"] == "2027-01-01T00:00:00+00:00"
            assert mine["groups"][0]["used_gpu_hours"] == 0 and mine["over"] == []
            assert (await start_server(svc, "bob", 250)).status_code == 201


async def test_users_see_only_their_own_budget_and_a_site_contact(tmp_path):
    config = CONFIG + 'c.BudgetSettings.budget_contact = "gpu-admins@example.org"\n'
    config += "c.BudgetSettings.user_budget_gpu_hours = {'dave': 0.25}\n"
    with fake_clock(start=MID_MONTH) as clock:
        async with running_service(tmp_path / "svc", config) as svc:
            dave = svc.create_user("dave")
            erin = svc.create_user("erin")
            running(svc, "dave", "erin")
            r = await svc.request("GET", "/budget", token=erin, params={"user": "dave"})
            assert r.status_code == 403
            assert (await svc.request("GET", "/budget", token=erin)).json()["set"] is False
            assert (await start_server(svc, "dave", 250)).status_code == 201
            clock.advance(3600)
            r = await start_server(svc, "dave", 250, owner="dave/two")
            assert r.status_code == 403
            assert r.json()["error"] == (
                "dave has used 0.25 of their 0.25 GPU-hours this month (until 2027-01-01); "
                "new GPU work is refused until then. To raise it, ask gpu-admins@example.org."
            )
            mine = (await svc.request("GET", "/budget", token=dave)).json()
            assert mine["refusal"] == r.json()["error"]


def test_the_budget_judges_the_slice_a_version_will_hold():
    """A canary without gpu_milli takes its deployment's slice (it was judged as 0);
    text reads as the manager reads it; a bad value is the manager's 400 (0 here)."""
    from types import SimpleNamespace

    from gpulab.service.api.deployments import DeploymentsHandler

    found = {("alice", "chat"): {"gpu_milli": 500}}
    store = SimpleNamespace(find=lambda user, name: found.get((user, name)))
    handler = SimpleNamespace(deployments=SimpleNamespace(store=store))
    alice = SimpleNamespace(name="alice")

    def milli(settings):
        return DeploymentsHandler._milli_of(handler, alice, settings)

    assert milli({"name": "chat", "canary": 10}) == 500
    assert milli({"name": "chat", "canary": 10, "gpu_milli": "250"}) == 250
    assert milli({"name": "new", "gpu_milli": "1000"}) == 1000
    assert milli({"name": "new"}) == 0
    assert milli({"name": "new", "gpu_milli": "a lot"}) == 0
