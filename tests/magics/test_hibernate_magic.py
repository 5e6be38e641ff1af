"""The kernel's side of hibernation in a real IPython shell: save this kernel's
variables, restore them as a notebook's kernel starts (its line printed once, on
the first cell), and ``%gpulab wake`` by hand."""

from __future__ import annotations

import json
import os

import pytest
from IPython.core.interactiveshell import InteractiveShell

from gpulab.client.hibernations import state_folder
from gpulab.magics import hibernate
from gpulab.magics.status import GpuLabMagics

NOTEBOOK = "/home/alice/analysis.ipynb"


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GPULAB_API_URL", raising=False)  # no service here: wake says nothing
    monkeypatch.setattr(hibernate, "_NOT_BACK", {})  # one kernel's memory, per test
    sh = InteractiveShell.instance()
    sh.register_magics(GpuLabMagics)
    sh.reset()
    yield sh
    sh.reset()


def hibernate_here(shell, hid="h-0123456789ab", created="2026-12-04T14:02:00Z") -> str:
    """What the server extension does: the kernel saves, the manifest says where."""
    folder = os.path.join(state_folder(), hid)
    os.makedirs(folder, mode=0o700)
    path = os.path.join(folder, "0.state")
    hibernate.save_kernel(path, 10**9)
    report = json.loads(hibernate.last_save())
    kernel = {"name": "analysis.ipynb", "notebook": NOTEBOOK, "file": "0.state"}
    kernel.update(variables=report["variables"], bytes=report["bytes"])
    manifest = {"id": hid, "created": created, "kernels": [kernel], "bytes": report["bytes"]}
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return path


def test_a_notebook_wakes_as_its_kernel_starts(shell, capsys):
    shell.run_cell("import numpy as np\nweights = np.arange(6.0)\nsteps = (s for s in range(3))")
    path = hibernate_here(shell)
    assert os.stat(path).st_mode & 0o777 == 0o600
    shell.reset()
    assert "weights" not in shell.user_ns

    # Another notebook's kernel restores nothing.
    assert (
        hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": "/home/alice/other.ipynb"}) is None
    )
    line = hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": NOTEBOOK})
    assert line.startswith("Woken from hibernation (14:02 UTC): analysis.ipynb: 2 of 3 variables")
    assert "not back: steps (a generator cannot be saved" in line
    assert list(shell.user_ns["weights"]) == [0, 1, 2, 3, 4, 5]

    capsys.readouterr()
    shell.run_cell("print('first')")
    shell.run_cell("print('second')")
    out = capsys.readouterr().out.splitlines()
    assert out == [line, "first", "second"]  # said once, before the first cell's output

    # Restored once: a restart of the kernel does not restore it again.
    assert hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": NOTEBOOK}) is None


def test_wake_by_hand(shell, capsys):
    shell.run_cell("kept = {'answer': 42}")
    hibernate_here(shell)
    shell.reset()
    shell.run_line_magic("gpulab", "wake --list")
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split() == ["NAME", "HIBERNATED", "VARIABLES", "SIZE", "STATE"]
    assert listing[2].split()[0] == "analysis.ipynb" and listing[2].split()[-1] == "waiting"

    shell.run_line_magic("gpulab", "wake nope")
    said = capsys.readouterr().out
    assert "No hibernated kernel named 'nope'; there are: analysis.ipynb." in said
    shell.run_line_magic("gpulab", "wake")
    assert capsys.readouterr().out.startswith("Woken from hibernation (14:02 UTC)")
    assert shell.user_ns["kept"] == {"answer": 42}
    shell.run_line_magic("gpulab", "wake")
    assert capsys.readouterr().out.startswith("Nothing to wake: every hibernated kernel")
    shell.run_line_magic("gpulab", "wake analysis.ipynb")  # by name, again
    assert capsys.readouterr().out.startswith("Woken from hibernation")
    shell.run_line_magic("gpulab", "wake --list")
    assert capsys.readouterr().out.splitlines()[2].split()[-1] == "restored"
    shell.run_line_magic("gpulab", "wake a b")
    assert capsys.readouterr().out.strip() == hibernate.WAKE_USAGE


def test_no_hibernations_no_noise(shell, capsys):
    assert hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": NOTEBOOK}) is None
    assert hibernate.restore_on_start(shell, {}) is None
    shell.run_line_magic("gpulab", "wake --list")
    assert capsys.readouterr().out.strip() == "No hibernated kernels in ~/.gpulab/hibernate."


def test_two_cycles_keep_every_variable_and_count_against_the_first(shell, capsys):
    """A kernel restores as the magics load; IPython then hides every name it holds
    (``hide_initial_ns``). The restored names are still the user's: ``%who`` lists
    them, the next hibernation saves them, and each wake line counts against what
    the user had the first time (the generator, never saved, stays counted)."""
    shell.run_cell("a = 1\nb = [2, 3]\ngen = (i for i in range(3))")
    hibernate_here(shell, hid="h-0000000001")
    for n, hid in enumerate(("h-0000000002", "h-0000000003")):
        shell.reset()
        line = hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": NOTEBOOK})
        shell.user_ns_hidden.update(shell.user_ns)  # what IPython's init_code does next
        assert f"{2 + n} of {3 + n} variables back" in line, line
        assert "not back: gen (a generator cannot be saved" in line
        capsys.readouterr()
        shell.run_cell("%who")
        said = capsys.readouterr().out.splitlines()
        assert said[0] == line and said[-1].split() == ["a", "b", "c"][: 2 + n]
        shell.run_cell(f"{'c' if n == 0 else 'd'} = 'made after wake {n}'")
        hibernate_here(shell, hid=hid, created=f"2026-12-04T15:0{n}:00Z")
    shell.reset()
    line = hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": NOTEBOOK})
    assert "4 of 5 variables back" in line and "gen (a generator" in line, line
    assert [shell.user_ns[k] for k in "abcd"] == [
        1,
        [2, 3],
        "made after wake 0",
        "made after wake 1",
    ]


def test_gpulab_says_running_again_not_hibernated(shell):
    """``%gpulab`` runs in the server, so a row still "hibernated" means it started
    again: it says so, and names the notebooks that have not woken yet."""
    shell.run_cell("kept = 1")
    hibernate_here(shell, hid="h-00000000000a")
    row = {"id": "h-00000000000a", "state": "hibernated", "finished": "2026-12-04T14:02:09Z"}
    row["summary"] = "hibernated at 14:02 UTC: 1 kernel, 1 kB"
    said = hibernate.status_words(row, hibernate.saved_kernels())
    assert said == (
        "hibernated at 14:02 UTC, running again; not woken yet: analysis.ipynb "
        "(open it, or %gpulab wake NAME)"
    )
    shell.reset()
    hibernate.restore_on_start(shell, {"JPY_SESSION_NAME": NOTEBOOK})
    said = hibernate.status_words(row, hibernate.saved_kernels())
    assert said == "hibernated at 14:02 UTC, running again: every notebook's variables are back"
    woken = {**row, "state": "woken", "summary": "woken at 14:10 UTC: 1 kernel back"}
    assert hibernate.status_words(woken, []) == woken["summary"]
