"""MLflow's store on a site whose database is PostgreSQL: its tables in a schema
``mlflow`` of that database, apart from gpulab's; its server on a Unix socket that
the proxy's account alone may open; and no MLflow process left once it stops."""

from __future__ import annotations

import os
import stat

import psutil
import pytest
import sqlalchemy

from gpulab.service.experiments.proxy import MlflowBackend
from gpulab.service.experiments.tracking_server import TrackingServer

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


async def test_mlflow_keeps_its_tables_in_a_schema_of_the_sites_postgresql(postgres_db, tmp_path):
    # gpulab's own tables are already there (an alembic_version of its own).
    engine = sqlalchemy.create_engine(postgres_db.replace("postgresql:", "postgresql+psycopg:", 1))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE alembic_version (version_num text)"))
        conn.execute(sqlalchemy.text("INSERT INTO alembic_version VALUES ('gpulab-head')"))
    tracking = TrackingServer(str(tmp_path), postgres_db, "/services/mlflow/")
    backend = MlflowBackend(tracking, "/services/mlflow/")
    try:
        status, made = await backend.call("POST", "experiments/create", None, {"name": "a/demo"})
        assert status == 200, made
        status, found = await backend.call(
            "GET", "experiments/get-by-name", {"experiment_name": ["a/demo"]}, None
        )
        assert found["experiment"]["experiment_id"] == made["experiment_id"]
        # Only the proxy's account reaches the server.
        run_dir = os.path.dirname(tracking.socket_path)
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
        pids = [
            tracking.proc.pid,
            *(c.pid for c in psutil.Process(tracking.proc.pid).children(True)),
        ]
    finally:
        await backend.close()
        await tracking.stop()
    inspector = sqlalchemy.inspect(engine)
    assert {"experiments", "runs", "metrics", "alembic_version"} <= set(
        inspector.get_table_names(schema="mlflow")
    )
    assert set(inspector.get_table_names(schema="public")) == {"alembic_version"}
    with engine.begin() as conn:
        assert conn.execute(sqlalchemy.text("SELECT * FROM public.alembic_version")).all() == [
            ("gpulab-head",)
        ]
    engine.dispose()
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
