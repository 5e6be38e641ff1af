"""A real gpulab hub for tests: `gpulab up` as a process on free ports.

Everything is real: JupyterHub, configurable-http-proxy, the gpulab service it
manages, and the single-user JupyterLab servers it spawns. Only the GPUs are
declared (``--simulate-gpus``), as this machine has none. Run as root (as CI
does), every hub user gets a real Unix account (``gpulab-<name>``), homes under
``<data-dir>/home``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests
from support.wait import wait_until

from gpulab.client.states import JOB_TERMINAL
from gpulab.enforcement.accounts import UserAccounts, unix_name
from gpulab.hub_ext.ports import free_port
from gpulab.service.vectors import socket_dir

GPULAB = str(Path(sys.executable).with_name("gpulab"))


def replica_pids(hub, dep_id: str) -> list[int]:
    """The pids of a deployment's model-server processes on this machine."""
    marker = str(hub.data_dir / "deployments" / dep_id)
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.NoSuchProcess:
            continue
        if "gpulab.serving.server" in cmd and marker in cmd:
            pids.append(p.info["pid"])
    return sorted(pids)


def server_process(key: str, value: str) -> psutil.Process:
    """The running single-user server whose environment has ``key`` = ``value``
    (its ``.info`` holds ``environ`` and ``cmdline``)."""
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = p.info["environ"] or {}
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if env.get(key) == value and "jupyterhub-singleuser" in cmd:
            return p
    raise LookupError(f"no server process with {key}={value}")


# Under pytest-xdist each worker counts from its own thousand (gw1: alice-1001...): the
# workers' hubs are apart, but their users' Unix accounts would be the same.
_names = itertools.count(1 + 1000 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0))


def fresh_user(prefix: str = "user") -> str:
    """A user name no other test of this session uses (``alice-3``): tests that
    share a hub stay independent by never sharing a user."""
    return f"{prefix}-{next(_names)}"


def let_accounts_reach(path: Path) -> None:
    """pytest's temporary folders are 0700; users' accounts must pass through
    them (o+x, not list) to reach their homes, jobs and models, as on a real
    install where the data dir lives in /srv or /var/lib."""
    path = path.resolve()
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod((mode & 0o7777) | 0o001)


