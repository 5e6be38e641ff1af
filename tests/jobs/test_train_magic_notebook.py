"""``%%train_distributed`` from real notebooks: nbclient against a real kernel and hub.

The kernel's environment carries what a gpulab server's has: ``GPULAB_API_URL``
and a user's ``JUPYTERHUB_API_TOKEN``.
"""

import queue
import time
from pathlib import Path

import nbformat
import pytest
import torch
from jobhelpers import wait_job
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from support.wait import wait_until

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "train_distributed.ipynb"


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub; this module's jobs stopped at its end."""
    return plain_hub


@pytest.fixture
def kernel_env(hub, monkeypatch):
    """A fresh user; the kernel inherits this process's environment."""

    def make(user):
        token = hub.create_user(user)
        monkeypatch.setenv("GPULAB_API_URL", hub.api)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
        return token

    return make


def run_cells(sources, tmp_path, timeout=600):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    return nb


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_example_notebook_trains_and_brings_the_weights_back(hub, kernel_env, tmp_path):
    token = kernel_env("nbuser")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    saved = tmp_path / "notebook_model.pt"
    nb.cells.append(nbformat.v4.new_code_cell(f"torch.save(model.state_dict(), {str(saved)!r})"))
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    train = next(c for c in nb.cells if c.source.startswith("%%train_distributed"))
    out = text_of(train)
    assert "succeeded" in out and "`model` holds rank 0's value" in out, out
    # The live view (widgets) was replaced by a copy the saved notebook keeps: the
    # chart as plotly's mime bundle (60 steps; checkpoints at 20, 40, 60 marked on the
    # loss panel, the service keeps the newest two on disk) and the final metrics.
    shown = [o.get("data", {}) for o in train.outputs if o.output_type == "display_data"]
    assert not any("application/vnd.jupyter.widget-view+json" in d for d in shown), shown
    [chart] = [
        d["application/vnd.plotly.v1+json"] for d in shown if "application/vnd.plotly.v1+json" in d
    ]
    loss, _, _, marks = chart["data"]
    assert len(loss["x"]) == 60 and loss["name"] == "loss"
    assert marks["name"] == "checkpoint" and set(marks["customdata"]) >= {40, 60}
    assert [
        a["title"]["text"] for k, a in sorted(chart["layout"].items()) if k.startswith("xaxis")
    ] == ["step"] * 3
    [summary] = [d["text/html"] for d in shown if "gpulab-train-summary" in d.get("text/html", "")]
    assert "succeeded" in summary and "final loss" in summary and "60 / 60" in summary
    check = nb.cells[-2]
    assert "Net: held-out loss" in text_of(check)
    after, before = [
        float(x)
        for x in text_of(check).split("loss ")[1].replace("(untrained: ", "").rstrip(")\n").split()
    ]
    assert after < before

    [job] = hub.gpulab("GET", "/jobs", token=token).json()
    assert job["state"] == "succeeded" and job["world_size"] == 2
    losses = [
        r["loss"]
        for r in hub.gpulab("GET", f"/jobs/{job['id']}/metrics", token=token).json()["records"]
    ]
    assert len(losses) == 60 and sum(losses[-10:]) < sum(losses[:10])
    # The notebook's `model` holds exactly the weights rank 0 saved.
    ours = torch.load(saved)
    ranks = torch.load(hub.data_dir / "jobs" / job["id"] / "out" / "state_dict.pt")
    assert ours.keys() == ranks.keys()
    for k in ours:
        assert torch.equal(ours[k], ranks[k]), k


def test_failing_job_raises_naming_the_rank_and_stops_run_all(hub, kernel_env, tmp_path):
    kernel_env("nbfail")
    cells = [
        "%load_ext gpulab.magics",
        "import os; os.environ['GPULAB_DISPLAY'] = 'text'",
        "%%train_distributed --nproc-per-node 2\n"
        "from gpulab.training import setup\n"
        "ctx = setup()\n"
        "if ctx.rank == 1:\n"
        "    raise ValueError('bad batch shape on purpose')\n"
        "ctx.barrier()\n",
        "print('this cell must not run')",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in cells]
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.raises(CellExecutionError):
        client.execute()
    [error] = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    assert error["ename"] == "TrainingJobFailed"
    shown = "\n".join(error["traceback"])
    assert "rank 1 raised ValueError: bad batch shape on purpose" in shown
    # The user's own frame (the cell's line), not torchrun's, gpulab's or IPython's.
    assert "cell, line 5" in shown and "raise ValueError('bad batch shape" in shown
    for internal in ("runner.py", "magics/train.py", "ChildFailedError", "site-packages"):
        assert internal not in shown, shown
    assert "Client().job_logs(" in shown
    # torchrun's own dump of the failure is not printed on top of the ranks' lines.
    printed = text_of(nb.cells[2])
    assert "ChildFailedError" not in printed and "Root Cause" not in printed, printed
    assert nb.cells[3].outputs == []  # "Run All" stopped at the failing cell


