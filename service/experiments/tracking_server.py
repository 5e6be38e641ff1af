"""MLflow's own tracking server, as a child process on a Unix socket only the proxy reaches.

A socket in a folder of the service's account (0700), not a loopback port: every
account on the machine (users' servers, job ranks) may connect to a loopback port,
and MLflow's server itself checks no one. It starts on the first request that needs
it (most hubs never use MLflow; its server takes ~0.6 GB and seconds to start) and
stops with the proxy.

Its store: SQLite in the data dir by default; on a site whose database is PostgreSQL
(``gpulab up --db-url postgresql://...``), a schema ``mlflow`` of that same database,
so MLflow's tables and migrations (its own ``alembic_version``) stay apart from
gpulab's. Artifacts are served by MLflow (``mlflow-artifacts:/``) from a folder of
the data dir: clients never write to the box's disks themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

log = logging.getLogger("gpulab.experiments")

#: The PostgreSQL schema MLflow's tables live in.
PG_SCHEMA = "mlflow"
#: MLflow's server options that keep it small: no job runner (7 more processes of
#: ~160 MB each, for features the proxy does not offer), no telemetry sent out.
QUIET_ENV = {
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
}


def store_uri(data_dir: str, db_url: str = "") -> str:
    """MLflow's backend store: the site's PostgreSQL (schema ``mlflow``) when
    ``db_url`` is one, else SQLite in ``data_dir``."""
    if db_url.startswith(("postgresql:", "postgresql+", "postgres:")):
        parts = urlsplit(db_url)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
        query.append(("options", f"-csearch_path={PG_SCHEMA}"))
        # psycopg 3 is the driver gpulab installs (MLflow would default to psycopg2).
        scheme = "postgresql+psycopg"
        return urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))
    return f"sqlite:///{Path(data_dir) / 'mlflow' / 'mlflow.sqlite'}"


def ensure_pg_schema(uri: str) -> None:
    """Create the ``mlflow`` schema MLflow's tables go in (PostgreSQL only)."""
    if not uri.startswith("postgresql"):
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}"))
    finally:
        engine.dispose()


def server_env(store: str, environ=os.environ) -> dict[str, str]:
    """MLflow's environment: its store, and the proxy's environment without the hub's
    credentials (MLflow's server never calls the hub), quiet."""
    return {
        **{k: v for k, v in environ.items() if not k.startswith(("JUPYTERHUB_", "GPULAB_"))},
        **QUIET_ENV,
        "MLFLOW_BACKEND_STORE_URI": store,
    }


def server_argv(artifacts: str, socket_path: str, prefix: str) -> list[str]:
    """``mlflow server`` serving under ``prefix`` on ``socket_path`` (one worker)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        # The store (a PostgreSQL URL may hold a password) goes in the environment
        # (MLFLOW_BACKEND_STORE_URI, :func:`server_env`): any account may read a
        # process's command line, only its owner its environment.
        "--serve-artifacts",
        "--artifacts-destination",
        artifacts,
        "--static-prefix",
        prefix.rstrip("/"),
        "--workers",
        "1",
        # The proxy sends Host: localhost; MLflow refuses other hosts.
        "--allowed-hosts",
        "localhost",
        "--uvicorn-opts",
        f"--uds {socket_path}",
    ]


def stop_with_parent() -> None:
    """In the child: SIGTERM when the proxy dies, however it dies (MLflow's CLI passes
    it to its worker), so no MLflow outlives its proxy."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class TrackingServer:
    """Starts MLflow's server on first use (:meth:`ready`), stops it (:meth:`stop`)."""

    def __init__(self, data_dir: str, db_url: str, prefix: str, start_timeout: float = 180):
        self.home = Path(data_dir) / "mlflow"
        self.socket_path = str(self.home / "run" / "mlflow.sock")
        self.store = store_uri(data_dir, db_url)
        self.prefix = prefix
        self.start_timeout = start_timeout
        self.proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Task | None = None

    async def ready(self) -> str:
        """The socket path, once MLflow answers on it (started here the first time)."""
        if self.proc is not None and self.proc.returncode is None and self._starting is None:
            return self.socket_path
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        finally:
            if self._starting is not None and self._starting.done():
                failed = self._starting.exception() is not None
                self._starting = None
                if failed:
                    await self.stop()
        return self.socket_path

    async def _start(self) -> None:
        (self.home / "run").mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.home, 0o700)
        os.chmod(self.home / "run", 0o700)
        (self.home / "artifacts").mkdir(exist_ok=True, mode=0o700)
        with_stale = Path(self.socket_path)
        if with_stale.exists():
            with_stale.unlink()
        await asyncio.to_thread(ensure_pg_schema, self.store)
        log_file = open(self.home / "server.log", "ab")  # noqa: SIM115 - the child's
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *server_argv(str(self.home / "artifacts"), self.socket_path, self.prefix),
                env=server_env(self.store),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                cwd=str(self.home),
                # Its own group: the uvicorn worker it forks stops with it.
                start_new_session=True,
                preexec_fn=stop_with_parent,
            )
        finally:
            log_file.close()
        log.info("MLflow tracking server starting (pid %d), store %s", self.proc.pid, self.where)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        while not await self._answers():
            if self.proc.returncode is not None:
                raise RuntimeError(
                    f"MLflow's server exited ({self.proc.returncode}): see {self.home}/server.log"
                )
            if loop.time() > deadline:
                raise TimeoutError(f"MLflow's server did not answer in {self.start_timeout:.0f} s")
            await asyncio.sleep(0.25)
        log.info("MLflow tracking server ready on %s", self.socket_path)

    @property
    def where(self) -> str:
        return self.store.split("@")[-1]

    async def _answers(self) -> bool:
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError:
            return False
        try:
            path = f"{self.prefix.rstrip('/')}/health"
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 10)
            return b" 200 " in line
        except (TimeoutError, OSError):
            return False
        finally:
            writer.close()

    async def stop(self, grace_s: float = 10) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), grace_s)
        except (TimeoutError, ProcessLookupError):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
