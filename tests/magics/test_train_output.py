"""What a ``%%train_distributed`` cell shows when its job ends, without a hub.

The failure (root cause once, the user's frames, a hint, where the logs are) is
checked through a real IPython shell; the saved chart is checked as the plotly
document JupyterLab draws after a reload. End to end: tests/jobs (nbclient) and
tests/browser/test_train_cell.py (Chromium).
"""

import json
import os

from IPython.core.interactiveshell import InteractiveShell

import gpulab.training.runner
from gpulab.backend.jobdir import JobDir
from gpulab.magics.train_display import Rates, TorchrunDumpFilter
from gpulab.magics.train_failure import TrainingJobFailed, failure_lines, hint, user_frames
from gpulab.widgets.training import WAITING, static_bundle

# What the service gave for a 2-rank job whose cell used a notebook class without --vars.
# The runner's frame names wherever gpulab is installed (a checkout's path differs by machine).
TRACEBACK = (
    "Traceback (most recent call last):\n"
    f'  File "{gpulab.training.runner.__file__}", line 111, in run\n'
    "    exec(code, namespace)\n"
    '  File "/srv/gpulab/jobs/b1b1ae73e689/cell.py", line 4, in <module>\n'
    "    model = ctx.wrap(Net())\n"
    "                     ^^^\n"
    "NameError: name 'Net' is not defined\n"
)
JOB = {
    "id": "b1b1ae73e689",
    "name": "train",
    "state": "failed",
    "gpu_milli": 0,
    "message": "rank 1 failed: NameError: name 'Net' is not defined",
    "error": {
        "rank": 1,
        "type": "NameError",
        "message": "name 'Net' is not defined",
        "traceback": TRACEBACK,
    },
}


def test_only_the_users_frames_are_kept():
    assert user_frames(TRACEBACK) == [("cell", 4, "<module>", "model = ctx.wrap(Net())")]
    site = (
        "Traceback (most recent call last):\n"
        '  File "/srv/gpulab/jobs/x/cell.py", line 9, in <module>\n'
        "    train(model)\n"
        '  File "/home/alice/mylib.py", line 3, in train\n'
        "    model(x)\n"
        '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in f\n'
        "    return forward(x)\n"
        "RuntimeError: shapes cannot be multiplied\n"
    )
    assert [f[:2] for f in user_frames(site)] == [("cell", 9), ("/home/alice/mylib.py", 3)]


