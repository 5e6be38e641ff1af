"""What people read about their slice, in one unit (the fraction): the spawn form's
sizes with GPU model and memory, the spawn page's events, the admin page's rows.

Pure functions and a spawner object; the end-to-end view (real hub, real Chromium)
is tests/browser/test_hub_pages.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from types import SimpleNamespace

from gpulab.spawner.admin_slices import SliceTable, running_slices
from gpulab.spawner.form import in_fractions, render_form, size_title
from gpulab.spawner.local import FractionalLocalSpawner
from gpulab.spawner.placement import Placement, local_enforcement, placement_of

UUID0, UUID1 = "GPU-aaaa", "GPU-bbbb"


def inventory(allocated=(0, 0), models=("A100-80GB", "A100-80GB"), memory=(81920, 81920)):
    return {
        "nodes": [
            {
                "name": "vm",
                "gpus": [
                    {
                        "uuid": u,
                        "index": i,
                        "model": models[i],
                        "memory_mib": memory[i],
                        "allocated_milli": allocated[i],
                        "simulated": True,
                        "mig_parent": None,
                        "cordoned": None,
                    }
                    for i, u in enumerate((UUID0, UUID1))
                ],
            }
        ]
    }


AVAILABILITY = {
    "user": "alice",
    "held_milli": 250,
    "quota_milli": 500,
    "simulated": True,
    "sizes": [
        {"milli": 0, "label": "no GPU", "available": True, "count": 1, "reason": None},
        {"milli": 250, "label": "1/4 GPU", "available": True, "count": 1, "reason": None},
        {
            "milli": 1000,
            "label": "1 GPU",
            "available": False,
            "count": 0,
            "reason": "over your quota (1/4 GPU left)",
        },
    ],
}

ROWS = [
    {
        "gpu_uuid": UUID0,
        "gpu_index": 0,
        "node": "vm",
        "milli": 250,
        "memory_mib": 20480,
        "simulated": True,
    }
]


def test_each_size_names_model_and_memory():
    inv = inventory()
    assert size_title({"milli": 250, "label": "1/4 GPU"}, inv) == "1/4 GPU · A100-80GB · 20 GiB"
    assert size_title({"milli": 2000, "label": "2 GPUs"}, inv) == "2 GPUs · A100-80GB · 160 GiB"
    assert size_title({"milli": 0, "label": "no GPU"}, inv) == "no GPU"
    # Mixed cards: the ones with room now; each with the memory it gives.
    mixed = inventory(allocated=(1000, 0), models=("A100-80GB", "T4-16GB"), memory=(81920, 16384))
    assert size_title({"milli": 250, "label": "1/4 GPU"}, mixed) == "1/4 GPU · T4-16GB · 4 GiB"
    both = inventory(models=("A100-80GB", "T4-16GB"), memory=(81920, 16384))
    assert (
        size_title({"milli": 500, "label": "1/2 GPU"}, both)
        == "1/2 GPU · A100-80GB · 40 GiB or T4-16GB · 8 GiB"
    )


def test_form_speaks_fractions_only():
    form = render_form(AVAILABILITY, demo=False, inventory=inventory(allocated=(250, 0)))
    assert "1/4 GPU · A100-80GB · 20 GiB" in form
    assert "You hold 1/4 GPU; your quota is 1/2 GPU." in form
    assert "over your quota (1/4 GPU left)" in form
    assert "milli-GPU" not in form
    # The API field stays in milli-GPU.
    assert 'name="gpu_milli"' in form and 'value="250"' in form
    assert in_fractions("no GPU has 500 milli-GPU free") == "no GPU has 1/2 GPU free"


def checked(form: str) -> list[str]:
    return re.findall(r'value="(\d+)" checked', form)


def test_the_form_offers_the_last_size_again_and_marks_what_cannot_be_placed():
    assert checked(render_form(AVAILABILITY, demo=False)) == ["250"]  # the first GPU size
    assert checked(render_form(AVAILABILITY, demo=False, last=0)) == ["0"]  # the last server's
    # The last size cannot be placed now: the first that can, not a disabled one.
    assert checked(render_form(AVAILABILITY, demo=False, last=1000)) == ["250"]
    form = render_form(AVAILABILITY, demo=False)
    row = re.search(r'<div class="radio disabled">.*?</div>', form).group(0)
    assert 'value="1000"' in row and "unavailable: over your quota (1/4 GPU left)" in row
    assert ".radio.disabled .gpulab-size{text-decoration:line-through}" in form


def test_placement_sentences():
    p = placement_of(250, ROWS, inventory(allocated=(250, 0)))
    assert p.sentence() == "Placed 1/4 GPU on A100-80GB #0 of node vm (20 GiB)"
    assert Placement.from_state(p.to_state()) == p
    assert Placement.from_state({"unknown": 1}) is None
    assert (
        local_enforcement(ROWS, True, False, "")
        == "Enforced by: PyTorch memory limit + CUDA_VISIBLE_DEVICES "
        "(simulated GPU: nothing enforced)"
    )
    whole = [{**ROWS[0], "milli": 1000, "simulated": False}]
    assert (
        local_enforcement(whole, False, False, "cgroup v2: 2 CPUs, 8 GiB")
        == "Enforced by: CUDA_VISIBLE_DEVICES + cgroup v2: 2 CPUs, 8 GiB"
    )
    assert placement_of(0, [], {}).sentence().startswith("No GPU: JupyterLab runs on the CPU")


def test_progress_replays_every_event_to_each_reader():
    spawner = FractionalLocalSpawner()

    async def read(n):
        out = []
        async for e in spawner.gpulab_progress():
            out.append(e["message"])
            if len(out) == n:
                return out

    async def scenario():
        spawner.begin_progress()
        spawner.report_progress(30, "waiting for a job to free the GPU")
        early = asyncio.ensure_future(read(3))
        await asyncio.sleep(0)
        spawner.report_progress(40, "Placed 1/4 GPU on A100-80GB #0 of node vm (20 GiB)")
        spawner.report_progress(60, "Starting JupyterLab…")
        late = await read(3)
        return await early, late

    early, late = asyncio.run(scenario())
    assert (
        early
        == late
        == [
            "waiting for a job to free the GPU",
            "Placed 1/4 GPU on A100-80GB #0 of node vm (20 GiB)",
            "Starting JupyterLab…",
        ]
    )


def _user(name, admin=False, spawners=None, users=None):
    return SimpleNamespace(
        name=name,
        admin=admin,
        spawners=spawners or {},
        settings={"users": users},
        server_url=lambda s="": f"/user/{name}/{s}",
    )


def test_admin_rows_only_for_admins_and_only_active_slices():
    started = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=3)
    placed = placement_of(250, ROWS, inventory(allocated=(250, 0)))

    def spawner(active, placement):
        return SimpleNamespace(
            gpulab_placement=placement,
            active=active,
            ready=active,
            orm_spawner=SimpleNamespace(started=started),
        )

    alice = _user("alice", spawners={"": spawner(True, placed)})
    bob = _user("bob", spawners={"": spawner(False, placed)})  # stopped
    carol = _user("carol", spawners={"": spawner(True, None)})  # not a gpulab spawner
    users = {1: alice, 2: bob, 3: carol}
    [row] = running_slices(users.values())
    assert {k: row[k] for k in ("user", "server", "size", "gpu", "node", "memory", "since")} == {
        "user": "alice",
        "server": "default",
        "size": "1/4 GPU",
        "gpu": "A100-80GB #0",
        "node": "vm",
        "memory": "20 GiB",
        "since": "3 min ago",
    }
    admin = _user("admin", admin=True, users=users)
    assert SliceTable(admin).rows() == [row]
    assert SliceTable(_user("eve", users=users)).rows() == []
    assert SliceTable(None).rows() == []
