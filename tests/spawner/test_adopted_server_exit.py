"""A server adopted after a hub restart is not the hub's child: when it exits it stays
a zombie until init reaps it. The spawner's poll counts a zombie as exited (JupyterHub's
signal 0 counts it as running, and a stop of the hub waited on it)."""

import subprocess
import sys

from support.wait import wait_until

from gpulab.spawner.local import _is_zombie


def test_a_zombie_counts_as_exited_a_live_process_does_not():
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert not _is_zombie(running.pid)
        # Not waited for: a zombie until reaped, as an adopted server is until init reaps it.
        wait_until(lambda: _is_zombie(exited.pid), "the exited child to be a zombie", 30)
    finally:
        running.kill()
        running.wait()
        exited.wait()
    assert not _is_zombie(exited.pid)  # reaped: gone
