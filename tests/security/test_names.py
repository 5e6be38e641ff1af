"""Two hub names never share a Unix account (issue 24, "two hub names, one Unix account").

The earlier rule kept 8 hex digits of SHA-256 in a hashed name: the issue found
``m.a__._ll.e.._.t.__`` and ``m__a___.l_._le.t.____`` both at
``gpulab-mallet_07ecd2d2`` in about 100,000 tries, and one read the other's
files. These tests make real accounts with ``useradd`` (CI runs as root) and
remove them afterwards.
"""

import os
import pwd
import subprocess

import pytest

from gpulab.enforcement.account_names import account_record, legacy_unix_name
from gpulab.enforcement.accounts import MAX_NAME, AccountError, UserAccounts, unix_name

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating accounts needs root")

#: The issue's pair: the same account under the earlier rule.
MALLET_1 = "m.a__._ll.e.._.t.__"
MALLET_2 = "m__a___.l_._le.t.____"
#: Plain names of this worker's own, apart from other test runs' accounts.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")


def test_the_issues_pair_collided_under_the_earlier_rule_and_no_longer_does():
    assert legacy_unix_name(MALLET_1) == legacy_unix_name(MALLET_2) == "gpulab-mallet_07ecd2d2"
    assert unix_name(MALLET_1) != unix_name(MALLET_2)
    for name in (MALLET_1, MALLET_2):
        assert len(unix_name(name)) <= MAX_NAME
        # 24 base32 characters of hash at least: 120 bits, not 32.
        assert len(unix_name(name).rsplit("_", 1)[1]) >= 24


@pytest.mark.parametrize("prefix", ["gpulab-", "u-", "a-long-prefix-16"])
def test_hashed_names_fit_and_stay_apart_under_any_prefix(prefix):
    names = {unix_name(f"user.{i}", prefix) for i in range(2000)}
    assert len(names) == 2000
    assert all(len(n) <= MAX_NAME and n.count("_") == 1 for n in names)


@pytest.fixture
def accounts(tmp_path):
    """UserAccounts with homes under tmp_path; every account a test names in
    ``made`` (Unix names) is removed afterwards."""
    tmp_path.chmod(0o711)
    acc = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    made: list[str] = []
    yield acc, made
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)


def useradd(name: str, comment: str, home: str) -> None:
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--home-dir", home, "-c", comment, name],
        check=True,
        capture_output=True,
    )


def run_as(account, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv), capture_output=True, text=True, env=account.env(), **account.popen_kwargs()
    )


@needs_root
def test_the_issues_two_names_get_two_accounts_and_cannot_read_each_other(accounts):
    acc, made = accounts
    made += [unix_name(MALLET_1), unix_name(MALLET_2)]
    first, second = acc.ensure(MALLET_1), acc.ensure(MALLET_2)
    assert first.name != second.name and first.uid != second.uid
    assert first.home != second.home
    secret = os.path.join(first.home, "notes.txt")
    run_as(first, "sh", "-c", f"echo mine > {secret}")
    out = run_as(second, "cat", secret)
    assert out.returncode != 0 and "Permission denied" in out.stderr
    # Each account says whose it is, by the full hash of the hub name.
    assert pwd.getpwnam(first.name).pw_gecos == account_record(MALLET_1)
    assert acc.ensure(MALLET_1) == first  # found again, not refused


@needs_root
def test_an_account_recorded_for_another_hub_name_is_refused(accounts):
    acc, made = accounts
    # A collision made by hand: MALLET_2's account name, recorded for MALLET_1.
    name = unix_name(MALLET_2)
    made.append(name)
    useradd(name, account_record(MALLET_1), acc.home_for(MALLET_2))
    for look in (acc.lookup, acc.ensure):
        with pytest.raises(AccountError, match=f"{name} for .* exists but is another hub user's"):
            look(MALLET_2)
    assert not os.path.exists(acc.home_for(MALLET_2))  # no home made for the wrong user


@needs_root
def test_a_hashed_name_gpulab_did_not_make_is_refused(accounts):
    acc, made = accounts
    name = unix_name(MALLET_1)
    made.append(name)
    useradd(name, "someone", acc.home_for(MALLET_1))
    with pytest.raises(AccountError, match="not made by gpulab"):
        acc.ensure(MALLET_1)


@needs_root
def test_an_earlier_rule_account_is_kept_for_its_own_user_only(accounts):
    """A site upgrading keeps its users' homes: the account the earlier rule made
    (``gpulab user <name>``) is still MALLET_1's. MALLET_2, who shared it before,
    now gets an account of their own instead."""
    acc, made = accounts
    old = legacy_unix_name(MALLET_1)
    made += [old, unix_name(MALLET_1), unix_name(MALLET_2)]
    home = os.path.join(acc.home_root, old)
    useradd(old, f"gpulab user {MALLET_1}", home)
    os.makedirs(home, mode=0o700)
    os.chown(home, pwd.getpwnam(old).pw_uid, pwd.getpwnam(old).pw_gid)

    mine = acc.ensure(MALLET_1)
    assert (mine.name, mine.home) == (old, home)
    with pytest.raises(KeyError):
        pwd.getpwnam(unix_name(MALLET_1))  # no second account for the same user

    theirs = acc.ensure(MALLET_2)
    assert theirs.name == unix_name(MALLET_2) != old
    assert theirs.uid != mine.uid


@needs_root
def test_a_plain_name_keeps_accounts_made_before_or_by_the_site(accounts):
    acc, made = accounts
    legacy, site_made = f"legacy-{WORKER}", f"site-{WORKER}"
    made += [unix_name(legacy), unix_name(site_made)]
    useradd(unix_name(legacy), f"gpulab user {legacy}", acc.home_for(legacy))
    useradd(unix_name(site_made), "Ada Lovelace", acc.home_for(site_made))
    assert acc.ensure(legacy).name == f"gpulab-legacy-{WORKER}"
    assert acc.ensure(site_made).name == f"gpulab-site-{WORKER}"
