"""Unix accounts per hub user: names, creation, and a process started as one.

The creation tests make real accounts with ``useradd`` (CI runs as root) and
remove them afterwards.
"""

import os
import pwd
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hubproc import let_accounts_reach
from support.wait import wait_until

from gpulab.enforcement.accounts import (
    MAX_NAME,
    AccountError,
    UserAccounts,
    unix_name,
    unreachable,
)
from gpulab.enforcement.retired_accounts import end_processes_of, retire_account

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating accounts needs root")


@pytest.mark.parametrize(
    "hub_name, expected",
    [
        ("alice", "gpulab-alice"),
        ("bob-2", "gpulab-bob-2"),
    ],
)
def test_plain_names_are_kept(hub_name, expected):
    assert unix_name(hub_name) == expected


@pytest.mark.parametrize("hub_name", ["Alice", "élodie", "bob_smith", "x.y", "a" * 40, "名前"])
def test_other_names_are_cut_and_hashed_and_fit(hub_name):
    name = unix_name(hub_name)
    assert name.startswith("gpulab-") and len(name) <= MAX_NAME
    assert name.count("_") == 1 and all(c.isascii() for c in name)
    assert unix_name(hub_name) == name  # stable


def test_a_typed_name_cannot_claim_a_hashed_one():
    hashed = unix_name("élice")  # gpulab-lice_<hash>
    typed = hashed.removeprefix("gpulab-")
    assert unix_name(typed) != hashed
    assert unix_name("Alice") != unix_name("alice")


def test_prefix_must_be_a_safe_name():
    with pytest.raises(Exception, match="prefix"):
        UserAccounts(prefix="../x")


def test_unreachable_names_the_folder_that_blocks(tmp_path):
    let_accounts_reach(tmp_path)
    inner = tmp_path / "private" / "bin"
    inner.mkdir(parents=True)
    exe = inner / "python"
    exe.write_text("")
    exe.chmod(0o755)
    (tmp_path / "private").chmod(0o700)
    try:
        problem = unreachable(str(exe), execute=True)
        assert problem and f"{tmp_path / 'private'} is mode 0700" in problem
        (tmp_path / "private").chmod(0o711)
        assert unreachable(str(exe), execute=True) is None
    finally:
        (tmp_path / "private").chmod(0o755)


@pytest.fixture
def accounts(tmp_path):
    made = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    names = []
    yield made, names
    for n in names:
        subprocess.run(["userdel", made.name_for(n)], capture_output=True)


@needs_root
def test_ensure_makes_an_account_with_a_private_home_once(accounts):
    made, names = accounts
    hub_name = f"t{uuid.uuid4().hex[:8]}"
    names.append(hub_name)
    account = made.ensure(hub_name)
    again = made.ensure(hub_name)
    assert account == again and account.uid != 0
    assert pwd.getpwnam(account.name).pw_uid == account.uid
    st = os.stat(account.home)
    assert (st.st_uid, st.st_mode & 0o777) == (account.uid, 0o700)
    import grp

    assert account.name in grp.getgrnam("gpulab-users").gr_mem


@needs_root
def test_an_account_may_not_use_cron_or_at(accounts, tmp_path, monkeypatch):
    """A crontab of the account would run its processes outside gpulab's groups (no
    slice, no memory cap, every GPU) and after its work has stopped."""
    from gpulab.enforcement import accounts as accounts_mod

    cron, at = tmp_path / "cron.deny", tmp_path / "at.deny"
    cron.write_text("daemon")  # the site's own line, without its newline
    monkeypatch.setattr(accounts_mod, "SCHEDULER_DENY_FILES", (str(cron), str(at)))
    made, names = accounts
    hub_name = f"t{uuid.uuid4().hex[:8]}"
    names.append(hub_name)
    account = made.ensure(hub_name)
    made.ensure(hub_name)
    assert cron.read_text() == f"daemon\n{account.name}\n"
    assert at.read_text() == f"{account.name}\n"


