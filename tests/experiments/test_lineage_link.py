"""A deployed model's lineage names the MLflow run of the job that trained it."""

from __future__ import annotations

from gpulab.service.auth import Identity
from gpulab.service.endpoints.lineage import resolve

FACTS = {
    "j1": {"user": "alice", "code_hash": "ab" * 32, "datasets": [], "mlflow_run_id": "run-1"},
    "j2": {"user": "alice", "code_hash": "cd" * 32, "datasets": [], "mlflow_run_id": None},
}


def test_the_lineage_links_the_jobs_run():
    alice = Identity("alice", "user")
    linked = resolve({"job": {"id": "j1"}}, alice, FACTS.get)
    assert linked["job"] == {
        "id": "j1",
        "code_hash": "ab" * 32,
        "datasets": [],
        "mlflow_run_id": "run-1",
    }
    # A job recorded before MLflow (or without it) keeps the lineage it had.
    assert "mlflow_run_id" not in resolve({"job": {"id": "j2"}}, alice, FACTS.get)["job"]
