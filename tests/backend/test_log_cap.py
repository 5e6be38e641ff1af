"""Logs that stay under their cap, and readers that go on across a cut.

The writer is the real program (``python -m gpulab.training.log_cap``) running a
real child that prints; the reader is the service's :class:`LogTail`.
"""

import os
import subprocess
import sys

from support.wait import wait_until

from gpulab.backend.jobdir import JobDir, LogTail
from gpulab.training.log_cap import CappedLog, dropped_of

MIB = 2**20
PRINT = "import sys\nfor i in range({n}): print(f'line {{i:07d}}')\nsys.exit({code})"


def test_a_log_over_its_cap_keeps_the_newest_lines_and_says_so(tmp_path):
    log, exit_file = tmp_path / "node0.log", tmp_path / "node0.exit"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gpulab.training.log_cap", "--max-bytes", str(MIB)),
            *("--exit-file", str(exit_file), str(log), "--"),
            *(sys.executable, "-c", PRINT.format(n=300_000, code=3)),
        ],
        timeout=120,
    )
    # 300,000 lines of 13 bytes: 3.7 MiB printed, at most 1 MiB kept.
    assert done.returncode == 3
    assert exit_file.read_text() == "3\n"
    data = log.read_bytes()
    assert len(data) <= MIB
    first, rest = data.split(b"\n", 1)
    assert first.startswith(b"[gpulab] log over 1 MiB: older lines dropped (")
    lines = rest.decode().splitlines()
    assert lines[-1] == "line 0299999"
    # What is kept is whole lines, in order, none missing.
    numbers = [int(line.split()[1]) for line in lines]
    assert numbers == list(range(numbers[0], 300_000))
    assert dropped_of(first + b"\n") > 0


def test_the_writer_outlasts_a_sigterm_to_its_process_group_and_logs_everything(tmp_path):
    # A cancel signals the node's process group: the agent stops, its writer does not
    # stop before the agent's last words are in the log.
    log, exit_file = tmp_path / "node0.log", tmp_path / "node0.exit"
    agent = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('stopping', flush=True); sys.exit(5)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(120)"
    )
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpulab.training.log_cap", "--max-bytes", str(MIB)),
            *("--exit-file", str(exit_file), str(log), "--", sys.executable, "-c", agent),
        ],
        start_new_session=True,
    )
    wait_until(lambda: log.exists() and b"ready" in log.read_bytes(), "the agent to start")
    os.killpg(proc.pid, 15)
    assert proc.wait(timeout=60) == 5
    assert log.read_text() == "ready\nstopping\n"
    assert exit_file.read_text() == "5\n"


def test_a_follower_reads_every_line_once_across_cuts(tmp_path):
    jd = JobDir(str(tmp_path), "job")
    os.makedirs(jd.p("logs"))
    writer = CappedLog(jd.p("logs", "node0.log"), MIB)
    follower = LogTail(jd)
    seen = []
    line = 0
    for _ in range(12):  # 12 x 200 KiB through a 1 MiB log: several cuts
        writer.write(b"".join(b"x %07d\n" % (line + i) for i in range(20_000)))
        line += 20_000
        seen += follower.read()
    got = [s for s in seen if not s.startswith("[node0] [gpulab] log over")]
    assert got == [f"[node0] x {i:07d}" for i in range(line)]
    assert os.path.getsize(jd.p("logs", "node0.log")) <= MIB
    # A new reader that asks for the tail starts from the end of the cut file.
    assert LogTail(jd).read(tail=2) == ["[node0] x 0239998", "[node0] x 0239999"]
