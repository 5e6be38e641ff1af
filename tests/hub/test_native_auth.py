"""The default login as an attacker sees it: the authenticator on a real hub database.

(The pages and a real browser are in tests/browser/test_logins.py.)
"""

import asyncio

import pytest
from jupyterhub import orm
from nativeauthenticator.orm import UserInfo

from gpulab.hub_ext.native_auth import GpuLabNativeAuthenticator

GOOD = "correct horse battery"


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "admin-password"
    path.write_text("first-admin-password-0123456789abcdef\n")
    return path


@pytest.fixture
def db(tmp_path):
    return orm.new_session_factory(f"sqlite:///{tmp_path}/jupyterhub.sqlite")()


def start(db, password_file, **config):
    """What `gpulab up` does at hub start (auth_config.configure_auth)."""
    config = {"allow_all": True, "admin_users": {"admin"}, **config}
    return GpuLabNativeAuthenticator(
        _deprecated_db_session=db, admin_password_file=str(password_file), **config
    )


def login(auth, name, password):
    user = asyncio.run(auth.get_authenticated_user(None, {"username": name, "password": password}))
    return user and user["name"]


def test_admin_logs_in_with_the_password_file_on_first_start(db, password_file):
    auth = start(db, password_file)
    assert login(auth, "admin", password_file.read_text().strip()) == "admin"
    assert login(auth, "admin", "wrong") is None


def test_seeding_is_idempotent_and_follows_the_file(db, password_file):
    auth = start(db, password_file)
    first_hash = auth.get_user("admin").password
    start(db, password_file)
    assert [u.username for u in UserInfo.all_users(db)] == ["admin"]
    assert auth.get_user("admin").password == first_hash  # not rehashed for nothing

    # An admin who lost their approval, and a new password in the file: both fixed.
    UserInfo.change_authorization(db, "admin")
    password_file.write_text("second-admin-password-0123456789abcdef\n")
    auth = start(db, password_file)
    assert login(auth, "admin", "second-admin-password-0123456789abcdef") == "admin"
    assert login(auth, "admin", "first-admin-password-0123456789abcdef") is None


def test_sign_up_waits_for_approval(db, password_file):
    auth = start(db, password_file)
    assert auth.create_user("alice", GOOD) is not None
    assert login(auth, "alice", GOOD) is None
    UserInfo.change_authorization(db, "alice")
    assert login(auth, "alice", GOOD) == "alice"


def test_one_users_password_does_not_open_another_account(db, password_file):
    auth = start(db, password_file)
    auth.create_user("alice", GOOD)
    auth.create_user("bob", "bobs own long password")
    for name in ("alice", "bob"):
        UserInfo.change_authorization(db, name)
    assert login(auth, "bob", GOOD) is None
    assert login(auth, "admin", GOOD) is None
    assert login(auth, "bob", "bobs own long password") == "bob"


def test_case_and_unicode_forms_reach_only_the_same_account(db, password_file):
    auth = start(db, password_file)
    auth.create_user("alice", GOOD)
    UserInfo.change_authorization(db, "alice")
    # Case and Unicode compatibility forms (full-width letters) are alice herself,
    # and still need her password.
    assert login(auth, "ALICE", GOOD) == "alice"
    assert login(auth, "ａｌｉｃｅ", GOOD) == "alice"
    assert login(auth, "Alice", "wrong password") is None
    # Nobody can sign up under those forms, nor as the seeded admin.
    for name in ("Alice", "ａｌｉｃｅ", "ADMIN"):
        assert auth.user_exists(name)
        assert auth.create_user(name, "another long password") is None
    # A look-alike (Cyrillic а) would be a different account that reads the
    # same: refused, as is anything outside [a-z0-9._-].
    for name in ("\u0430lice", "al\u200bice", "x\tonmouseover=alert(1)", "a" * 33, "-x"):
        assert auth.create_user(name, GOOD) is None, name
    assert sorted(u.username for u in UserInfo.all_users(db)) == ["admin", "alice"]


def test_an_admin_name_without_a_record_is_not_approved_at_sign_up(db, password_file):
    auth = start(db, password_file, admin_users={"admin", "boss"})
    info = auth.create_user("boss", GOOD)
    assert info is not None and not info.is_authorized
    assert login(auth, "boss", GOOD) is None


def test_weak_and_unhashable_passwords(db, password_file):
    auth = start(db, password_file)
    assert auth.create_user("carol", "short") is None
    assert auth.create_user("carol", "password123") is None  # a common one
    # bcrypt takes at most 72 bytes (bcrypt 5 raises): refused, not a crash.
    assert auth.create_user("carol", "é" * 40) is None
    auth.create_user("dave", GOOD)
    UserInfo.change_authorization(db, "dave")
    assert login(auth, "dave", "x" * 100) is None


def test_an_empty_admin_password_file_stops_the_hub_with_a_reason(db, password_file):
    password_file.write_text("\n")
    with pytest.raises(ValueError, match="must hold the admin's password"):
        start(db, password_file)


def test_a_name_of_megabytes_is_refused_and_kept_short(db, password_file):
    """Each failed login keeps its name in a throttle key for a minute: names of 1 MB,
    100 at a time from one address, held 100 MB in the hub (10 MB names, 1 GB)."""
    auth = start(db, password_file)
    for i in range(20):
        assert login(auth, f"{i}" + "a" * (1 << 20), GOOD) is None
    assert max(len(key) for key in auth.lockout._failures) < 300  # noqa: SLF001
    auth.create_user("alice", GOOD)
    UserInfo.change_authorization(db, "alice")
    assert login(auth, "alice", GOOD) == "alice"  # another name from that address


def test_a_sign_ups_password_hashed_in_a_thread_is_the_one_kept(db, password_file):
    """The sign-up page hashes the password in a thread (bcrypt takes a quarter second)
    and NativeAuthenticator keeps that hash instead of hashing on the hub's loop."""
    import bcrypt
    from nativeauthenticator import nativeauthenticator as upstream

    from gpulab.hub_ext.native_pages import PREHASHED

    auth = start(db, password_file)
    made = bcrypt.hashpw(GOOD.encode(), bcrypt.gensalt(4))
    token = PREHASHED.set((GOOD, made))
    try:
        assert auth.create_user("carol", GOOD) is not None
        # Another password than the page hashed: hashed here, as before.
        assert auth.create_user("dave", "dave's other long password") is not None
    finally:
        PREHASHED.reset(token)
    assert upstream.bcrypt is bcrypt  # put back
    assert auth.get_user("carol").password == made
    assert bcrypt.checkpw(b"dave's other long password", auth.get_user("dave").password)
    UserInfo.change_authorization(db, "carol")
    assert login(auth, "carol", GOOD) == "carol"