def test_a_notebook_name_not_sent_with_vars_is_refused_at_once_with_the_fix(
    hub, kernel_env, tmp_path
):
    token = kernel_env("nbvars")
    cells = [
        "%load_ext gpulab.magics",
        "class Net:\n    pass",
        "%%train_distributed --nproc-per-node 2\n"
        "from gpulab.training import setup\n"
        "ctx = setup()\n"
        "model = Net()\n",
        "print('this cell must not run')",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in cells]
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    with pytest.raises(CellExecutionError) as info:
        client.execute()
    said = str(info.value)
    assert (
        "UsageError: `Net` is defined in this notebook but was not sent to the job: "
        "add `--vars Net`" in said
    ), said
    # Told in the kernel: no job was queued, no rank started.
    assert hub.gpulab("GET", "/jobs", token=token).json() == []
    assert nb.cells[3].outputs == []


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("--nodes 0", "--nodes 0: must be 1 to 64"),
        ("--gpu lots", "--gpu 'lots': give GPUs per rank"),
        ("--gpu 0.3", "3/10 GPU is not a slice size offered here"),
        ("--amp fp8", "argument --amp: invalid choice: 'fp8'"),
        ("--env NOEQUALS", "--env 'NOEQUALS': write NAME=value"),
        ("--vars missing_thing", "no variable 'missing_thing' in the notebook"),
        ("--comm-hook bf16 --nproc-per-node 2", "bf16 needs NCCL"),
        ("--frobnicate", "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_flags_are_usage_errors_that_say_what_is_wrong(
    hub, kernel_env, tmp_path, flags, expected
):
    token = kernel_env("nbflags")
    with pytest.raises(CellExecutionError) as info:
        run_cells(["%load_ext gpulab.magics", f"%%train_distributed {flags}\nprint(1)\n"], tmp_path)
    assert "UsageError" in str(info.value) and expected in str(info.value), str(info.value)
    assert hub.gpulab("GET", "/jobs", token=token).json() == []


def test_help_lists_the_flags(hub, kernel_env, tmp_path):
    kernel_env("nbhelp")
    nb = run_cells(
        [
            "%load_ext gpulab.magics",
            "from IPython import get_ipython\n"
            "print(get_ipython().find_cell_magic('train_distributed').__doc__)",
        ],
        tmp_path,
    )
    text = text_of(nb.cells[1])
    for flag in (
        "--nodes",
        "--nproc-per-node",
        "--gpu",
        "--backend",
        "--pool",
        "--max-restarts",
        "--checkpoint-every",
        "--amp",
        "--comm-hook",
        "--vars",
        "--env",
        "--out",
        "--name",
        "--detach",
        "--timeout",
        "--priority",
    ):
        assert flag in text, flag


def test_interrupting_the_cell_cancels_the_job(hub, kernel_env, tmp_path):
    from jupyter_client.manager import start_new_kernel

    token = kernel_env("nbint")
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive("%load_ext gpulab.magics", timeout=120)
        msg_id = kc.execute(
            "%%train_distributed --nproc-per-node 2 --gpu 0.5\n"
            "import time\nfrom gpulab.training import setup, report\n"
            "ctx = setup()\nfor s in range(100000):\n"
            "    time.sleep(0.2); report(step=s)\n"
        )
        jobs = wait_until(
            lambda: (
                (js := hub.gpulab("GET", "/jobs", token=token).json())
                and js[0]["state"] == "running"
                and js
            ),
            "the cell's job to be running",
            300,
        )
        job = jobs[0]
        wait_job(hub, token, job["id"], states=("running",))
        # A user stops the cell once it shows the job: wait for its first display. (In
        # one CI run the job was running 0.14 s after its submission, the interrupt went
        # at once, and the cell went on following the job for 2 minutes: an interrupt
        # that early was lost; where, is not found yet.)
        error, seen = None, []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])
            if msg["msg_type"] in ("display_data", "update_display_data", "stream"):
                break
        km.interrupt_kernel()
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=120)
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                error = msg["content"]["ename"]
                seen += msg["content"]["traceback"]
            if msg["msg_type"] == "stream":
                seen.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        # One line, no traceback through gpulab's magics; still an interrupt ("Run All" stops).
        assert error == "TrainingJobCancelled", seen
        assert not any("Traceback" in t or "magics/train.py" in t for t in seen), seen
        done = hub.gpulab("GET", f"/jobs/{job['id']}", token=token).json()
        assert done["state"] == "cancelled", (done, seen)
        assert done["message"] == "cancelled by its owner"
        assert any(f"job {job['id']} cancelled (interrupted)" in t for t in seen), seen
        assert [a for a in hub.gpulab("GET", "/allocations", token=token).json()] == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
