"""The Slurm server's job folder in the user's home, as the user would attack it.

The hub runs as root; the folder ``~/.gpulab/slurm/<server>`` is in a home the user
controls. A link the user plants there must not make root empty, chown or write a
folder elsewhere, and what root reads back (the port, Slurm's log) must be the user's
own plain file: not a FIFO that would stall the hub, not a link to ``/etc/shadow``.
Real accounts, so it needs root (CI runs as root).
"""

import os
import stat
import subprocess
import threading
import uuid

import pytest
from hubproc import let_accounts_reach

from gpulab.enforcement.accounts import UserAccounts
from gpulab.spawner import slurm_job_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating accounts needs root")
FILES = {"env.sh": ("JUPYTERHUB_API_TOKEN=secret\n", 0o600), "job.sh": ("#!/bin/sh\n", 0o700)}


@pytest.fixture
def account(tmp_path):
    let_accounts_reach(tmp_path)
    accounts = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    name = f"t{uuid.uuid4().hex[:8]}"
    yield accounts.ensure(name)
    subprocess.run(["userdel", accounts.name_for(name)], capture_output=True)


def as_user(account, *argv):
    subprocess.run(argv, check=True, **account.popen_kwargs())


def test_the_folder_and_its_files_are_the_users_and_an_earlier_one_is_emptied(account):
    path = slurm_job_dir.make_as(account, "default", FILES)
    open(os.path.join(path, "slurm-1.out"), "w").close()  # an earlier start's
    assert slurm_job_dir.make_as(account, "default", FILES) == path
    assert sorted(os.listdir(path)) == ["env.sh", "job.sh"]
    st = os.stat(path)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.uid, 0o700)
    for name, (text, mode) in FILES.items():
        st = os.stat(os.path.join(path, name))
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.uid, mode)
        assert open(os.path.join(path, name)).read() == text


def test_a_link_the_user_planted_leads_root_nowhere(account, tmp_path):
    # Root's folder the link points at: what ~/.gpulab/slurm/default would become.
    target = tmp_path / "etc"
    (target / "slurm" / "default").mkdir(parents=True)
    (target / "slurm" / "default" / "passwd").write_text("root's\n")
    as_user(account, "ln", "-s", str(target), os.path.join(account.home, ".gpulab"))
    with pytest.raises(RuntimeError, match="could not write its server's Slurm job folder"):
        slurm_job_dir.make_as(account, "default", FILES)
    assert (target / "slurm" / "default" / "passwd").read_text() == "root's\n"
    for folder in (target, target / "slurm", target / "slurm" / "default"):
        assert os.stat(folder).st_uid == 0
    assert not (target / "slurm" / "default" / "env.sh").exists()


def test_root_reads_back_only_the_users_plain_files(account, tmp_path):
    path = slurm_job_dir.make_as(account, "default", FILES)
    read = slurm_job_dir.read_users_file
    as_user(account, "sh", "-c", f"echo 8888 > {path}/port")
    assert read(os.path.join(path, "port"), account.uid, 32) == b"8888\n"
    as_user(account, "sh", "-c", f"seq 1000 > {path}/slurm-7.out")
    assert read(os.path.join(path, "slurm-7.out"), account.uid, 9, tail=True) == b"999\n1000\n"
    # A link to root's secret, a FIFO nobody writes, root's own file: none is read,
    # and the FIFO does not stall the caller.
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash\n")
    as_user(account, "ln", "-s", str(secret), f"{path}/linked")
    as_user(account, "mkfifo", f"{path}/fifo")
    got = {}
    reader = threading.Thread(
        target=lambda: got.update(
            {n: read(os.path.join(path, n), account.uid, 1500) for n in ("linked", "fifo")}
        ),
        daemon=True,
    )
    reader.start()
    reader.join(10)
    assert got == {"linked": None, "fifo": None}
    assert read(str(secret), account.uid, 1500) is None  # root's file, not the user's
    assert read(os.path.join(path, "none"), account.uid, 32) is None
