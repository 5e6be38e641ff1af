"""A notebook job's rank leaves no scratch folder behind, however it ends."""

import os
import socket
import subprocess
import tempfile

import pytest

from gpulab.training import notebook


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_rank_that_fails_before_any_cell_removes_its_scratch_folder(tmp):
    # Not a cell's error (those are the notebook's result): the notebook is not JSON.
    from nbformat.reader import NotJSONError

    with pytest.raises(NotJSONError):
        notebook.run_in_rank({"notebook": "not a notebook", "filename": "a.ipynb"})
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("gpulab-notebook-")]


def test_the_scratch_of_a_killed_rank_is_removed_by_the_next_one(tmp):
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    left = tmp / f"gpulab-notebook-{gone.pid}@{host}-abc123"
    (left / "notebook").mkdir(parents=True)
    (left / "notebook" / "big.bin").write_bytes(b"0" * 1024)
    running = tmp / f"gpulab-notebook-{os.getpid()}@{host}-def456"
    running.mkdir()
    elsewhere = tmp / f"gpulab-notebook-{gone.pid}@another-node-ghi789"  # a shared /tmp
    elsewhere.mkdir()
    other = tmp / "gpulab-notebook-not-a-rank"
    other.mkdir()
    assert notebook.sweep_leftovers() == [str(left)]
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        [running.name, elsewhere.name, other.name]
    )


def test_a_notebook_over_its_limit_comes_back_with_its_largest_outputs_cut():
    """A cell printing for hours made a notebook of gigabytes that the user's server
    then read whole; past the limit the largest cells' outputs are cut, and said so."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    small = nbformat.v4.new_code_cell("print('small')")
    small.outputs = [nbformat.v4.new_output("stream", name="stdout", text="small\n")]
    big = nbformat.v4.new_code_cell("print('x' * 10**6)")
    big.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 10**6)]
    nb.cells = [small, big]
    text, cut = notebook.within_limit(nb, 100_000)
    assert cut == 1 and len(text.encode()) <= 100_000
    back = nbformat.reads(text, as_version=4)
    assert back.cells[0].outputs[0].text == "small\n"
    assert back.cells[1].outputs[0].text == "[gpulab] output cut: 1 MiB, too large\n"
    assert notebook.within_limit(back, 100_000) == (nbformat.writes(back), 0)
