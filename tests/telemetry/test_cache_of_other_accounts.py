"""The node's dataset-cache figures, summed over users' caches that root must not open.

Each user's cache index (``<cache_dir>/<account>/index.sqlite``) is the user's to write.
Root opening it would run what the user put there (a view over an endless query held
the sampler, and every figure of the node with it) and, opening its journal, give that
file to the index's owner (a hard link there to one of root's files became the user's).
Real accounts, so it needs root (CI runs as root).
"""

import os
import sqlite3
import subprocess
import time
import uuid

import pytest
from hubproc import let_accounts_reach

from gpulab.cache.index import CacheIndex
from gpulab.enforcement.accounts import UserAccounts
from gpulab.telemetry import cache_sampler
from gpulab.telemetry.cache_sampler import CacheSampler

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating accounts needs root")


@pytest.fixture
def caches(tmp_path):
    """A node's cache folder (root's, 0711) with two users' caches, made as they would
    be: a folder of the account's, 0700, the index written by the account."""
    let_accounts_reach(tmp_path)
    accounts = UserAccounts(home_root=str(tmp_path / "homes"), enabled=True)
    names = [f"c{uuid.uuid4().hex[:8]}" for _ in range(2)]
    made = [accounts.ensure(n) for n in names]
    root = tmp_path / "dataset-cache"
    root.mkdir(mode=0o711)
    folders = []
    for i, account in enumerate(made):
        folder = root / account.name
        folder.mkdir(mode=0o700)
        index = CacheIndex(str(folder))
        index.bump(hits=3 + i, misses=1)
        index.stats()
        for path in [folder, *folder.iterdir()]:
            os.chown(path, account.uid, account.gid)
        folders.append(folder)
    yield root, folders, made
    for n in names:
        subprocess.run(["userdel", accounts.name_for(n)], capture_output=True)


def test_users_caches_are_summed_each_read_as_its_owner(caches):
    root, _, _ = caches
    figures = CacheSampler(str(root)).sample()
    assert (figures["caches"], figures["hits"], figures["misses"]) == (2, 7, 2)


def test_an_endless_view_in_one_users_index_costs_only_that_users_figures(caches, monkeypatch):
    root, (mallory, bob), (mallory_account, _) = caches
    monkeypatch.setattr(cache_sampler, "OWNER_READ_TIMEOUT_S", 2.0)
    conn = sqlite3.connect(mallory / "index.sqlite")
    conn.executescript(
        "DROP TABLE counters; CREATE VIEW counters AS WITH RECURSIVE n(i) AS "
        "(SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT 'hits' AS name, i AS value FROM n;"
    )
    conn.close()
    sampler = CacheSampler(str(root))
    started = time.monotonic()
    figures = sampler.sample()
    assert time.monotonic() - started < 60  # it came back: the view ran as mallory, and was cut
    assert (figures["caches"], figures["hits"]) == (1, 4)  # bob's alone
    figures = sampler.sample()  # mallory's is not tried again at once
    assert figures["hits"] == 4


def test_a_hard_link_in_a_users_cache_never_hands_roots_file_over(caches):
    root, (alice, _), (alice_account, _) = caches
    secret = root.parent / "roots-secret"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    # What a user could plant where hard links to others' files are allowed
    # (fs.protected_hardlinks=0): root's file as the index's write-ahead log.
    os.unlink(alice / "index.sqlite-wal")
    os.link(secret, alice / "index.sqlite-wal")
    figures = CacheSampler(str(root)).sample()
    assert figures["caches"] == 1  # alice's could not be read by her: left out
    st = os.stat(secret)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert secret.read_text() == "root's\n"


def test_a_huge_counter_in_a_users_index_is_never_copied_to_the_sampler(caches):
    """The index is its user's to write: a counter of text (here 64 MiB) or of a
    name no counter has is left in the database, not printed to the sampler."""
    root, (mallory, bob), _ = caches
    conn = sqlite3.connect(mallory / "index.sqlite")
    big = "a" * (64 * 2**20)
    conn.execute("UPDATE counters SET value = ? WHERE name = 'hits'", (big,))
    conn.execute("INSERT INTO counters VALUES (?, 1)", (big,))
    conn.execute("UPDATE meta SET value = ? WHERE name = 'capacity'", (big,))
    conn.commit()
    conn.close()
    figures = cache_sampler.read_as_owner(str(mallory), os.stat(mallory))
    assert figures["hits"] == 0 and figures["misses"] == 1 and figures["capacity"] is None
    assert CacheSampler(str(root)).sample()["hits"] == 4  # bob's 4, mallory's text none
