"""A real, throw-away PostgreSQL server for tests (Debian's postgresql package)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager

from gpulab.hub_ext.ports import free_port


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError(
            "PostgreSQL is not installed: run `make up` or `apt-get install postgresql` "
            "(the PostgreSQL tests need a real server)"
        )
    return os.path.dirname(found[-1])


@contextmanager
def postgres_server():
    """Start PostgreSQL on a free port in a temp dir; yield its URL; remove it after."""
    bindir = _bindir()
    root = tempfile.mkdtemp(prefix="gpulab-pg-")
    datadir = os.path.join(root, "data")
    as_user: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root.
        shutil.chown(root, "postgres", "postgres")
        os.chmod(root, 0o700)
        as_user = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        as_user
        + [f"{bindir}/initdb", "-D", datadir, "--auth=trust", "-U", "postgres", "--no-sync"],
        check=True,
        capture_output=True,
    )
    # Below the ephemeral range: a port the kernel handed out once is handed to any
    # client's connection next, before PostgreSQL binds it.
    port = free_port()
    proc = subprocess.Popen(
        as_user
        + [
            f"{bindir}/postgres",
            "-D",
            datadir,
            "-p",
            str(port),
            "-k",
            root,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            r = subprocess.run(
                [f"{bindir}/pg_isready", "-h", "127.0.0.1", "-p", str(port)], capture_output=True
            )
            if r.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"PostgreSQL did not start: {proc.stderr.read().decode()[-2000:]}"
                )
            time.sleep(0.2)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)


def sqlalchemy_url(url: str) -> str:
    """The server's ``postgresql://`` URL for SQLAlchemy's psycopg 3 driver."""
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


@contextmanager
def fresh_database(server_url: str):
    """An empty database of its own on ``server_url``'s server; yield its URL; drop it
    after. Tests that share a server (one per pytest process) never see each other's
    tables or migration state."""
    from sqlalchemy import create_engine, text

    name = f"gpulab_t_{uuid.uuid4().hex[:10]}"
    admin = create_engine(sqlalchemy_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
