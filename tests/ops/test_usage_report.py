"""``notebooks/usage-report.ipynb`` under nbclient, in a real kernel against a real hub.

Two users in two hub groups hold slices for an hour (placed and released by the
admin through ``POST``/``DELETE /allocations``, as an operator repairing the ledger
would: the cheapest real usage; the GPUs are simulated, this machine has none). The
notebook then runs as the admin and as one of the users, with its parameters set to
that window, the kernel's environment carrying what a gpulab server's has
(``GPULAB_API_URL`` and a ``JUPYTERHUB_API_TOKEN``).

The hour passes without waiting it: the hub's service is a process of its own, which
a test's fake clock (``support.clock``) cannot reach, so the test moves the slices'
start an hour back in the service's database (:func:`backdate`), as if placed then.
Their release then counts the hour through the service's own code.
"""

import csv
import io
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nbformat
import pytest
from hubproc import fresh_user
from nbclient import NotebookClient
from sqlalchemy import select, update
from support.wait import wait_until

from gpulab.db.engine import allocations, lock_for_write, make_engine, writer

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "usage-report.ipynb"
PLOTLY = "application/vnd.plotly.v1+json"
#: Seconds each slice is held: an hour, so alice's half GPU is 0.5 GPU-hours.
HELD_S = 3600.0


def backdate(hub, ids: list[str], seconds: float) -> None:
    """Move these allocations' start ``seconds`` back in the hub's ledger, as if they
    had been placed that long ago (the database the hub's service uses: its default,
    the data dir's SQLite file, unless ``GPULAB_DB_URL`` names another)."""
    url = os.environ.get("GPULAB_DB_URL") or f"sqlite:///{hub.data_dir}/gpulab.sqlite"
    engine = make_engine(url)
    try:
        with writer(engine).begin() as conn:
            lock_for_write(conn)
            t = allocations
            for row in conn.execute(select(t.c.id, t.c.created).where(t.c.id.in_(ids))):
                earlier = row.created - timedelta(seconds=seconds)
                conn.execute(update(t).where(t.c.id == row.id).values(created=earlier))
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def usage(plain_hub):
    """Alice (group lab) holds half a GPU for a job, Bob (group ops) a quarter for a
    deployment, both for HELD_S seconds (backdated); the window around it, and their
    tokens."""
    hub = plain_hub
    alice, bob = fresh_user("usage-alice"), fresh_user("usage-bob")
    lab, ops = fresh_user("usage-lab"), fresh_user("usage-ops")
    tokens = {u: hub.create_user(u) for u in (alice, bob)}
    for group, user in ((lab, alice), (ops, bob)):
        assert hub.hub_api("POST", f"/groups/{group}").status_code in (201, 409)
        r = hub.hub_api("POST", f"/groups/{group}/users", json={"users": [user]})
        assert r.status_code == 200, r.text
    # The hub tells the service of each change (its audit event), which then asks the
    # hub about groups anew: once both are recorded, the slices below are placed with
    # their groups (not with an answer the service kept from before).
    wait_until(
        lambda: all(
            hub.gpulab("GET", "/audit", params={"action": "group.change", "subject": g}).json()[
                "entries"
            ]
            for g in (lab, ops)
        ),
        "the service to record both groups' changes",
    )
    since = datetime.now(UTC) - timedelta(seconds=HELD_S + 1)
    ids = []
    began = time.monotonic()
    for user, kind, milli in ((alice, "job", 500), (bob, "deployment", 250)):
        body = {"user": user, "owner_kind": kind, "owner": f"{user}-{kind}/0", "gpu_milli": milli}
        r = hub.gpulab("POST", "/allocations", json=body)
        assert r.status_code == 201, r.text
        ids += [row["id"] for row in r.json()]
    backdate(hub, ids, HELD_S)  # placed an hour ago
    for alloc_id in ids:
        assert hub.gpulab("DELETE", f"/allocations/{alloc_id}").status_code == 200
    held_at_most = HELD_S + time.monotonic() - began
    until = datetime.now(UTC) + timedelta(seconds=1)
    window = {"since": since.isoformat(), "until": until.isoformat()}
    yield {
        "hub": hub,
        "alice": alice,
        "bob": bob,
        "lab": lab,
        "ops": ops,
        "tokens": tokens,
        "window": window,
        "held_at_most": held_at_most,
    }
    for group in (lab, ops):
        hub.hub_api("DELETE", f"/groups/{group}")


def run_report(hub, token, window, folder, monkeypatch, group_by="user"):
    """The notebook run as ``token``'s owner, its parameters cell set to ``window``
    (None: the defaults, the last 30 days up to now) and ``group_by``."""
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    if window is not None:
        params.source = params.source.replace(
            "since = None", f"since = {window['since']!r}"
        ).replace("until = None", f"until = {window['until']!r}")
    params.source = params.source.replace('group_by = "user"', f"group_by = {group_by!r}")
    assert f"group_by = {group_by!r}" in params.source
    assert window is None or repr(window["until"]) in params.source, params.source
    folder.mkdir()
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()
    return nb


def outputs(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id).outputs


def figure(nb, cell_id) -> dict:
    """The plotly figure a cell showed (as saved in the notebook)."""
    (fig,) = [o["data"][PLOTLY] for o in outputs(nb, cell_id) if PLOTLY in o.get("data", {})]
    return fig


def bars(fig) -> dict[str, float]:
    """Category -> GPU-hours of a horizontal bar chart."""
    (trace,) = fig["data"]
    return dict(zip(trace["y"], trace["x"], strict=True))


