"""``%quantize`` in a real IPython shell: the table, the new variable, and usage errors."""

import re
import subprocess
import sys

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpulab.magics")
    torch.manual_seed(0)
    ip.user_ns["model"] = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    ).eval()
    ip.user_ns["x"] = torch.randn(4, 32)
    yield ip
    InteractiveShell.clear_instance()


def run(shell, capsys, cell):
    result = shell.run_cell(cell)
    out = capsys.readouterr()
    return result, out.out + out.err


def test_quantize_prints_the_table_and_binds_the_new_model(shell, capsys):
    result, out = run(
        shell, capsys, "%quantize model --scheme int8-dynamic --example x --to qmodel --runs 3"
    )
    assert result.success, out
    for expected in (
        "int8-dynamic with engine torch-ao on cpu",
        "size",
        "latency (median of 3)",
        "x smaller",
        "output error: max-abs",
        "relative",
        "stored in 'qmodel'",
    ):
        assert expected in out
    assert re.search(r"\d+\.\d\dx (faster|slower)", out)
    q = shell.user_ns["qmodel"]
    assert q is not shell.user_ns["model"]
    torch.testing.assert_close(
        q(shell.user_ns["x"]), shell.user_ns["model"](shell.user_ns["x"]), atol=0.05, rtol=0.05
    )


def test_engine_and_expression_example(shell, capsys):
    result, out = run(
        shell,
        capsys,
        "%quantize model --scheme int8-weight --engine torchao --example x[:2] --to q8 --runs 2",
    )
    assert result.success, out
    assert "int8-weight with engine torchao" in out and "q8" in shell.user_ns


@pytest.mark.parametrize(
    "line,message",
    [
        ("%quantize model --scheme fp8-dynamic --example x --to q", "compute capability >= 8.9"),
        (
            "%quantize model --scheme int8-weight --engine torch-ao --example x --to q",
            "only does int8-dynamic",
        ),
        ("%quantize model --scheme int3 --example x --to q", "invalid choice: 'int3'"),
        ("%quantize model --example x --to q", "--scheme"),
        ("%quantize missing --scheme int8-dynamic --example x --to q", "no variable 'missing'"),
        (
            "%quantize model --scheme int8-dynamic --example nothing_here --to q",
            "could not be evaluated",
        ),
        (
            "%quantize model --scheme int8-dynamic --example x --to 9bad",
            "--to needs a variable name",
        ),
    ],
)
def test_usage_errors_say_what_is_wrong(shell, capsys, line, message):
    result, out = run(shell, capsys, line)
    assert not result.success
    assert "UsageError" in out and message in out
    assert "Traceback" not in out


def test_help(shell, capsys):
    _, out = run(shell, capsys, "%quantize?")
    assert "--scheme" in out and "--example" in out and "fp8-dynamic" in out


def test_the_magic_and_the_server_keep_to_their_rooms():
    # magics run in the kernel, serving inside model servers: neither pulls in the hub side.
    code = (
        "import sys, gpulab.magics.quantize, gpulab.serving.server, gpulab.serving.quantize\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'jupyterhub' or m.startswith(("
        "'gpulab.hub_ext', 'gpulab.scheduler', 'gpulab.backend', 'gpulab.spawner'))]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
