"""``%deploy --list`` refreshes in place while shown, in a real kernel (jupyter_client)
against the shared hub; names the service does not know get a "did you mean"."""

import re
import time

import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.slow

SETUP = """
%load_ext gpulab.magics
import torch
torch.manual_seed(1)
m = torch.nn.Linear(3, 2).eval()
x = torch.ones(2, 3)
"""


def run(kc, code, timeout=300):
    """Execute ``code``; return the iopub messages it sent until the kernel was idle."""
    msg_id = kc.execute(code)
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            seen.append(msg)  # a thread's update may carry another parent
            continue
        seen.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen
    raise AssertionError(f"{code!r} did not finish in {timeout} s")


def errors(msgs):
    return [m["content"] for m in msgs if m["msg_type"] == "error"]


def usage_error(msgs) -> str:
    """What IPython printed for a UsageError (it goes to stderr, not as an error)."""
    text = "".join(
        m["content"]["text"]
        for m in msgs
        if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"
    )
    return text.split("UsageError: ", 1)[1].strip() if "UsageError: " in text else text


def updated(msgs, display_id):
    """The texts of the ``update_display_data`` messages for ``display_id`` in ``msgs``."""
    return [
        m["content"]["data"]["text/plain"]
        for m in msgs
        if m["msg_type"] == "update_display_data"
        and m["content"].get("transient", {}).get("display_id") == display_id
    ]


def updates(kc, display_id, want, timeout):
    """Wait for ``want`` updates of ``display_id`` (the kernel idle meanwhile)."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            break
        got += updated([msg], display_id)
    return got


@pytest.fixture
def kernel(hub, monkeypatch):
    token = hub.create_user("livelist")
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        assert not errors(run(kc, SETUP))
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_list_refreshes_while_idle_and_unknown_names_get_suggestions(kernel):
    kc = kernel
    out = run(kc, "%deploy m --name sentiment --example x --max-batch-size 4")
    assert not errors(out), errors(out)

    shown = run(kc, "%deploy --list")
    (display,) = [m for m in shown if m["msg_type"] == "display_data"]
    display_id = display["content"]["transient"]["display_id"]
    first = display["content"]["data"]["text/plain"]
    assert re.search(r"sentiment\s+livelist\s+running\s+1/1\s+1:1\s+no GPU", first), first
    assert "refreshes every 5 s" in first
    assert "<b>sentiment</b>" in display["content"]["data"]["text/html"]  # what the lab draws
    # The kernel is idle now; the table is replaced in place every few seconds.
    later = updates(kc, display_id, want=2, timeout=30)
    assert len(later) == 2, later
    assert all("sentiment" in t and "(updated" in t for t in later), later

    # Running it again stops the first one, whose output keeps its last table.
    again = run(kc, "%deploy --list")
    finished = updated(again, display_id) or updates(kc, display_id, want=1, timeout=15)
    assert finished and "no longer refreshing" in finished[-1], finished
    (display,) = [m for m in again if m["msg_type"] == "display_data"]
    second = display["content"]["transient"]["display_id"]
    # Any other cell stops it too: what later cells do does not rewrite it.
    moved_on = run(kc, "print('next cell')")
    frozen = updated(moved_on, second) or updates(kc, second, want=1, timeout=15)
    assert frozen and "no longer refreshing" in frozen[-1], frozen
    assert updates(kc, second, want=1, timeout=12) == []

    # A typo: refused before anything is stopped, with the close name.
    for line in ("--stop sentimnt", "--promote sentimnet", "--rollback sentimen"):
        name = line.split()[1]
        said = usage_error(run(kc, f"%deploy {line}"))
        assert said == f"No deployment named '{name}'. Did you mean 'sentiment'?", said
    said = usage_error(run(kc, "%deploy --stop zzz"))
    assert said == "No deployment named 'zzz'. Yours: sentiment.", said

    stopped = run(kc, "%deploy --stop sentiment")
    text = "".join(m["content"].get("text", "") for m in stopped if m["msg_type"] == "stream")
    assert "stopped sentiment" in text
    said = usage_error(run(kc, "%deploy --stop sentiment"))
    assert said == "No deployment named 'sentiment'. You have none.", said


def test_gpulab_suggests_the_subcommand_meant():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    with capture_output() as out:
        ip.run_line_magic("gpulab", "dashbord")
    assert "unknown %gpulab command 'dashbord'. Did you mean %gpulab dashboard?" in out.stdout
