"""An elastic ``%%train_distributed --nodes MIN:MAX`` cell, without a hub: the flag,
the status line, each resize told once, the world size on the chart, and the
finished summary. Job dicts and records are those ``GET /jobs/{id}`` and
``/metrics`` serve."""

import json
from types import SimpleNamespace

import pytest
from IPython.core.error import UsageError

from gpulab.magics.train import build_spec, parse_nodes
from gpulab.magics.train_display import (
    Rates,
    ResizeLog,
    TextDisplay,
    describe,
    nodes_summary,
    resizes_html,
)
from gpulab.widgets.training import WORLD, shows_world, static_bundle

SHRANK = {"step": 300, "nodes": 1, "reason": "an interactive server needed a GPU", "time": 2.0}
GREW = {"step": 420, "nodes": 2, "reason": "slices freed", "time": 3.0}


def job(**over):
    base = {
        "id": "3f2a9c",
        "name": "train",
        "state": "running",
        "pool": "local",
        "elastic": True,
        "min_nodes": 1,
        "max_nodes": 2,
        "nodes": 2,
        "nodes_running": 2,
        "nproc_per_node": 1,
        "world_size": 2,
        "resizing": False,
        "resizes": [],
        "restarts": 0,
        "message": "running",
    }
    return {**base, **over}


def args(nodes):
    defaults = dict(
        nodes=nodes,
        nproc_per_node=1,
        max_restarts=0,
        checkpoint_every=0,
        timeout=None,
        out=None,
        vars=None,
        name="train",
        gpu="0",
        backend="",
        pool="",
        amp=None,
        comm_hook=None,
        env=None,
        priority=0,
        priority_class="batch",
        no_preempt=False,
        image=None,
    )
    return SimpleNamespace(**defaults)


def test_nodes_is_a_count_or_an_elastic_range():
    assert parse_nodes("2") == (2, 0, 0)
    assert parse_nodes("1:4") == (4, 1, 4)  # nodes = MAX; the service sizes it at launch
    assert parse_nodes("3:3") == (3, 0, 0)  # no range: a fixed job
    spec = build_spec(args("1:4"), "print(1)\n", {})
    assert (spec["nodes"], spec["min_nodes"], spec["max_nodes"]) == (4, 1, 4)
    spec = build_spec(args("2"), "print(1)\n", {})
    assert (spec["nodes"], spec["min_nodes"], spec["max_nodes"]) == (2, 0, 0)


@pytest.mark.parametrize(
    "text, said",
    [
        ("3:1", "--nodes 3:1: MIN must be <= MAX, e.g. --nodes 1:3"),
        ("a:b", "--nodes a:b: MIN and MAX must be whole numbers, e.g. --nodes 1:4"),
        ("0:2", "--nodes 0:2: MIN must be at least 1, e.g. --nodes 1:2"),
        ("1:", "--nodes 1:: MIN and MAX must be whole numbers"),
        ("1:65", "--nodes 1:65: MAX must be at most 64, e.g. --nodes 1:64"),
        ("0", "--nodes 0: must be 1 to 64"),
        ("two", "--nodes two: give a number of nodes or MIN:MAX, e.g. --nodes 2"),
    ],
)
def test_a_bad_nodes_flag_says_what_to_write(text, said):
    with pytest.raises(UsageError) as info:
        build_spec(args(text), "print(1)\n", {})
    assert str(info.value).startswith(said)


def test_the_status_line_gives_an_elastic_jobs_size_and_a_resize_under_way():
    assert describe(job()) == "job 3f2a9c (train): running on 2 of 1-2 nodes"
    resizing = job(
        resizing=True,
        message="shrinking to 1 node: saving a checkpoint at the next step "
        "(an interactive server needed a GPU)",
    )
    assert describe(resizing) == (
        "job 3f2a9c (train): running on 2 of 1-2 nodes; shrinking to 1 node: saving a "
        "checkpoint at the next step (an interactive server needed a GPU)"
    )
    queued = job(state="queued", nodes=1, nodes_running=0, position=3, message="queued")
    assert describe(queued) == "job 3f2a9c (train): queued for 1-2 nodes, position 3 in the queue"
    fixed = job(elastic=False, min_nodes=None, max_nodes=None)
    assert describe(fixed) == "job 3f2a9c (train): running"


