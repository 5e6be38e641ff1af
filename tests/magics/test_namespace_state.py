"""One kernel's namespace saved and loaded in-process (``gpulab.magics.namespace_state``):
what hibernate writes and wake reads, without kernels or servers."""

from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pytest

from gpulab.magics import namespace_state as ns

torch = pytest.importorskip("torch")

NOTEBOOK_CELLS = """
import numpy as np
scale = 3

def times_scale(x):
    return x * scale

square = lambda x: x * x

def make_counter():
    count = [0]
    def bump():
        count[0] += 1
        return count[0]
    return bump

class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return square(self.x) + square(self.y)

p = Point(3, 4)
counter = make_counter()
counter()

import functools

@functools.lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
"""


def notebook() -> dict:
    """Cells run the way a kernel runs them: in a namespace called ``__main__``."""
    space = {"__name__": "__main__"}
    exec(NOTEBOOK_CELLS, space)
    return {k: v for k, v in space.items() if not k.startswith("__")}


def round_trip(tmp_path, variables, **kw):
    path = tmp_path / "state.ns"
    saved = ns.save_namespace(variables, str(path), **kw)
    into: dict = {"__name__": "__main__"}
    loaded = ns.load_namespace(str(path), into)
    return saved, loaded, into


def test_arrays_frames_figures_and_aliases_come_back(tmp_path):
    import pandas as pd
    import plotly.graph_objects as go

    a = np.arange(12.0).reshape(3, 4)
    frame = pd.DataFrame({"k": list("abcab"), "v": range(5)}).groupby("k").sum()
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[4, 1, 2], name="s"))
    variables = {"a": a, "b": a, "frame": frame, "fig": fig, "np": np, "words": ["x"] * 3}
    saved, loaded, into = round_trip(tmp_path, variables)

    assert saved.saved == list(variables) and saved.skipped == []
    assert loaded.restored == list(variables) and loaded.failed == []
    np.testing.assert_array_equal(into["a"], a)
    assert into["b"] is into["a"]  # `b = a`: one object again
    assert into["a"].flags.writeable
    pd.testing.assert_frame_equal(into["frame"], frame)
    assert into["fig"].to_dict() == fig.to_dict()
    assert into["np"] is np  # modules by reference
    assert saved.bytes == os.path.getsize(tmp_path / "state.ns")
    assert set(saved.to_json()) == {"saved", "skipped", "bytes", "seconds"}


def test_notebook_functions_lambdas_and_classes_see_the_live_namespace(tmp_path):
    _, loaded, into = round_trip(tmp_path, notebook())
    assert not loaded.failed
    assert into["times_scale"](2) == 6
    assert into["square"](5) == 25
    assert into["counter"]() == 2  # the closure's state came back
    assert isinstance(into["p"], into["Point"]) and into["p"].norm2() == 25
    into["scale"] = 10  # as after wake: functions read the notebook's current globals
    assert into["times_scale"](2) == 20
    assert into["times_scale"].__globals__ is into
    assert into["fib"](50) == 12586269025  # an @lru_cache function of the notebook


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_trained_model_and_its_optimizer_share_parameters(tmp_path, optimizer):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randn(16, 2)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    state = model.state_dict()  # views of the parameters' storages
    _, loaded, into = round_trip(tmp_path, {"model": model, "opt": opt, "state": state})

    assert loaded.restored == ["model", "opt", "state"]
    m, o = into["model"], into["opt"]
    assert torch.equal(m.weight, model.weight) and torch.equal(m.bias, model.bias)
    assert type(m.weight) is torch.nn.Parameter and m.weight.requires_grad
    assert o.param_groups[0]["params"][0] is m.weight
    assert o.param_groups[0]["params"][1] is m.bias
    assert all(p in o.state for p in m.parameters())  # optimizer state keyed by them
    assert into["state"]["weight"].data_ptr() == m.weight.data_ptr()
    # and it trains on from where it was
    o.zero_grad()
    torch.nn.functional.mse_loss(m(x), y).backward()
    o.step()


def test_bfloat16_and_views_round_trip(tmp_path):
    t = torch.randn(4, 6).to(torch.bfloat16)
    view = t[1:, ::2]
    _, _, into = round_trip(tmp_path, {"t": t, "view": view})
    assert into["t"].dtype is torch.bfloat16 and torch.equal(into["t"], t)
    assert torch.equal(into["view"], view) and into["view"].stride() == view.stride()
    into["t"][1, 0] = 7
    assert into["view"][0, 0].item() == 7  # still a view of t


