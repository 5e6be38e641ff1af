"""The service reads and appends to files a job's ranks can write; the ranks
must not be able to turn that into reading or writing another file of the host.

Hand-over needs root (CI runs as root); the ranks' account here is ``nobody``.
"""

import json
import os
import pwd
import threading

import pytest
from hubproc import let_accounts_reach

from gpulab.backend.jobdir import JobDir, LogTail

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="handing a job over needs root")


@pytest.fixture
def job(tmp_path):
    nobody = pwd.getpwnam("nobody")
    let_accounts_reach(tmp_path)
    jd = JobDir(str(tmp_path), "j1")
    os.makedirs(jd.path)
    with open(jd.p("spec.json"), "w") as f:
        f.write("{}")
    jd.event("queued")
    jd.hand_over(nobody.pw_uid, nobody.pw_gid)
    secret = tmp_path / "secret"
    secret.write_text("root's secret")
    secret.chmod(0o600)
    return jd, nobody, secret


def as_user(uid, gid, action):
    """Run ``action`` in a child that is the ranks' account."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            action()
            os._exit(0)
        except BaseException:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0


def test_hand_over_gives_the_ranks_their_folders_and_nothing_else(job):
    jd, nobody, _ = job
    assert os.stat(jd.path).st_uid == 0 and os.stat(jd.path).st_mode & 0o777 == 0o750
    assert os.stat(jd.p("logs")).st_uid == nobody.pw_uid
    assert os.stat(jd.p("spec.json")).st_uid == 0
    assert os.stat(jd.p("events.log")).st_uid == nobody.pw_uid
    jd.event("started")  # the service still appends, to the ranks' file
    assert open(jd.p("events.log")).read() == "queued\nstarted\n"


def test_a_symlinked_log_is_not_followed(job):
    jd, nobody, secret = job
    as_user(
        nobody.pw_uid, nobody.pw_gid, lambda: os.symlink(str(secret), jd.p("logs", "rank0.log"))
    )
    assert LogTail(jd).read(final=True) == ["[gpulab] queued"]
    with pytest.raises(OSError):
        jd.read_user("logs/rank0.log")


def test_a_hard_link_to_roots_file_is_refused(job):
    jd, nobody, secret = job
    os.link(secret, jd.p("logs", "rank0.log"))  # as the attacker could (protected_hardlinks=0)
    with pytest.raises(PermissionError):
        jd.read_user("logs/rank0.log")


def test_a_fifo_does_not_hang_the_service(job):
    jd, nobody, _ = job
    as_user(nobody.pw_uid, nobody.pw_gid, lambda: os.mkfifo(jd.p("metrics", "rank0.jsonl")))
    done = []
    t = threading.Thread(target=lambda: done.append(jd.metrics(0)))
    t.start()
    t.join(10)
    assert done == [([], 0)]


def test_the_ranks_own_files_are_read(job):
    jd, nobody, _ = job

    def write():
        with open(jd.p("logs", "rank0.log"), "w") as f:
            f.write("hello\n")

    as_user(nobody.pw_uid, nobody.pw_gid, write)
    assert "[r0] hello" in LogTail(jd).read()


def test_a_huge_sparse_report_file_is_read_in_steps(job):
    """A rank makes its report file 64 GiB of nothing (it costs no disk): each look
    of the service reads a bounded step, and the records around it still count."""
    jd, nobody, _ = job

    def write():
        with open(jd.p("metrics", "rank0.jsonl"), "wb") as f:
            f.write(b'{"step": 0}\n')
            f.truncate(64 << 30)
            f.seek(0, os.SEEK_END)
            f.write(b'\n{"step": 7}\n')

    as_user(nobody.pw_uid, nobody.pw_gid, write)
    records, cursor = jd.metrics(0, 0, limit=1 << 20)
    assert (records, cursor) == ([{"step": 0}], 12)
    assert jd.metrics(0, cursor, limit=1 << 20) == ([], cursor + (1 << 20))  # no line in it
    assert jd.last_metric(0) == {"step": 7}


def test_thousands_of_logs_are_read_one_at_a_time_within_one_budget(job):
    """A rank hard-links one 8 MiB log of empty lines as rank0..rank1999.log (no disk):
    the service opened every file at once (out of descriptors) and read 8 MiB of each
    (millions of strings per file). Now one file is open at a time, and a read gives
    at most MAX_READ_LINES lines over all of them; the rest come at the next read."""
    from gpulab.backend.jobdir import MAX_READ_LINES

    jd, nobody, _ = job

    def write():
        with open(jd.p("logs", "rank0.log"), "wb") as f:
            f.write(b"\n" * (8 << 20))
        for r in range(1, 2000):
            os.link(jd.p("logs", "rank0.log"), jd.p("logs", f"rank{r}.log"))

    as_user(nobody.pw_uid, nobody.pw_gid, write)
    fds_before = len(os.listdir("/proc/self/fd"))
    tail = LogTail(jd)
    first = tail.read()
    assert len(first) <= MAX_READ_LINES and first[0] == "[gpulab] queued"
    assert len(os.listdir("/proc/self/fd")) <= fds_before  # none left open
    second = tail.read()  # goes on where the first stopped
    assert 0 < len(second) <= MAX_READ_LINES
    assert len(LogTail(jd).read(tail=50)) == 50


def test_restart_counts_and_records_of_any_shape_are_survived(job):
    """A rank's pid file is its owner's: a restart count of 10**12 was kept and made
    every view of the job loop over it; deep nesting raised RecursionError in every
    poll; errors of mixed time types failed the sort."""
    from gpulab.backend.jobdir import MAX_RESTARTS

    jd, nobody, _ = job

    def write():
        files = {
            "pids/rank0.json": '{"pid": 1, "restart": 1000000000000}',
            "pids/rank1.json": "[" * 5000 + "]" * 5000,
            "pids/rank2.json": '{"pid": 2, "restart": Infinity}',
            "errors/rank0.json": '{"rank": 0, "time": 5, "error": "a"}',
            "errors/rank1.json": '{"rank": 1, "time": "soon", "error": "b"}',
            "errors/rank2.json": "[" * 5000,
        }
        for name, text in files.items():
            with open(jd.p(name), "w") as f:
                f.write(text)
        with open(jd.p("metrics", "rank0.jsonl"), "w") as f:
            f.write("[" * 5000 + "]" * 5000 + "\n" + '{"step": 1}\n')

    as_user(nobody.pw_uid, nobody.pw_gid, write)
    assert jd.restarts() == MAX_RESTARTS
    assert [e["rank"] for e in jd.errors()] == [1, 0]  # a time that is no number: 0
    assert jd.metrics(0, 0)[0] == [{"step": 1}]


def test_hard_linked_pid_and_error_files_cost_a_bounded_read(job, monkeypatch):
    """A rank hard-links one 1 MiB file as 3000 pid files and 3000 error files (no
    disk): every pass of the job loop parsed 1 MiB of each (3 GB). The pid files are
    read 4 KiB each, at most MAX_PID_FILES of them; the error files 8 MiB in all."""
    from gpulab.backend.jobdir import ERRORS_READ_BYTES, MAX_PID_FILES, PID_FILE_BYTES

    jd, nobody, _ = job

    def write():
        with open(jd.p("errors", "rank0.json"), "w") as f:
            f.write('{"rank": 0, "restart": 3, "error": "' + "x" * (1 << 20) + '"}')
        for r in range(3000):
            os.link(jd.p("errors", "rank0.json"), jd.p("pids", f"rank{r}.json"))
            if r:
                os.link(jd.p("errors", "rank0.json"), jd.p("errors", f"rank{r}.json"))

    as_user(nobody.pw_uid, nobody.pw_gid, write)
    read = []
    real = JobDir.read_user

    def counted(self, name, offset=0, limit=None):
        data = real(self, name, offset, limit)
        read.append(len(data))
        return data

    monkeypatch.setattr(JobDir, "read_user", counted)
    assert jd.restarts() == 0  # past 4 KiB a pid file is no pid file
    assert len(read) <= MAX_PID_FILES and sum(read) <= MAX_PID_FILES * PID_FILE_BYTES
    read.clear()
    assert len(jd.errors()) <= ERRORS_READ_BYTES // (1 << 20)
    assert sum(read) <= ERRORS_READ_BYTES


def test_links_in_the_folder_are_neither_written_through_nor_read(job, tmp_path):
    """On Kubernetes a job's pods may write its folder as the service's own account: a
    link at a temporary name truncated the file it named, a link as cell.py sent the
    service's secrets to the user's MLflow run, a link as pids/ let a restart delete
    the files it named."""
    jd, _, secret = job
    os.symlink(str(secret), jd.p(".launch.json.tmp"))
    jd.write_json("launch.json", {"nodes": 1})
    assert secret.read_text() == "root's secret"
    assert json.loads(open(jd.p("launch.json")).read()) == {"nodes": 1}

    os.unlink(jd.p("cell.py")) if os.path.lexists(jd.p("cell.py")) else None
    os.symlink(str(secret), jd.p("cell.py"))
    with pytest.raises(OSError):
        jd.read_own("cell.py", 1 << 20)

    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "keep.db").write_text("data")
    import shutil

    shutil.rmtree(jd.p("pids"))
    os.symlink(str(victims), jd.p("pids"))
    jd.reset_run()
    assert (victims / "keep.db").read_text() == "data"
    assert os.path.isdir(jd.p("pids")) and not os.path.islink(jd.p("pids"))


def test_a_second_hand_over_follows_no_link_in_the_folder(job, tmp_path):
    """On Kubernetes the folder is handed over again at each launch, after the pods
    wrote in it (on a claim whose fsGroup lets them): links there must not make root
    chown or chmod their targets."""
    jd, nobody, secret = job
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.chmod(jd.path, 0o777)  # as if the pods could write the folder itself
    os.symlink(str(secret), jd.p("x"))
    os.link(str(secret), jd.p("y"))  # a hard link to root's file
    os.rename(jd.p("checkpoints"), jd.p("old"))
    os.symlink(str(elsewhere), jd.p("checkpoints"))
    jd.hand_over(nobody.pw_uid, nobody.pw_gid)
    for target, mode in ((secret, 0o600), (elsewhere, 0o700)):
        st = os.stat(target)
        assert (st.st_uid, st.st_mode & 0o777) == (0, mode), target
    assert not os.path.islink(jd.p("checkpoints"))
    assert os.stat(jd.p("checkpoints")).st_uid == nobody.pw_uid
