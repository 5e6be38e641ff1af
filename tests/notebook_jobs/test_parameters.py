"""A notebook job's parameters go in as papermill puts them; compute types read back."""

from __future__ import annotations

import nbformat
import pytest

from gpulab.lab.notebook_jobs.environments import ComputeTypeError, parse_compute_type
from gpulab.lab.notebook_jobs.execution import job_name
from gpulab.lab.notebook_jobs.parameters import ParameterError, inject


def cells(*specs):
    nb = nbformat.v4.new_notebook()
    for source, tags in specs:
        cell = nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


def test_values_go_in_after_the_parameters_cell_as_literals_or_strings():
    nb = cells(("import os", []), ("lr = 0.1", ["parameters"]), ("train(lr)", []))
    out = inject(nb, {"lr": "0.01", "epochs": "3", "tag": "night run", "layers": "[64, 32]"})
    assert [c.source.splitlines()[0] for c in out.cells] == [
        "import os",
        "lr = 0.1",
        "# Parameters",
        "train(lr)",
    ]
    assert out.cells[2].metadata["tags"] == ["injected-parameters"]
    assert out.cells[2].source.splitlines()[1:] == [
        "lr = 0.01",
        "epochs = 3",
        "tag = 'night run'",
        "layers = [64, 32]",
    ]
    # A second injection replaces the first, as papermill's does.
    again = inject(out, {"lr": "1"})
    assert [c.source for c in again.cells].count("# Parameters\nlr = 1") == 1
    assert len(again.cells) == 4


def test_without_a_parameters_cell_they_come_first_and_names_must_be_variables():
    nb = inject(cells(("print(x)", [])), {"x": "'quoted'"})
    assert nb.cells[0].source == "# Parameters\nx = 'quoted'"
    with pytest.raises(ParameterError, match="not a Python variable name"):
        inject(cells(("1", [])), {"learning rate": "1"})


def test_compute_types_and_job_names():
    assert [parse_compute_type(t) for t in ("1/4 GPU", "1/10 GPU", "2 GPUs", "no GPU", "500")] == [
        250,
        100,
        2000,
        0,
        500,
    ]
    with pytest.raises(ComputeTypeError, match="not a slice size"):
        parse_compute_type("a big one")
    assert job_name("nightly-train") == "nightly-train"
    assert job_name("My job #3") == "My-job-3"
    assert job_name("  ") == "notebook"