def test_unsavable_values_are_skipped_with_the_fix_and_named_in_the_line(tmp_path):
    gen = (i for i in range(3))
    f = open(__file__)
    try:
        variables = {"x": 1, "gen": gen, "f": f, "y": [2]}
        saved, loaded, into = round_trip(tmp_path, variables)
    finally:
        f.close()
    why = dict(saved.skipped)
    assert why["gen"] == "a generator cannot be saved: run its cell again"
    assert why["f"] == "an open file cannot be saved: open it again"
    assert saved.saved == ["x", "y"]
    assert into["x"] == 1 and into["y"] == [2] and "gen" not in into
    assert loaded.failed == saved.skipped
    line = loaded.line("analysis.ipynb")
    assert line.startswith("analysis.ipynb: 2 of 4 variables back in ")
    assert "not back: gen (a generator cannot be saved: run its cell again), " in line
    assert "f (an open file cannot be saved: open it again)" in line
    assert "\n" not in line


def test_the_line_names_four_failures_then_counts(tmp_path):
    report = ns.LoadReport(["a"], [(f"g{i}", "gone") for i in range(6)], 1.25, "cpu", 0)
    assert report.line("n.ipynb") == (
        "n.ipynb: 1 of 7 variables back in 1.2 s; not back: g0 (gone), g1 (gone), "
        "g2 (gone), g3 (gone) and 2 more"
    )


def test_a_skipped_variable_leaves_no_trace_in_the_shared_memo(tmp_path):
    shared = [1, 2, 3]
    # `holder` reaches `shared` before failing: the memo must be rolled back, or
    # `alias` would point at bytes that were never written.
    holder = [shared, (i for i in range(2))]
    _, loaded, into = round_trip(tmp_path, {"holder": holder, "alias": shared, "again": shared})
    assert [n for n, _ in loaded.failed] == ["holder"]
    assert "it holds a generator" in loaded.failed[0][1]
    assert into["alias"] == [1, 2, 3] and into["again"] is into["alias"]


def test_a_tensor_written_by_a_variable_that_then_fails_is_written_again(tmp_path):
    t = torch.arange(1000.0)
    # `holder`'s tensor bytes go to the file before its generator fails: they are
    # truncated away, and `t` writes them again.
    variables = {"holder": [t, (i for i in range(2))], "t": t, "view": t[10:20]}
    saved, loaded, into = round_trip(tmp_path, variables)
    assert saved.saved == ["t", "view"] and loaded.restored == ["t", "view"]
    assert torch.equal(into["t"], t) and into["view"].data_ptr() == into["t"][10:].data_ptr()
    assert saved.bytes < 2 * t.numel() * 4  # written once


def test_a_full_disk_propagates_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    def full(self, buf):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ns._Sink, "write_now", full)
    with pytest.raises(OSError, match="No space left"):
        ns.save_namespace({"a": 1, "t": torch.ones(3), "b": 2}, str(tmp_path / "state.ns"))
    assert os.listdir(tmp_path) == []


def test_a_variable_whose_class_is_gone_fails_alone(tmp_path, monkeypatch):
    mod_dir = tmp_path / "mods"
    mod_dir.mkdir()
    (mod_dir / "nsstate_gone_mod.py").write_text(
        textwrap.dedent(
            """
            class Foo:
                def __init__(self, items):
                    self.items = items
            """
        )
    )
    monkeypatch.syspath_prepend(str(mod_dir))
    import nsstate_gone_mod

    shared = {"k": [1, 2]}
    variables = {
        "before": np.ones(3),
        "foo": nsstate_gone_mod.Foo(shared),  # writes `shared` inside its record
        "uses_shared": shared,  # refers back into foo's record: cannot come back either
        "after": {"z": [5, 6], "w": "text"},
    }
    path = tmp_path / "state.ns"
    ns.save_namespace(variables, str(path))

    monkeypatch.delitem(sys.modules, "nsstate_gone_mod")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(mod_dir)])
    into: dict = {}
    loaded = ns.load_namespace(str(path), into)

    why = dict(loaded.failed)
    assert why["foo"] == "its module nsstate_gone_mod is gone"
    assert why["uses_shared"] == "it shares objects with foo, not back"
    assert loaded.restored == ["before", "after"]
    np.testing.assert_array_equal(into["before"], np.ones(3))
    assert into["after"] == {"z": [5, 6], "w": "text"}


