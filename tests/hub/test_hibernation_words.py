"""The words the hub's home page and spawn form use for a hibernated server are true
now: "hibernated" until the server starts again; nothing while it runs; "stopped"
after it ran again and was stopped plainly (its notebooks not opened meanwhile still
wait). The hub's own rows of the user's servers (``jupyterhub.orm.Spawner``) say when
each last started or stopped."""

from __future__ import annotations

import datetime as dt

from jupyterhub import orm

from gpulab.hub_ext.held_elsewhere import waiting_servers
from gpulab.spawner.form import hibernation_note

ROW = {
    "id": "h-0123456789ab",
    "server": "",
    "state": "hibernated",
    "finished": "2026-12-04T14:02:07Z",
    "summary": "hibernated at 14:02 UTC: 1 kernel, 3.0 MB",
}
STOPPED_BY_THE_HIBERNATION = dt.datetime(2026, 12, 4, 14, 2, 6, 900_000)


def spawner(last_activity, running=False):
    row = orm.Spawner(name="", last_activity=last_activity)
    row.started = last_activity if running else None
    return {"": row}


def test_hibernated_until_it_starts_again():
    (said,) = waiting_servers([ROW], spawner(STOPPED_BY_THE_HIBERNATION))
    assert said["state"] == "hibernated"
    assert said["head"] == "Your server is hibernated at 14:02 UTC: 1 kernel, 3.0 MB."
    # In the same second as the hibernation's end (kept to the second): still hibernated.
    same_second = dt.datetime(2026, 12, 4, 14, 2, 7, 500_000)
    assert waiting_servers([ROW], spawner(same_second))[0]["state"] == "hibernated"
    # Never started here at all: what the service says.
    assert waiting_servers([ROW], {})[0]["state"] == "hibernated"


def test_nothing_while_it_runs_and_stopped_after_a_plain_stop():
    woken = dt.datetime(2026, 12, 4, 15, 0, 0)
    assert waiting_servers([ROW], spawner(woken, running=True)) == []
    (said,) = waiting_servers([ROW], spawner(dt.datetime(2026, 12, 4, 16, 30, 0)))
    assert said["state"] == "stopped"
    assert said["head"] == "Your server is stopped."
    assert "hibernated at 14:02 UTC that were not opened since" in said["rest"]
    # Every notebook woke: nothing waits, nothing is said.
    assert waiting_servers([{**ROW, "state": "woken"}], spawner(woken)) == []


def test_the_spawn_form_says_the_same():
    assert "<strong>Your server is hibernated at 14:02 UTC" in hibernation_note(ROW)
    stopped = hibernation_note(ROW, stopped_since=True)
    assert "<strong>Your server is stopped.</strong>" in stopped and "hibernated at" in stopped


def test_a_hub_that_stops_says_it_does_not_hibernate():
    from gpulab.hub_ext.hub_app import stopping_servers_line

    line = stopping_servers_line(["alice/", "bob/gpu"])
    assert line.startswith("Stopping 2 single-user servers without hibernating them")
    assert "%gpulab hibernate" in line and line.endswith(": alice/, bob/gpu")