class RunningHub:
    def __init__(
        self,
        data_dir: Path,
        simulate: str = "2xA100-80GB",
        config: str = "",
        db_url: str = "",
        cull_idle_timeout: int = 3600,
        demo: bool = False,
        run_as: str = "",
        tls: bool = False,
        terminal: bool = False,
        mlflow_runs: bool = False,
    ):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # run_as: `gpulab up` as that (non-root) account, which then runs everyone's code.
        self.accounts = os.geteuid() == 0 and not run_as
        if os.geteuid() == 0:
            let_accounts_reach(self.data_dir)
        homes = f"c.UserAccounts.home_root = {str(self.data_dir / 'home')!r}\n"
        # Tests kill services seconds after they started: the hub restarts them within
        # a second rather than at JupyterHub's 30 s poll (a module's config may say more).
        quick = "c.GpuLabHub.quick_restart_after_seconds = 1\n"
        # mlflow_runs: ended jobs are written to MLflow as runs, which starts MLflow's
        # server (0.6 GB) in the hub; only the shared hub does (tests/experiments/).
        runs = "" if mlflow_runs else 'c.ExperimentSettings.mlflow_url = ""\n'
        (self.data_dir / "gpulab_config.py").write_text(homes + quick + runs + config)
        if run_as:
            for path in (self.data_dir, self.data_dir / "gpulab_config.py"):
                shutil.chown(path, run_as)
        self.port = free_port()
        # tls: `gpulab up --tls self-signed`; requests trust the data dir's CA.
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ca = self.data_dir / "tls" / "ca.pem" if tls else None
        self.verify = str(self.ca) if tls else True
        self.api = f"{self.url}/services/gpulab/api/v1"
        self.log_path = self.data_dir / "hub.log"
        as_account = ["runuser", "-u", run_as, "--", "env", f"HOME={self.data_dir}"]
        argv = [
            *(as_account if run_as else []),
            GPULAB,
            "up",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--cull-idle-timeout",
            str(cull_idle_timeout),
        ]
        if simulate:
            argv += ["--simulate-gpus", simulate]
        if db_url:
            argv += ["--db-url", db_url]
        if demo:
            argv += ["--demo"]
        if tls:
            argv += ["--tls", "self-signed"]
        if not self.accounts:
            argv += ["--single-account"]  # not root: everyone runs as this account
        self._log = open(self.log_path, "ab")
        if run_as:
            shutil.chown(self.log_path, run_as)  # the hub makes its log private: it must own it
        # terminal: a terminal (a pty) as its stdin, as `gpulab up` typed in a shell has.
        self._terminal = os.openpty() if terminal else None
        self.proc = subprocess.Popen(
            argv,
            stdin=self._terminal[1] if terminal else None,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.admin_token = None
        self.wait_ready()

    # -- lifecycle -------------------------------------------------------------
    def wait_ready(self, timeout: float = 120) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpulab up exited:\n{self.log_tail()}")
            token_file = self.data_dir / "admin-token"
            if not token_file.exists():
                return False
            self.admin_token = token_file.read_text().strip()
            try:
                r = requests.get(
                    f"{self.api}/inventory", headers=self.auth(), timeout=5, verify=self.verify
                )
            except requests.RequestException:
                return False
            return r.status_code == 200

        wait_until(ready, "the hub and its gpulab service to answer", timeout, detail=self.log_tail)

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def service_pid(self) -> int | None:
        """The gpulab service's process: ``python -m gpulab.service``, named exactly (not
        the MLflow service, ``gpulab.service.experiments``, nor the standby router,
        ``gpulab.service endpoint-standby``)."""
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                argv = p.cmdline()
            except psutil.NoSuchProcess:
                continue
            for i in range(len(argv) - 1):
                named = argv[i : i + 2] == ["-m", "gpulab.service"]
                if named and argv[i + 2 : i + 3] != ["endpoint-standby"]:
                    return p.pid
        return None

    def wait_service_restarted(self, old_pid: int, timeout: float = 180) -> None:
        """Wait until the hub has started a new gpulab service and it answers."""

        def restarted():
            new = self.service_pid()
            try:
                return bool(
                    new and new != old_pid and self.gpulab("GET", "/allocations").status_code == 200
                )
            except requests.RequestException:
                return False

        wait_until(
            restarted, "a new gpulab service to answer", timeout, every=0.5, detail=self.log_tail
        )

    def clear(self) -> None:
        """Stop what tests started, so that the next tests on this hub find it empty:
        deployments, jobs that have not ended, every running server; then wait until
        the ledger holds nothing."""
        for dep in self.gpulab("GET", "/deployments").json():
            self.gpulab("DELETE", f"/deployments/{dep['name']}", params={"user": dep["user"]})
        for job in self.gpulab("GET", "/jobs").json():
            if job["state"] not in JOB_TERMINAL:
                self.gpulab("DELETE", f"/jobs/{job['id']}")
        active = self.hub_api("GET", "/users", params={"state": "active"}).json()
        for user in active:
            for name in user.get("servers") or {}:
                path = (
                    f"/users/{user['name']}/servers/{name}"
                    if name
                    else f"/users/{user['name']}/server"
                )
                self.hub_api("DELETE", path)
        for user in active:
            self.wait_server(user["name"], ready=False)
        try:
            wait_until(
                lambda: self.gpulab("GET", "/allocations").json() == [],
                "the ledger to release what was stopped",
                timeout=60,
            )
        except AssertionError:
            # Rows a test made by hand (POST /allocations) have nothing to stop: the
            # admin releases them, as an operator repairing the ledger would.
            for row in self.gpulab("GET", "/allocations").json():
                self.gpulab("DELETE", f"/allocations/{row['id']}", params={"force": "1"})
        wait_until(
            lambda: self.gpulab("GET", "/allocations").json() == [],
            "the ledger to hold nothing after clearing the hub",
            timeout=30,
            detail=lambda: str(self.gpulab("GET", "/allocations").json()),
        )

    def stop(self) -> None:
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        # Servers, ranks and replicas run in sessions of their own; find them by their
        # hub's data dir (their HOME). They go first: the hub's own shutdown then has
        # no server left to wait for.
        started = []
        for p in psutil.process_iter(["pid", "cmdline", "environ"]):
            try:
                if (p.info["environ"] or {}).get("HOME", "").startswith(str(self.data_dir)):
                    started.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        for p in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        # What the hub's own processes forked away from its tree (the standby endpoint
        # router, when the service was killed above rather than stopped) still names
        # this data dir: a test's hub leaves nothing running.
        data_dir = str(self.data_dir.resolve())
        for p in psutil.process_iter(["environ"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if (p.info["environ"] or {}).get("GPULAB_DATA_DIR") == data_dir:
                    p.kill()
        # The vector engine's socket folder in /tmp, when the service was killed before
        # it could remove it: what the next service on this data dir would do.
        socket_dir.remove_left(data_dir)
        self._log.close()
        for fd in self._terminal or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- REST helpers ----------------------------------------------------------
    def auth(self, token: str | None = None) -> dict:
        return {"Authorization": f"token {token or self.admin_token}"}

    def hub_api(self, method: str, path: str, token: str | None = None, **kw):
        return requests.request(
            method,
            f"{self.url}/hub/api{path}",
            headers=self.auth(token),
            timeout=kw.pop("timeout", 300),
            verify=self.verify,
            **kw,
        )

    def gpulab(self, method: str, path: str, token: str | None = None, **kw):
        return requests.request(
            method,
            f"{self.api}{path}",
            headers=self.auth(token),
            timeout=kw.pop("timeout", 60),
            verify=self.verify,
            **kw,
        )

    def create_user(self, name: str) -> str:
        """Create a user (if needed) and return an API token of theirs."""
        self.hub_api("POST", f"/users/{name}")
        r = self.hub_api("POST", f"/users/{name}/tokens", json={"note": "test"})
        r.raise_for_status()
        return r.json()["token"]

    def spawn(self, user: str, options: dict | None, token: str | None = None):
        return self.hub_api(
            "POST",
            f"/users/{user}/server",
            token=token,
            json=options if options is not None else {},
        )

    def spawn_ready(self, options: dict[str, dict | None]) -> None:
        """Start the servers ``{user: options}`` together and wait until each is ready
        (each POST waits up to 10 s for its own server: one after the other, they add up)."""
        with ThreadPoolExecutor(len(options)) as pool:
            replies = pool.map(self.spawn, options, options.values())
            answers = dict(zip(options, replies, strict=True))
        for user, r in answers.items():
            assert r.status_code in (201, 202), f"{user}: {r.status_code} {r.text}"
        for user in options:
            self.wait_server(user)

    def wait_server(self, user: str, ready: bool = True, timeout: float = 240) -> dict:
        """Wait until the user's default server is ready (or gone, with ready=False)."""

        def reached():
            model = self.hub_api("GET", f"/users/{user}").json()
            server = (model.get("servers") or {}).get("")
            if ready and server and server.get("ready"):
                return model
            if not ready and not server:
                return model
            return None

        return wait_until(
            reached,
            f"{user}'s server {'ready' if ready else 'stopped'}",
            timeout,
            detail=self.log_tail,
        )

    def home(self, user: str) -> Path:
        """The user's home: their account's when users have accounts."""
        return self.data_dir / "home" / (unix_name(user) if self.accounts else user)

    def write_home_file(self, user: str, relpath: str, text: str) -> Path:
        """Put a file in the user's home before their first spawn, as theirs."""
        path = self.home(user) / relpath
        account = None
        if self.accounts:
            account = UserAccounts(home_root=str(self.data_dir / "home")).ensure(user)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if account:
            for p in [path, *path.relative_to(self.home(user)).parents]:
                os.chown(self.home(user) / p, account.uid, account.gid)
        return path

    def server_env(self, user: str) -> dict[str, str]:
        """The environment of the user's running single-user server process."""
        return server_process("HOME", str(self.home(user))).info["environ"]
