"""The service reads and appends to files a job's ranks can write; the ranks
must not be able to turn that into reading or writing another file of the host.

Hand-over needs root (CI runs as root); the ranks' account here is ``nobody``.
"""

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
