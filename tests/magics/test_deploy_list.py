"""What ``%deploy --list`` shows, without a hub: the HTML the lab draws, the text a
saved notebook keeps, and a live table that stops once another cell runs (the
end-to-end paths: tests/deploy/test_deploy_list_live.py, test_deploy_notebook.py)."""

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from support.wait import wait_until

from gpulab.magics.deploy_list import list_bundle, list_html, list_table
from gpulab.magics.deploy_live import LiveTable


def version(n, weight, state="running", message="running", **extra):
    return {
        "version": n,
        "weight": weight,
        "state": state,
        "message": message,
        "replicas": 1,
        "replicas_ready": 1 if state == "running" else 0,
        "requests_total": 1,
        "errors_total": 0,
        "p99_latency_ms": 4.25,
        "last_cold_start_s": None,
        **extra,
    }


def endpoint(name, user="ada", versions=None, **extra):
    return {
        "name": name,
        "user": user,
        "state": "running",
        "message": "running",
        "replicas": 1,
        "replicas_ready": 1,
        "min_replicas": 1,
        "max_replicas": 4,
        "gpu_milli": 250,
        "requests_per_second": 3.0,
        "p99_latency_ms": 4.25,
        "path": f"/services/gpulab/endpoints/{user}/{name}",
        "versions": [version(1, 100)] if versions is None else versions,
        **extra,
    }


def test_the_html_table_has_a_row_per_endpoint_and_its_versions_under_it():
    split = endpoint(
        "split", versions=[version(1, 80), version(2, 20, "starting", "wants 1/4 GPU")]
    )
    html = list_html([endpoint("sentiment"), split])
    assert html.count('<tr><td style="') == 2  # one row per endpoint
    assert "<b>sentiment</b>" in html and "/services/gpulab/endpoints/ada/sentiment" in html
    assert ">1:4<" in html and "1/4 GPU" in html and ">4.2<" in html
    assert "v1 · 80% of calls" in html and "1 call, 0 errors" in html
    assert "v2: wants 1/4 GPU" in html  # why a version waits, under it
    assert ">user<" not in html  # one owner: no column for it
    assert ">user<" in list_html([endpoint("a"), endpoint("b", user="bea")])  # an admin's view


def test_names_and_messages_are_escaped():
    html = list_html([endpoint("x", state="failed", versions=[], message="<script>boom</script>")])
    assert "<script>" not in html and "&lt;script&gt;boom" in html


def test_the_text_form_stays_a_short_table():
    text = list_table([endpoint("sentiment"), endpoint("other")])
    assert len(text.splitlines()) == 4  # header, rule, one line each
    assert list_bundle([])["text/plain"].startswith("no deployments (start one with")


def test_a_live_table_stops_refreshing_when_the_next_cell_runs():
    shell = InteractiveShell.instance()
    live = LiveTable(lambda: list_bundle([endpoint("sentiment")]), every=0.05, watch=60)
    with capture_output():
        live.show()
        wait_until(lambda: live.refreshes >= 2, "two refreshes of the live table", 30, every=0.05)
        shell.run_cell("1 + 1")  # the notebook moves on
        live._thread.join(timeout=30)
    assert not live._thread.is_alive()
    # The refresher has ended: no more reads, so no more rewrites of that output.
    assert live._next_cell not in shell.events.callbacks["pre_run_cell"]


def test_a_language_model_says_its_engine_and_tokens_per_second():
    chat = endpoint(
        "chat",
        model_kind="causal-lm",
        engine="transformers continuous batching (CPU; vLLM not installed)",
        tokens_per_second=312.5,
    )
    for shown in (list_table([chat]), list_html([chat])):
        assert "language model · 312.5 tokens/s" in shown, shown
        assert "engine: transformers continuous batching (CPU; vLLM not installed)" in shown
        assert "model id chat (others: ada/chat) at /services/gpulab/v1" in shown
    # Before a replica reports: no figures, and it says when they come.
    waiting = list_table([endpoint("chat", model_kind="causal-lm")])
    assert "- tokens/s · engine: said once a replica is ready" in waiting
    assert "language model" not in list_table([endpoint("sentiment", model_kind="torch-export")])
