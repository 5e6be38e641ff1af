"""Nobody signs up under a name a hub user already has (issue 24: "sign-up under an
existing hub name is accepted and looks ordinary on /hub/authorize").

A hub user can exist without a sign-up record: made on the admin page or through
``POST /hub/api/users/<name>``, or listed in ``admin_users``. Approving a sign-up
under that name would hand whoever signed up that user's account, server and files.
The authenticator here is the one `gpulab up` runs, on a real hub database; the
pages are tried on a real hub in tests/hub/test_signup_and_removal.py.
"""

import pytest
from jupyterhub import orm
from nativeauthenticator.orm import UserInfo

from gpulab.hub_ext.native_auth import GpuLabNativeAuthenticator

GOOD = "correct horse battery"


@pytest.fixture
def db(tmp_path):
    return orm.new_session_factory(f"sqlite:///{tmp_path}/jupyterhub.sqlite")()


@pytest.fixture
def auth(db, tmp_path):
    password_file = tmp_path / "admin-password"
    password_file.write_text("first-admin-password-0123456789abcdef\n")
    return GpuLabNativeAuthenticator(
        _deprecated_db_session=db,
        admin_password_file=str(password_file),
        allow_all=True,
        admin_users={"admin"},
    )


def hub_user(db, name: str) -> None:
    """A hub user as the admin page or the REST API makes one (no sign-up record)."""
    db.add(orm.User(name=name))
    db.commit()


def test_a_sign_up_under_an_existing_hub_users_name_is_refused(auth, db):
    hub_user(db, "bob")
    for name in ("bob", "BOB", "ｂｏｂ"):  # the forms the hub normalises to bob
        assert auth.name_taken(name)
        assert auth.create_user(name, GOOD) is None, name
    assert UserInfo.find(db, "bob") is None


def test_a_hub_name_kept_as_typed_is_matched_in_its_normal_form(auth, db):
    # POST /hub/api/users/Carol keeps "Carol"; a sign-up of carol would log in as a
    # different hub user that reads the same.
    hub_user(db, "Carol")
    assert auth.create_user("carol", GOOD) is None


def test_pending_and_approved_sign_ups_keep_their_names(auth):
    assert auth.create_user("dave", GOOD) is not None
    assert auth.create_user("Dave", "another long password") is None
    assert auth.name_taken("admin")  # the seeded admin


def test_a_new_name_still_signs_up(auth, db):
    hub_user(db, "bob")
    assert not auth.name_taken("bobby")
    assert auth.create_user("bobby", GOOD) is not None
