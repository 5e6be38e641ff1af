"""The idle culler ends with the hub that started it (``gpulab.hub_ext.with_the_hub``):
left running after a hub killed without its shutdown, it sent its token, which stops
anyone's server, to whoever took the hub's port."""

import os
import signal
import subprocess
import sys

import psutil
from support.wait import wait_until

#: The hub's part: start the command through the wrapper, say its pid, wait.
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "gpulab.hub_ext.with_the_hub", str(os.getpid()),
                          sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_the_command_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        # The wrapper became the command (exec), and runs while its parent does.
        wait_until(lambda: child.cmdline()[1:2] == ["-c"], "the exec", 30)
        assert child.is_running()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_until(
            lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
            "the command to end with its parent",
            30,
        )
    finally:
        parent.kill()
        if child.is_running():
            child.kill()


def test_a_command_whose_hub_is_gone_does_not_start(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gpulab.hub_ext.with_the_hub", "1", "touch", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "the hub (pid 1) is gone" in done.stderr
    assert not (tmp_path / "x").exists()
