"""Every widget gpulab displays says what it is in one line of ``text/plain``, the form
nbconvert, papermill's logs and a terminal show (a plotly figure's repr is its whole
dict), while its widget view, the model JupyterLab draws, is the widget's own."""

import os

import ipywidgets as w
import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from nbclient import NotebookClient
from nbconvert import MarkdownExporter

import gpulab.widgets
from gpulab.magics.train_display import LIVE_TEXT, WidgetDisplay
from gpulab.widgets.dashboard import TEXT, Dashboard
from gpulab.widgets.show import WIDGET_VIEW, show, widget_bundle


@pytest.fixture(autouse=True)
def shell():
    """An IPython shell, so that display() publishes (without one it only prints)."""
    return InteractiveShell.instance()


def short(text: str) -> bool:
    return "\n" not in text and 0 < len(text) < 200


def close(live: WidgetDisplay) -> None:
    for widget in (live.head, live.title, live.bar, live.numbers, live.log, live.fig):
        widget.close()


def view_of(output) -> dict:
    return output.data[WIDGET_VIEW]


def test_show_gives_the_widgets_view_and_the_line():
    label = w.HTML("<b>hello</b>")
    with capture_output() as shown:
        show(label, "a label")
        handle = show(label, "a label, with an id", display_id="gpulab-test-label")
        show(label, "the label again", display_id="gpulab-test-label", update=True)
    first, second, third = shown.outputs
    assert first.data == {
        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": label.model_id},
        "text/plain": "a label",
    }
    assert handle.display_id == "gpulab-test-label"
    assert second.transient == {"display_id": "gpulab-test-label"}
    assert third.update and third.data["text/plain"] == "the label again"
    label.close()


def test_the_dashboard_is_one_line_wherever_it_is_shown(monkeypatch):
    board = Dashboard(start=False)
    try:
        # As a cell's last expression: what IPython's formatter makes of it.
        data, _ = InteractiveShell.instance().display_formatter.format(board)
        assert data["text/plain"] == TEXT and short(TEXT)
        assert data[WIDGET_VIEW]["model_id"] == board.model_id
        assert "%gpulab dashboard" in TEXT
    finally:
        board.close()

    # %gpulab dashboard (its updater off: no service here).
    boards = []

    def quiet(**kwargs):
        boards.append(Dashboard(start=False, **kwargs))
        return boards[-1]

    monkeypatch.setattr(gpulab.widgets, "Dashboard", quiet)
    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("gpulab.magics")
    with capture_output() as shown:
        shell.run_line_magic("gpulab", "dashboard")
    try:
        [output] = shown.outputs
        assert output.data["text/plain"] == TEXT
        assert view_of(output)["model_id"] == boards[0].model_id
    finally:
        boards[0].close()


def test_a_training_cells_live_parts_are_one_line_each():
    with capture_output() as shown:
        live = WidgetDisplay(2)
    try:
        assert live.fig is not None  # plotly's widget (anywidget) is installed here
        head, fig, log = shown.outputs
        for output, part in zip(shown.outputs, ("head", "fig", "log"), strict=True):
            assert output.data["text/plain"] == LIVE_TEXT[part] and short(LIVE_TEXT[part])
            assert output.transient == {"display_id": live.ids[part]}
            assert set(output.data) == {WIDGET_VIEW, "text/plain"}
        assert view_of(fig)["model_id"] == live.fig.model_id
        assert view_of(log)["model_id"] == live.log.model_id
        assert view_of(head)["model_id"] == live.head.model_id
    finally:
        close(live)


@pytest.mark.parametrize("part", ["fig", "head"])
def test_a_notebook_saved_while_a_job_runs_converts_to_a_short_markdown(part):
    with capture_output() as shown:
        live = WidgetDisplay(1)
    try:
        output = shown.outputs[["head", "fig", "log"].index(part)]
        cell = nbformat.v4.new_code_cell("%%train_distributed\n...")
        cell.outputs = [nbformat.v4.new_output("display_data", data=output.data)]
        markdown, _ = MarkdownExporter().from_notebook_node(nbformat.v4.new_notebook(cells=[cell]))
    finally:
        close(live)
    assert LIVE_TEXT[part] in markdown
    assert len(markdown.splitlines()) < 12, markdown  # no figure dict


def test_a_widget_without_a_view_still_names_its_model():
    model = w.Widget()  # no _view_name: ipywidgets gives no bundle of its own
    try:
        assert widget_bundle(model, "a model")[WIDGET_VIEW]["model_id"] == model.model_id
    finally:
        model.close()


def test_a_kernel_keeps_one_line_per_widget_and_the_status_table(tmp_path, monkeypatch):
    """In a real kernel (nbclient, as papermill runs one): what the saved notebook holds."""
    for name in [n for n in os.environ if n.startswith("GPULAB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPULAB_GPU_MILLI", "250")
    monkeypatch.setenv("GPULAB_GPU_UUID", "GPU-<1>")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(source)
        for source in (
            "%load_ext gpulab.magics",
            "%gpulab",
            "from gpulab.widgets import Dashboard\nboard = Dashboard(start=False)\nboard",
            "from gpulab.magics.train_display import WidgetDisplay\nlive = WidgetDisplay(2)",
        )
    ]
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    [status] = nb.cells[1].outputs
    assert status.data["text/plain"] == (
        "GPU: 1/4 GPU on GPU-<1>\nAPI: not set (this server was not started by gpulab)"
    )
    assert "<code>GPU-&lt;1&gt;</code>" in status.data["text/html"]
    shown = [o.data for cell in nb.cells[2:] for o in cell.outputs]
    assert [d["text/plain"] for d in shown] == [TEXT, *LIVE_TEXT.values()]
    assert all(set(d) == {WIDGET_VIEW, "text/plain"} for d in shown)
    markdown, _ = MarkdownExporter().from_notebook_node(nb)
    assert "'data'" not in markdown and len(markdown.splitlines()) < 60, markdown
