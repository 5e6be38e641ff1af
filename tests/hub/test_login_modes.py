"""Default login vs `gpulab up --demo`: hub configuration, banner, spawn form, %gpulab."""

import re
import subprocess
import sys
from pathlib import Path

from traitlets.config import Config
from up_config import up_config

from gpulab.hub_ext.auth_config import NATIVE, login_banner
from gpulab.hub_ext.hub_config import Settings
from gpulab.magics.status import slice_status
from gpulab.spawner.form import DEMO_LOGIN_WARNING, render_form

GPULAB = str(Path(sys.executable).with_name("gpulab"))
AVAILABILITY = {
    "sizes": [{"milli": 0, "label": "No GPU", "available": True, "count": 0, "reason": ""}],
    "held_milli": 0,
}


def hub_config(tmp_path, monkeypatch, demo: bool) -> Config:
    monkeypatch.setenv("GPULAB_DEMO_LOGIN", "1" if demo else "0")
    return up_config(tmp_path)


def gpulab_service(c):
    return next(s for s in c.JupyterHub.services if s["name"] == "gpulab")


def test_default_login_is_per_user_passwords(tmp_path, monkeypatch):
    c = hub_config(tmp_path, monkeypatch, demo=False)
    assert c.JupyterHub.authenticator_class == NATIVE
    assert c.GpuLabNativeAuthenticator.admin_password_file == str(
        tmp_path / "data" / "admin-password"
    )
    assert (tmp_path / "data" / "admin-password").stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "data" / "user-password").exists()
    assert "user_password" not in c.SharedPasswordAuthenticator
    assert "GPULAB_DEMO_LOGIN" not in gpulab_service(c)["environment"]


def test_demo_login_is_one_shared_password_and_says_so_everywhere(tmp_path, monkeypatch):
    c = hub_config(tmp_path, monkeypatch, demo=True)
    assert c.JupyterHub.authenticator_class == "shared-password"
    data = tmp_path / "data"
    assert c.SharedPasswordAuthenticator.user_password == (data / "user-password").read_text()
    assert c.SharedPasswordAuthenticator.admin_password == (data / "admin-password").read_text()
    assert c.Spawner.environment["GPULAB_DEMO_LOGIN"] == "1"
    assert gpulab_service(c)["environment"]["GPULAB_DEMO_LOGIN"] == "1"


def test_banners(tmp_path):
    s = Settings(data_dir=tmp_path, port=8123)
    default = login_banner(s, demo=False)
    assert "http://127.0.0.1:8123/hub/signup" in default
    assert "http://127.0.0.1:8123/hub/authorize" in default
    assert str(tmp_path / "admin-password") in default
    assert "user-password" not in default and "shared" not in default
    demo = login_banner(s, demo=True)
    assert DEMO_LOGIN_WARNING in demo and str(tmp_path / "user-password") in demo


def test_form_and_magic_warn_only_in_demo_mode():
    form = render_form(AVAILABILITY, demo=True)
    assert 'class="alert alert-warning gpulab-demo-login"' in form
    assert DEMO_LOGIN_WARNING in re.sub(r"<[^>]+>", "", form)  # the browser test sees it
    assert "Demo login" not in render_form(AVAILABILITY, demo=False)
    env = {"GPULAB_GPU_MILLI": "250", "GPULAB_GPU_UUID": "GPU-1", "GPULAB_API_URL": "x"}
    assert DEMO_LOGIN_WARNING in slice_status({**env, "GPULAB_DEMO_LOGIN": "1"})
    assert "Demo login" not in slice_status(env)


def run_banner(tmp_path, *flags) -> str:
    # `-- --help` makes jupyterhub print its help and exit after the banner.
    r = subprocess.run(
        [GPULAB, "up", "--data-dir", str(tmp_path), *flags, "--", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    banner = r.stdout.split("  Overrides:", 1)[0]
    assert "gpulab is starting" in banner
    return banner


def test_cli_banner_default_mentions_no_shared_password(tmp_path):
    out = run_banner(tmp_path)
    assert "/hub/signup" in out and "/hub/authorize" in out
    assert str(tmp_path / "admin-password") in out
    assert "user-password" not in out and "Demo login" not in out


def test_cli_banner_demo_warns(tmp_path):
    out = run_banner(tmp_path, "--demo")
    assert DEMO_LOGIN_WARNING in out
    assert str(tmp_path / "user-password") in out


def test_another_authenticator_is_not_opened_to_everyone(tmp_path, monkeypatch):
    # allow_all is set on gpulab's own authenticators only: switching to GitHub
    # or PAM in gpulab_config.py must not let every account in.
    c = hub_config(tmp_path, monkeypatch, demo=False)
    assert "allow_all" not in c.Authenticator
    assert c.GpuLabNativeAuthenticator.allow_all and c.SharedPasswordAuthenticator.allow_all
