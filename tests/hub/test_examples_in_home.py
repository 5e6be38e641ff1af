"""A new user finds the example notebooks in their home: a copy of their own to edit
in ``~/examples``, the originals read-only in ``~/examples/originals``, given once
(against the shared real hub, its users with Unix accounts of their own)."""

import os

import pytest
import requests
from hubproc import fresh_user

pytestmark = pytest.mark.slow

USER = fresh_user("newcomer")
NOTEBOOKS = {"deploy.ipynb", "train_distributed.ipynb", "usage-report.ipynb"}


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def contents(hub, token, path, method="GET", **kw):
    return requests.request(
        method,
        f"{hub.url}/user/{USER}/api/contents/{path}",
        headers={"Authorization": f"token {token}"},
        timeout=60,
        **kw,
    )


def test_the_examples_are_in_a_new_users_home_once(hub):
    token = hub.create_user(USER)
    assert hub.spawn(USER, {"gpu_milli": 0}).status_code in (201, 202)
    hub.wait_server(USER)
    home = hub.home(USER)
    folder = home / "examples"
    assert {p.name for p in folder.iterdir()} >= NOTEBOOKS
    owner = home.stat().st_uid
    assert (folder / "deploy.ipynb").stat().st_uid == owner  # the copy is theirs
    originals = folder / "originals"
    assert originals.is_symlink() and (originals / "deploy.ipynb").stat().st_uid != owner

    # JupyterLab lists both; the copy saves, the original does not.
    listed = contents(hub, token, "examples").json()
    assert {"deploy.ipynb", "originals"} <= {c["name"] for c in listed["content"]}
    copy = contents(hub, token, "examples/deploy.ipynb").json()
    original = contents(hub, token, "examples/originals/deploy.ipynb")
    assert original.status_code == 200, original.text
    assert original.json()["writable"] is False and copy["writable"] is True
    body = {"type": "notebook", "format": "json", "content": copy["content"]}
    assert contents(hub, token, "examples/deploy.ipynb", "PUT", json=body).status_code == 200
    refused = contents(hub, token, "examples/originals/deploy.ipynb", "PUT", json=body)
    assert refused.status_code >= 400, refused.text

    # A user who deletes a copy keeps it deleted: the examples are given once.
    os.remove(folder / "deploy.ipynb")
    hub.hub_api("DELETE", f"/users/{USER}/server")
    hub.wait_server(USER, ready=False)
    assert hub.spawn(USER, {"gpu_milli": 0}).status_code in (201, 202)
    hub.wait_server(USER)
    assert not (folder / "deploy.ipynb").exists()
    assert (folder / "train_distributed.ipynb").exists()
    hub.hub_api("DELETE", f"/users/{USER}/server")
    hub.wait_server(USER, ready=False)