def test_each_resize_is_printed_once_in_the_event_logs_words(capsys):
    shown = TextDisplay(2, elastic=True)
    shown.status(job())
    shown.status(job(resizing=True, message="shrinking to 1 node: saving a checkpoint"))
    # The event line streams first: the job's entry then says nothing more.
    shown.logs(["[gpulab] shrank to 1 node at step 300: an interactive server needed a GPU"])
    shown.status(job(nodes=1, nodes_running=1, world_size=1, resizes=[SHRANK]))
    shown.status(job(nodes=1, nodes_running=1, world_size=1, resizes=[SHRANK]))
    # The entry comes first (or the log line was cut): printed from it, once.
    shown.status(job(resizes=[SHRANK, GREW]))
    shown.logs(["[gpulab] grew to 2 nodes at step 420: slices freed", "[r0] step 421"])
    shown.status(job(resizes=[SHRANK, GREW]))
    assert capsys.readouterr().out.splitlines() == [
        "job 3f2a9c (train): running on 2 of 1-2 nodes",
        "job 3f2a9c (train): running on 2 of 1-2 nodes; shrinking to 1 node: saving a checkpoint",
        "[gpulab] shrank to 1 node at step 300: an interactive server needed a GPU",
        "job 3f2a9c (train): running on 1 of 1-2 nodes",
        "[gpulab] grew to 2 nodes at step 420: slices freed",
        "job 3f2a9c (train): running on 2 of 1-2 nodes",
        "[r0] step 421",
    ]


def test_resize_lines_come_from_the_entries_even_when_first_seen_late():
    log = ResizeLog()
    failed = {"step": 40, "nodes": 1, "reason": "rank 1 failed (OSError: gone)", "time": 4.0}
    # The cell first looks after two resizes: the first one's size before is unknown.
    assert log.update(job(resizes=[SHRANK, GREW])) == [
        "resized to 1 node at step 300: an interactive server needed a GPU",
        "grew to 2 nodes at step 420: slices freed",
    ]
    assert log.update(job(nodes=1, resizes=[SHRANK, GREW, failed])) == [
        "shrank to 1 node at step 40: rank 1 failed (OSError: gone)"
    ]
    again = {**failed, "step": 60}
    assert log.update(job(nodes=1, resizes=[SHRANK, GREW, failed, again])) == [
        "restarted on 1 node at step 60: rank 1 failed (OSError: gone)"
    ]
    assert "<li>... and 1 earlier</li>" in resizes_html(log.lines, shown=3)


def test_the_finished_summary_says_the_range_and_resizes():
    assert nodes_summary(job(state="succeeded", resizes=[SHRANK, GREW])) == "1-2, resized 2 times"
    assert nodes_summary(job(state="succeeded")) == "1-2, 2 nodes throughout"
    assert nodes_summary(job(elastic=False)) is None


def records(steps, world):
    return [
        {"time": 100.0 + s, "step": s, "total_steps": 30, "loss": 1.0, "samples": 8, **world(s)}
        for s in steps
    ]


def test_throughput_counts_each_steps_own_world_size():
    rates = Rates(2)
    rates.add(records(range(5), lambda s: {"world_size": 2 if s < 3 else 1}))
    # samples * that step's world size / dt; none across the resize (the relaunch's gap).
    assert rates.points["throughput"] == [None, 16.0, 16.0, None, 8.0]
    assert rates.points["world_size"] == [2, 2, 2, 1, 1]
    old = Rates(4)
    old.add(records(range(2), lambda s: {}))  # records from before they said theirs
    assert old.points["throughput"] == [None, 32.0]


def traces(bundle):
    return [t.get("name") for t in bundle["application/vnd.plotly.v1+json"]["data"]]


def test_the_chart_draws_the_world_size_of_a_job_whose_size_changed():
    rates = Rates(2)
    rates.add(records(range(10), lambda s: {"world_size": 2 if s < 4 or s > 7 else 1}))
    bundle = static_bundle(rates.points, [], "job x: succeeded")
    figure = bundle["application/vnd.plotly.v1+json"]
    json.dumps(figure)
    (world,) = [t for t in figure["data"] if t.get("name") == WORLD]
    assert world["x"] == list(range(10)) and world["y"] == [2] * 4 + [1] * 4 + [2] * 2
    assert world["line"]["shape"] == "hv" and world["yaxis"] == "y4"
    assert figure["layout"]["yaxis4"]["title"]["text"] == "ranks"
    assert figure["layout"]["yaxis4"]["overlaying"] == "y3"


def test_a_fixed_jobs_chart_has_no_world_size():
    rates = Rates(2)
    rates.add(records(range(10), lambda s: {"world_size": 2}))
    assert not shows_world(rates.points)
    bundle = static_bundle(rates.points, [], "job x: succeeded")
    assert WORLD not in traces(bundle)
    assert "yaxis4" not in bundle["application/vnd.plotly.v1+json"]["layout"]
    # An elastic job that never resized still shows its (flat) size.
    assert WORLD in traces(static_bundle(rates.points, [], "job x", elastic=True))
