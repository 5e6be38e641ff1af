"""Quantization-aware training: ``ctx.wrap(model, qat="int8-int4")`` trains with
torchao's fake quantization, and ``%quantize`` in a real IPython shell converts the
model and sets it beside post-training quantization of the same network trained
without QAT (size, accuracy, output error)."""

import re

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from gpulab.training import setup
from gpulab.training.context import SetupError

D, H, C = 32, 128, 8


def data(n: int, seed: int):
    """Inputs with uneven feature scales, labelled by a fixed teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(D, C, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, D, generator=g) * torch.linspace(0.2, 3, D)
    return x, (x @ teacher).argmax(1)


def net():
    torch.manual_seed(1)  # the same start for both
    return torch.nn.Sequential(
        torch.nn.Linear(D, H),
        torch.nn.ReLU(),
        torch.nn.Linear(H, H),
        torch.nn.ReLU(),
        torch.nn.Linear(H, C),
    )


def train(model, x, y, steps=150):
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (128,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def shell():
    ctx = setup()  # one process: no group, as a notebook cell outside a job
    x, y = data(2048, seed=3)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpulab.magics")
    ip.user_ns["net"] = train(ctx.wrap(net()), x, y)
    ip.user_ns["qat_net"] = train(ctx.wrap(net(), qat="int8-int4"), x, y)
    ip.user_ns["xv"], ip.user_ns["yv"] = data(1024, seed=4)
    yield ip
    InteractiveShell.clear_instance()


def run(shell, capsys, cell):
    result = shell.run_cell(cell)
    out = capsys.readouterr()
    return result, out.out + out.err


def test_qat_beside_ptq_in_the_report(shell, capsys):
    qat_net = shell.user_ns["qat_net"]
    assert qat_net.gpulab_qat == "int8-int4"
    assert type(qat_net[0]).__name__ == "FakeQuantizedLinear"

    result, out = run(
        shell,
        capsys,
        "%quantize qat_net --scheme int8-int4 --example xv[:64] --ptq net "
        "--accuracy xv,yv --to qm --runs 2",
    )
    assert result.success, out
    assert "int8-int4 with engine torchao on cpu" in out
    assert "trained quantization-aware for int8-int4: converted as trained" in out
    assert "int8-int4: quantization-aware training beside post-training quantization" in out
    rows = {}
    for name in ("float (no QAT)", "PTQ int8-int4", "QAT int8-int4"):
        m = re.search(rf"^{re.escape(name)}\s+([\d.]+) KiB\s+([\d.]+)%", out, re.M)
        assert m, out
        rows[name] = (float(m.group(1)), float(m.group(2)) / 100)
    print(out)  # the figures, for whoever reads the test's log
    size_float, acc_float = rows["float (no QAT)"]
    size_ptq, acc_ptq = rows["PTQ int8-int4"]
    size_qat, acc_qat = rows["QAT int8-int4"]
    # int4 weights (one per byte on CPU) with their scales: about a third of float32.
    assert size_qat == size_ptq < size_float / 2.5
    # The float network learned the task; the QAT one, converted, keeps up with it.
    assert acc_float > 0.7 and acc_qat > acc_float - 0.05
    assert abs(acc_ptq - acc_float) < 0.2
    # The converted model is bound and answers like the QAT model as trained.
    qm = shell.user_ns["qm"]
    assert type(qm[0]).__name__ == "Linear"
    xv = shell.user_ns["xv"][:64]
    with torch.inference_mode():
        agree = (qm(xv).argmax(1) == shell.user_ns["qat_net"](xv).argmax(1)).float().mean()
    assert agree > 0.9


def test_a_qat_model_is_converted_only_as_it_trained(shell, capsys):
    result, out = run(
        shell, capsys, "%quantize qat_net --scheme int8-dynamic --example xv --to q --runs 1"
    )
    assert not result.success
    assert "this model trained quantization-aware for int8-int4; quantize it with" in out
    result, out = run(
        shell, capsys, "%quantize qat_net --scheme int8-int4 --example xv --to q --runs 1"
    )
    assert result.success, out
    assert "give --ptq MODEL (the same network trained without qat=)" in out


def test_an_unknown_qat_scheme_is_one_line():
    with pytest.raises(SetupError, match="unknown QAT scheme 'int2'; choose one of int8-int4"):
        setup().wrap(net(), qat="int2")


def test_the_qat_flag_reaches_the_ranks_wrap(monkeypatch):
    from gpulab.backend.render import render_node
    from gpulab.backend.spec import JobSpec, SpecError
    from gpulab.training.env import QAT

    flagged = JobSpec(code="pass", qat="int8-int4")
    flagged.validate()
    env = render_node(flagged, 0, job_dir="/jobs/q", rdzv_host="h", rdzv_port=1).env
    assert env[QAT] == "int8-int4"
    plain = render_node(JobSpec(code="pass"), 0, job_dir="/jobs/q", rdzv_host="h", rdzv_port=1)
    assert QAT not in plain.env  # a job without --qat renders as before the flag
    with pytest.raises(SpecError, match="'qat' must be int8-int4 or left out"):
        JobSpec(code="pass", qat="int2").validate()

    # In the rank, ctx.wrap(model) then trains quantization-aware, as qat= does.
    monkeypatch.setenv(QAT, "int8-int4")
    wrapped = setup().wrap(net())
    assert wrapped.gpulab_qat == "int8-int4"
    assert type(wrapped[0]).__name__ == "FakeQuantizedLinear"