def test_a_class_gone_from_a_module_that_is_still_there(tmp_path, monkeypatch):
    import types

    mod = types.ModuleType("nsstate_thin_mod")
    exec("class Bar:\n    pass\n", mod.__dict__)
    mod.Bar.__module__ = "nsstate_thin_mod"
    monkeypatch.setitem(sys.modules, "nsstate_thin_mod", mod)
    path = tmp_path / "state.ns"
    ns.save_namespace({"bar": mod.Bar(), "n": 1}, str(path))
    del mod.Bar
    into: dict = {}
    loaded = ns.load_namespace(str(path), into)
    assert loaded.failed == [("bar", "its class nsstate_thin_mod.Bar is gone")]
    assert into == {"n": 1}


def test_over_the_cap_nothing_is_left_behind(tmp_path):
    with pytest.raises(ns.StateTooLarge, match="the state is over the cap of 1 MB"):
        ns.save_namespace({"a": np.zeros(2**20)}, str(tmp_path / "state.ns"), max_bytes=10**6)
    assert os.listdir(tmp_path) == []
    ns.save_namespace({"a": np.zeros(10)}, str(tmp_path / "state.ns"), max_bytes=10**6)
    assert os.listdir(tmp_path) == ["state.ns"]


def test_the_file_is_private_versioned_and_replaced_atomically(tmp_path):
    path = tmp_path / "state.ns"
    path.write_text("old")
    os.chmod(path, 0o644)
    ns.save_namespace({"a": 1}, str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert path.read_bytes().startswith(b"GPULAB-NS 1\n")
    assert os.listdir(tmp_path) == ["state.ns"]
    with pytest.raises(FileNotFoundError):
        ns.save_namespace({"a": 1}, str(tmp_path / "missing" / "state.ns"))
    (tmp_path / "other").write_bytes(b"not a state")
    with pytest.raises(ValueError, match="not a gpulab namespace file"):
        ns.load_namespace(str(tmp_path / "other"), {})


def test_gpu_tensors_come_back_on_the_cpu_without_a_gpu(tmp_path, monkeypatch):
    # A real GPU is mocked: CPU tensors are written as if they had been on one
    # (the _was_on_gpu seam), and the loading machine is told it has no GPU.
    monkeypatch.setattr(ns, "_was_on_gpu", lambda tensor: True)
    monkeypatch.setattr(ns, "_auto_device", lambda torch: "cpu")
    t = torch.arange(6.0)
    weight = torch.nn.Parameter(torch.ones(2, 2))
    _, loaded, into = round_trip(tmp_path, {"t": t, "weight": weight, "n": 3})
    assert loaded.device == "cpu" and loaded.moved_to_cpu == 2
    assert torch.equal(into["t"], t) and into["t"].device.type == "cpu"
    assert type(into["weight"]) is torch.nn.Parameter
    assert loaded.line("gpu.ipynb").endswith("; GPU tensors on the CPU (no GPU here)")
    assert loaded.to_json()["moved_to_cpu"] == 2


def test_user_variables_leaves_out_ipython_names():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    for cell in ("nsstate_x = 41", "nsstate_y = nsstate_x + 1", "nsstate_y", "_ + 1"):
        shell.run_cell(cell, store_history=True)
    try:
        names = ns.user_variables(shell)
        assert names["nsstate_x"] == 41 and names["nsstate_y"] == 42
        ipython_own = [
            n
            for n in names
            if n in {"In", "Out", "exit", "quit", "get_ipython", "_", "__", "___", "_i"}
            or n.startswith("__")
            or n[1:].lstrip("i").isdigit()
            or n in {"_ih", "_oh", "_dh", "_ii", "_iii"}
        ]
        assert ipython_own == []
        assert any(n.startswith("_i") and n[2:].isdigit() for n in shell.user_ns)  # were there
    finally:
        for n in ("nsstate_x", "nsstate_y"):
            shell.user_ns.pop(n, None)