@needs_root
def test_a_process_started_as_the_account_is_that_account(accounts, tmp_path):
    made, names = accounts
    hub_name = f"t{uuid.uuid4().hex[:8]}"
    names.append(hub_name)
    account = made.ensure(hub_name)
    secret = tmp_path / "root-only"
    secret.write_text("x")
    secret.chmod(0o600)
    out = subprocess.run(
        ["sh", "-c", f"id -un; cat {secret} 2>&1 || true"],
        capture_output=True,
        text=True,
        env=account.env(),
        **account.popen_kwargs(),
    )
    lines = out.stdout.splitlines()
    assert lines[0] == account.name
    assert "Permission denied" in lines[1]


@needs_root
def test_a_foreign_folder_in_place_of_a_home_is_refused(accounts):
    made, names = accounts
    hub_name = f"t{uuid.uuid4().hex[:8]}"
    names.append(hub_name)
    os.makedirs(made.home_for(hub_name))  # root's, not the account's
    with pytest.raises(Exception, match="not .*own directory"):
        made.ensure(hub_name)


#: A process that names itself in bytes no UTF-8 reader takes, then sleeps.
RENAMED_SLEEPER = (
    "import ctypes, time; ctypes.CDLL(None).prctl(15, bytes([255, 254]), 0, 0, 0); time.sleep(600)"
)


def _names_of(uid: int) -> bytes:
    """The names of the processes of ``uid``, as the kernel keeps them."""
    names = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                names.append(Path(f"/proc/{pid}/comm").read_bytes())
        except OSError:
            pass
    return b"".join(names)


@needs_root
def test_a_deleted_users_account_goes_to_no_new_user_of_the_name(accounts):
    """A hub user deleted and a new one approved under the same name: the new one
    must not get the old one's home, files and processes."""
    made, names = accounts
    hub_name = f"t{uuid.uuid4().hex[:8]}"
    names.append(hub_name)
    account = made.ensure(hub_name)
    (Path(account.home) / "notes.txt").write_text("the earlier user's")
    # A process they left running (a nohup'd loop from a terminal), in a session of
    # its own, one that forks, and one that names itself in bytes that are not UTF-8.
    left = subprocess.Popen(
        ["sh", "-c", f"sleep 600 & {sys.executable} -c '{RENAMED_SLEEPER}'"],
        start_new_session=True,
        env=account.env(),
        **account.popen_kwargs(),
    )
    wait_until(lambda: b"\xff\xfe" in _names_of(account.uid), "the renamed process")
    try:
        assert retire_account(made, hub_name, today="2026-12-07") == account.name
        assert left.wait(timeout=10) == -9
        assert end_processes_of(account.uid) == 0  # the forked child too
        status = subprocess.run(["passwd", "-S", account.name], capture_output=True, text=True)
        assert status.stdout.split()[1] == "L", status.stdout  # locked
        with pytest.raises(AccountError) as refused:
            made.ensure(hub_name)
        said = str(refused.value)
        assert "belonged to an earlier hub user" in said and "2026-12-07" in said
        assert f"userdel -r {account.name}" in said
        assert (Path(account.home) / "notes.txt").read_text() == "the earlier user's"
        # A deletion tried again (the first one's kill failed) ends what runs as it now.
        again = subprocess.Popen(["sleep", "600"], env=account.env(), **account.popen_kwargs())
        assert retire_account(made, hub_name) == account.name
        assert again.wait(timeout=10) == -9

        # The admin's way back, for the same person, as the refusal gives it.
        give_back = shlex.split(said.split("gives it back: ", 1)[1])
        subprocess.run(give_back, check=True, capture_output=True)
        assert made.ensure(hub_name) == account
    finally:
        if left.poll() is None:
            left.kill()


@needs_root
def test_an_account_the_site_made_itself_is_not_retired(accounts):
    made, names = accounts
    hub_name = f"t{uuid.uuid4().hex[:8]}"
    names.append(hub_name)
    subprocess.run(["useradd", "--no-create-home", made.name_for(hub_name)], check=True)
    assert made.lookup(hub_name) is not None  # a plain name: the site's account is used
    assert retire_account(made, hub_name) is None
    assert pwd.getpwnam(made.name_for(hub_name)).pw_gecos == ""