def text(nb, cell_id) -> str:
    return "".join(o.get("text", "") for o in outputs(nb, cell_id) if o.output_type == "stream")


def markdown(nb, cell_id) -> str:
    return "".join(o["data"].get("text/markdown", "") for o in outputs(nb, cell_id) if "data" in o)


def saved_csv(folder: Path, group_by: str) -> str:
    (path,) = folder.glob(f"usage-*-by-{group_by}.csv")
    return path.read_bytes().decode()


def rows_of(csv_text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(csv_text)))


def no_errors(nb) -> None:
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in errors if o.output_type == "error"]


def test_the_notebook_is_committed_clean():
    """No outputs, execution counts or missing cell ids in the committed notebook; a
    parameters cell (tagged, for papermill) with the defaults the docs name."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert all(c.get("id") for c in nb.cells)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for line in ("DAYS = 30", "since = None", "until = None", 'group_by = "user"'):
        assert line in params.source


@pytest.mark.slow
def test_the_admin_report_shows_each_user_group_kind_and_day(
    usage, tmp_path, monkeypatch, artifacts_dir
):
    hub, alice, bob, window = usage["hub"], usage["alice"], usage["bob"], usage["window"]
    api = hub.gpulab("GET", "/usage", params=window).json()["rows"]
    hours = {r["user"]: r["gpu_hours"] for r in api}
    # Half a GPU and a quarter GPU, each held at least HELD_S seconds and at most
    # that plus as long as the requests took from the first placement to the last
    # release: about 0.5 and 0.25 GPU-hours.
    most = usage["held_at_most"]
    used = {r["user"]: r["milli_gpu_seconds"] for r in api}  # whole milli-GPU-seconds
    assert 500 * HELD_S <= used[alice] <= 500 * most + 1, (used, most)
    assert 250 * HELD_S <= used[bob] <= 250 * most + 1, (used, most)
    assert hours[alice] == pytest.approx(used[alice] / 1000 / 3600, abs=1e-6)

    nb = run_report(hub, hub.admin_token, window, tmp_path / "admin", monkeypatch)
    nbformat.write(nb, Path(artifacts_dir) / "usage-report-admin.ipynb")  # to look at
    no_errors(nb)

    # The saved CSV is the service's, for that window: both users, their GPU-hours.
    saved = saved_csv(tmp_path / "admin", "user")
    assert saved == hub.gpulab("GET", "/usage", params={**window, "format": "csv"}).text
    got = {r["user"]: float(r["gpu_hours"]) for r in rows_of(saved)}
    assert got[alice] == hours[alice] and got[bob] == hours[bob]

    # The figures: per user, per group, by kind, per day, in GPU-hours.
    per_user = figure(nb, "per-user")
    assert per_user["layout"]["xaxis"]["title"]["text"] == "GPU-hours"
    assert bars(per_user)[alice] == hours[alice] and bars(per_user)[bob] == hours[bob]
    per_group = bars(figure(nb, "per-group"))
    assert per_group[usage["lab"]] == hours[alice] and per_group[usage["ops"]] == hours[bob]
    per_kind = bars(figure(nb, "per-kind"))
    assert per_kind["job"] >= hours[alice] and per_kind["deployment"] >= hours[bob]
    per_day = figure(nb, "per-day")
    assert per_day["layout"]["yaxis"]["title"]["text"] == "GPU-hours"
    for user in (alice, bob):
        (trace,) = [t for t in per_day["data"] if t["name"] == user]
        assert sum(trace["y"]) == pytest.approx(hours[user], abs=1e-5)

    # The top users table names both, with their GPU-hours.
    table = markdown(nb, "top-users")
    for user in (alice, bob):
        assert f"| {user} | {hours[user]:.4f} |" in table, table
    assert "saved " in text(nb, "save-csv")


@pytest.mark.slow
def test_a_user_sees_only_their_own_use(usage, tmp_path, monkeypatch):
    """Bob runs it as it comes (the last 30 days up to now), the CSV by group."""
    hub, alice, bob, window = usage["hub"], usage["alice"], usage["bob"], usage["window"]
    own = hub.gpulab("GET", "/usage", token=usage["tokens"][bob], params=window).json()["rows"]
    assert [r["user"] for r in own] == [bob]

    nb = run_report(hub, usage["tokens"][bob], None, tmp_path / "bob", monkeypatch, "group")
    assert "(30.00 days)" in text(nb, "setup")
    no_errors(nb)
    assert re.search(r"slices? by 1 user$", text(nb, "fetch"), re.M), text(nb, "fetch")
    assert list(bars(figure(nb, "per-user"))) == [bob]
    assert bars(figure(nb, "per-user"))[bob] == own[0]["gpu_hours"]
    assert list(bars(figure(nb, "per-group"))) == [usage["ops"]]
    assert list(bars(figure(nb, "per-kind"))) == ["deployment"]
    per_day = figure(nb, "per-day")
    assert [t["name"] for t in per_day["data"]] == [bob]
    assert len(per_day["data"][0]["x"]) == 31  # each UTC day the 30 days touch
    table = markdown(nb, "top-users")
    assert bob in table and alice not in table
    # The CSV by group: bob's group only, with his GPU-hours.
    saved = rows_of(saved_csv(tmp_path / "bob", "group"))
    assert [(r["group"], float(r["gpu_hours"])) for r in saved] == [
        (usage["ops"], own[0]["gpu_hours"])
    ]
