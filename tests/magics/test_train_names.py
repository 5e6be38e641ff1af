"""A ``%%train_distributed`` cell that reads a notebook name it does not send is
refused in the kernel, before anything is queued, with the hint a rank's NameError
would have got (``tests/jobs`` runs the same through a hub and nbclient)."""

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from gpulab.magics.cell_names import free_names
from gpulab.magics.train import check_names

CELL = "from gpulab.training import setup\nctx = setup()\nmodel = Net()\n"


def test_free_names_are_the_reads_the_cell_never_binds():
    code = (
        "import torch\n"
        "from gpulab.training import setup\n"
        "def loss(x):\n    return (x * W).sum() + len(x)\n"
        "class Head:\n    size = width\n"
        "rows = [r for r in data]\n"
        "for step in range(3):\n    pass\n"
        "def bump():\n    global counter\n    counter = 1\n"
        "print(step, counter, torch, setup)\n"
    )
    assert free_names(code) == {"W", "width", "data"}
    assert free_names("!nvidia-smi") is None  # not Python: left to the ranks to say


def test_an_unsent_notebook_name_is_refused_with_the_fix():
    ns = {"Net": type("Net", (), {}), "data": [1], "np": pytest}
    with pytest.raises(UsageError) as info:
        check_names(CELL, [], ns)
    assert str(info.value) == (
        "`Net` is defined in this notebook but was not sent to the job: add `--vars Net`"
    )
    with pytest.raises(UsageError, match=r"add `--vars data,Net,lr`"):
        check_names(CELL + "print(lr, data)\n", ["data"], {**ns, "lr": 0.1})
    with pytest.raises(UsageError, match=r"add `import pytest as np` to the cell"):
        check_names("x = np.zeros(3)\n", [], ns)
    check_names(CELL, ["Net"], ns)  # sent: nothing to say
    check_names("model = Nett()\n", [], ns)  # the notebook lacks it too: the rank will say


def test_the_magic_refuses_before_it_contacts_the_service(monkeypatch, capsys):
    # No service is configured: had the magic got as far as submitting, the error
    # would be "no gpulab service", not the hint.
    for var in ("GPULAB_API_URL", "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext gpulab.magics")
    shell.run_cell("class Net:\n    pass")
    result = shell.run_cell(f"%%train_distributed --nproc-per-node 2\n{CELL}")
    assert isinstance(result.error_in_exec, UsageError)
    assert "add `--vars Net`" in str(result.error_in_exec)
