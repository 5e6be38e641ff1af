"""`gpulab up` without root: every user's code would run as the hub's own account, so a
multi-user start is refused unless ``--single-account`` says that is meant; then the
banner, the spawn form and ``%gpulab`` say so, as they do where accounts are turned
off as root (``c.UserAccounts.enabled = False``).

The non-root hub is a real `gpulab up` run as the ``nobody`` account (``runuser``),
its servers real JupyterLab processes; only the GPUs are declared.
"""

from __future__ import annotations

import html
import io
import os
import pwd
import re
import subprocess
from types import SimpleNamespace

import psutil
import pytest
from hubproc import GPULAB, RunningHub, let_accounts_reach
from logins import admin_password, log_in
from tornado import web
from traitlets.config import Config

from gpulab.hub_ext.single_account import OWNER_FILE, one_person_only, say_single_account
from gpulab.magics.status import SINGLE_ACCOUNT_WARNING as STATUS_WARNING
from gpulab.magics.status import slice_status
from gpulab.spawner.form import SINGLE_ACCOUNT_ENV, SINGLE_ACCOUNT_WARNING, render_form

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs gpulab up as another account")

ACCOUNT = "nobody"
FIX = "run as root so each user gets a Unix account, or pass --single-account for a one-person hub"
AVAILABILITY = {"sizes": [{"milli": 0, "available": True, "count": None, "reason": None}]}


def said(account: str) -> str:
    return SINGLE_ACCOUNT_WARNING.format(account=account)


def text_of(page: str) -> str:
    """What a person reads on the page (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_without_root_a_multi_user_start_is_refused_with_the_fix(tmp_path):
    let_accounts_reach(tmp_path)
    os.chown(tmp_path, pwd.getpwnam(ACCOUNT).pw_uid, -1)
    data_dir = tmp_path / "hub"
    r = subprocess.run(
        ["runuser", "-u", ACCOUNT, "--", GPULAB, "up", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("gpulab up: not root, so every user's code would run as nobody")
    assert line.endswith(FIX)
    assert r.stdout == "" and not data_dir.exists()  # nothing started, nothing written


def test_single_account_as_root_is_refused():
    """As root every user gets an account; --single-account would run them all as root."""
    r = subprocess.run(
        [GPULAB, "up", "--single-account", "--data-dir", "/nonexistent/never-made"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "gpulab up: --single-account as root would run every user's code as root: drop it "
        "(as root each user gets a Unix account of their own)"
    )


def test_single_account_says_so_on_the_banner_the_form_and_in_gpulab(tmp_path):
    hub = RunningHub(tmp_path / "hub", simulate="1xA100-80GB", run_as=ACCOUNT)
    try:
        assert f"\n  {said(ACCOUNT)}\n" in hub.log_path.read_text()
        # The spawn form, as a person logged in sees it.
        admin = log_in(hub, "admin", admin_password(hub))
        page = admin.get(f"{hub.url}/hub/spawn", timeout=60)
        assert page.status_code == 200, page.text[-500:]
        assert said(ACCOUNT) in text_of(page.text)
        # A server: it runs as the hub's account, and its %gpulab says so.
        r = hub.spawn("admin", {"gpu_milli": 0})
        assert r.status_code in (201, 202), r.text
        hub.wait_server("admin")
        env = hub.server_env("admin")
        assert env[SINGLE_ACCOUNT_ENV] == ACCOUNT
        assert said(ACCOUNT) in slice_status(env)
        servers = [
            p
            for p in psutil.process_iter(["cmdline", "environ", "username"])
            if (p.info["environ"] or {}).get("HOME") == env["HOME"]
            and "jupyterhub-singleuser" in " ".join(p.info["cmdline"] or [])
        ]
        assert servers and {p.info["username"] for p in servers} == {ACCOUNT}
        # The hub is now admin's alone: a second person's start is refused, with the fix.
        hub.create_user("bob")
        r = hub.spawn("bob", {"gpu_milli": 0})
        assert r.status_code == 403, r.text
        assert r.json()["message"] == (
            f"This hub runs everyone's code as one account ({ACCOUNT}), so it is admin's "
            f"alone. Ask its admin to run gpulab as root (each user then gets an account "
            f"of their own)."
        )
    finally:
        hub.stop()


def test_accounts_off_as_root_say_the_same():
    """c.UserAccounts.enabled = False as root: everyone runs as root, and it is said."""
    c = Config()
    c.UserAccounts.enabled = False
    c.Spawner.environment = {"SITE": "1"}
    env, out = {}, io.StringIO()
    assert say_single_account(c, env, out) == "root"
    assert out.getvalue() == f"  {said('root')}\n"
    assert env == {SINGLE_ACCOUNT_ENV: "root"}
    assert c.Spawner.environment == {"SITE": "1", SINGLE_ACCOUNT_ENV: "root"}
    form = render_form(AVAILABILITY, demo=False, shared_account=env[SINGLE_ACCOUNT_ENV])
    assert said("root") in text_of(form)
    # Accounts on (root's default): nothing set, nothing said.
    c, env, out = Config(), {}, io.StringIO()
    assert say_single_account(c, env, out) == ""
    assert (env, out.getvalue(), "environment" in c.Spawner) == ({}, "", False)
    assert "gpulab-single-account" not in render_form(AVAILABILITY, demo=False, shared_account="")


def test_a_single_account_hub_is_its_first_users_unless_shared(tmp_path):
    """The pre-spawn hook alone (the hub's refusal is checked above): the first start
    claims the hub, others are refused unless c.SingleAccount.shared_by names them, and
    the hub's own hook still runs."""

    def spawner(name):
        return SimpleNamespace(user=SimpleNamespace(name=name))

    ran = []
    c = Config()
    c.UserAccounts.enabled = False
    c.SingleAccount.shared_by = ["carol"]
    c.Spawner.pre_spawn_hook = lambda s: ran.append(s.user.name)
    one_person_only(c, tmp_path)
    hook = c.Spawner.pre_spawn_hook
    hook(spawner("alice"))
    assert (tmp_path / OWNER_FILE).read_text() == "alice\n"
    with pytest.raises(web.HTTPError) as refused:
        hook(spawner("bob"))
    assert refused.value.status_code == 403 and "it is alice's alone" in refused.value.log_message
    hook(spawner("carol"))
    hook(spawner("alice"))
    assert ran == ["alice", "carol", "alice"]
    # Anyone ("*"), or accounts of their own: no hook at all.
    for shared, enabled in ((["*"], False), ([], True)):
        c = Config()
        c.UserAccounts.enabled = enabled
        c.SingleAccount.shared_by = shared
        one_person_only(c, tmp_path)
        assert "pre_spawn_hook" not in c.Spawner


def test_the_form_and_gpulab_use_the_same_words():
    # magics reach the platform only over HTTP, so they keep their own copy.
    assert STATUS_WARNING == SINGLE_ACCOUNT_WARNING
    form = render_form(AVAILABILITY, demo=False, shared_account="<b>x</b>")
    assert "<b>x</b>" not in form and "&lt;b&gt;x&lt;/b&gt;" in form  # a name is escaped