def test_hints_for_common_mistakes():
    ns = {"Net": type("Net", (), {})}
    assert hint(JOB["error"], [], ns) == (
        "`Net` is defined in this notebook but was not sent to the job: add `--vars Net`"
    )
    assert "add `--vars data,Net`" in hint(JOB["error"], ["data"], ns)
    assert hint(JOB["error"], [], {}) is None  # not the notebook's either: no guess
    np_error = {"type": "NameError", "message": "name 'np' is not defined"}
    assert hint(np_error, [], {"np": json}) == (
        "`np` is imported in this notebook, not in the cell: add `import json as np` to the cell"
    )
    missing = {"type": "ModuleNotFoundError", "message": "No module named 'json.nope'"}
    assert "installed in this notebook's environment but not installed where the job runs" in (
        hint(missing, [], {})
    )
    oom = {"type": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 2 GiB"}
    assert "slice of 1/4 GPU is a memory limit" in hint(oom, [], {}, gpu_milli=250)
    assert hint({"type": "ValueError", "message": "bad"}, [], ns) is None


def test_ipython_shows_the_failure_in_a_few_lines(capsys):
    shell = InteractiveShell.instance()
    shell.user_ns["failure"] = TrainingJobFailed(
        JOB, failure_lines(JOB, hint(JOB["error"], [], {"Net": object}))
    )
    result = shell.run_cell("raise failure")
    assert isinstance(result.error_in_exec, TrainingJobFailed)
    shown = capsys.readouterr().out + capsys.readouterr().err
    text = "\n".join(line for line in shown.splitlines() if line.strip())
    assert "rank 1 raised NameError: name 'Net' is not defined" in text
    assert (
        "cell, line 5" in text
    )  # as the notebook counts: the magic's line is 1 and "model = ctx.wrap(Net())" in text
    assert "add `--vars Net`" in text
    assert "print(Client().job_logs('b1b1ae73e689'))" in text
    # No traceback through IPython or the magic, no echo of the raising cell.
    assert "raise failure" not in text and "runner.py" not in text and "File " not in text
    assert len(text.splitlines()) == 5, text


def test_torchruns_failure_dump_is_not_printed_again():
    lines = [
        "[r1] NameError: name 'Net' is not defined",
        "[node0] W1201 starting 2 workers",
        "[node0] E1201 12:44:20.452000 api.py:1002] failed (exitcode: 1) local_rank: 0",
        "[node0] Traceback (most recent call last):",
        "[node0] torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "[node0] Root Cause (first observed failure):",
    ]
    drop = TorchrunDumpFilter()
    assert drop(lines[:3]) == lines[:2]
    assert drop(lines[3:] + ["[gpulab] job failed"]) == ["[gpulab] job failed"]


def records(n):
    return [
        {"time": 100.0 + s, "step": s, "total_steps": n, "loss": 1.0 / (s + 1), "lr": 0.05}
        for s in range(n)
    ]


def test_the_saved_chart_has_labeled_axes_points_and_checkpoint_markers():
    rates = Rates(2)
    rates.add(records(30))
    rates.add_checkpoints([20, 30])
    rates.add_checkpoints([10, 20])  # the service keeps the newest few; we keep all seen
    bundle = static_bundle(rates.points, rates.checkpoints, "job x: succeeded")
    figure = bundle["application/vnd.plotly.v1+json"]
    json.dumps(figure)  # plain JSON, as it is saved in the notebook
    loss, lr, _, marks = figure["data"]
    assert loss["x"] == list(range(30)) and lr["y"] == [0.05] * 30
    assert marks["customdata"] == [10, 20, 30] and marks["x"] == [9, 19, 29]
    assert marks["y"] == [1 / 10, 1 / 20, 1 / 30]
    layout = figure["layout"]
    assert [layout[a]["title"]["text"] for a in ("xaxis", "xaxis2", "xaxis3")] == ["step"] * 3
    assert [layout[a]["title"]["text"] for a in ("yaxis", "yaxis2", "yaxis3")] == [
        "loss",
        "lr",
        "samples/s",
    ]
    assert WAITING not in json.dumps(layout)
    assert layout["xaxis"]["showticklabels"] and layout["yaxis"]["showgrid"]
    assert dict(rates.final())["final loss"] == "0.03333"
    assert dict(rates.final())["checkpoints"] == "10, 20, 30"


def test_an_empty_chart_says_it_is_waiting():
    from gpulab.widgets.training import training_figure

    fig = training_figure()
    texts = [a.text for a in fig.layout.annotations]
    assert texts.count(WAITING) == 3
    # ...and on bare axes, not plotly's made-up -1..6 scale.
    assert fig.layout.xaxis.showticklabels is False and fig.layout.yaxis3.showgrid is False


def test_checkpoint_steps_are_the_complete_ones_on_disk(tmp_path):
    jd = JobDir(str(tmp_path), "j1")
    os.makedirs(jd.p("checkpoints", "step_00000020"))
    os.makedirs(jd.p("checkpoints", "step_00000030"))  # being written: not in `latest` yet
    assert jd.checkpoint_steps() == []
    with open(jd.p("checkpoints", "latest"), "w") as f:
        json.dump({"step": 20, "time": 1.0}, f)
    assert jd.checkpoint_steps() == [20]


def test_a_starting_job_says_what_it_does_until_its_first_metric(capsys):
    from gpulab.magics.train_display import Startup, TextDisplay

    now = [100.0]
    startup = Startup(2, clock=lambda: now[0])
    job = {"state": "queued"}
    assert startup.phase(job, []) == ""  # the status line says "queued"
    job["state"] = "running"
    assert startup.phase(job, ["[gpulab] job started: 2 ranks on CPU"]) == "starting 2 ranks (0 s)"
    now[0] += 6
    assert startup.phase(job, ["[node0] INFO Starting elastic_operator"]) == (
        "torchrun started; the ranks import torch and join the process group (6 s)"
    )
    now[0] += 12
    assert startup.phase(job, ["[r1] loading data"]) == (
        "the ranks run the cell; waiting for the first report() (18 s)"
    )
    # The text form prints a phase once, not every poll; metrics end it.
    shown = TextDisplay(2)
    for lines in ([], [], ["[node0] up"], ["[r0] hi"], []):
        shown.starting({"state": "running"}, lines)
    printed = [ln.rsplit(" (", 1)[0] for ln in capsys.readouterr().out.splitlines()]
    assert printed == [
        "starting 2 ranks",
        "torchrun started; the ranks import torch and join the process group",
        "the ranks run the cell; waiting for the first report()",
    ]
    shown.metrics([{"step": 0, "time": 1.0, "loss": 1.0, "total_steps": 10}])
    capsys.readouterr()
    shown.starting({"state": "running"}, [])
    assert capsys.readouterr().out == ""
