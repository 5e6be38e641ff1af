"""Where an endpoint version's model came from, as the deploy spec claims and the service checks.

``%deploy`` sends ``lineage``: ``{"job": {"id", ...} | null, "quantization": {...} |
null}``. A job is the anchor (as a run is for a registered model in MLflow): the
service looks it up and takes its code hash and datasets from its own record, so a
version never carries facts its job did not have; the caller must own the job (or be
an admin). ``quantization`` is what ``%quantize`` measured, kept as sent (small).
Stored on the version's row with who deployed it; shown per version.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from gpulab.service.endpoints.settings import DeployRefused

#: Largest quantization report kept, as JSON.
MAX_QUANTIZATION_CHARS = 2000
#: Dataset versions an audit entry names (the version's row keeps them all).
AUDIT_DATASETS = 5


def _refuse(why: str) -> DeployRefused:
    return DeployRefused(400, f"'lineage': {why}; %deploy fills it in, or leave it out")


def check_quantization(value) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("scheme"), str):
        raise _refuse("'quantization' must be an object with a 'scheme'")
    if len(json.dumps(value)) > MAX_QUANTIZATION_CHARS:
        raise _refuse(f"'quantization' is over {MAX_QUANTIZATION_CHARS} characters of JSON")
    for key, item in value.items():
        if not isinstance(item, (str, int, float, bool, type(None))):
            raise _refuse(f"'quantization' {key!r} must be a number or a string")
    return dict(value)


def resolve(claim, who, job_facts: Callable[[str], dict | None] | None) -> dict:
    """The lineage to store for a new version deployed by ``who``: the job's facts as
    the service knows them, the quantization as sent, and who deployed it."""
    if claim is None:
        claim = {}
    if not isinstance(claim, dict) or set(claim) - {"job", "quantization"}:
        raise _refuse("an object with 'job' and 'quantization' (each may be null)")
    job = claim.get("job")
    if job is not None:
        job_id = job.get("id") if isinstance(job, dict) else None
        if not isinstance(job_id, str) or not job_id:
            raise _refuse("'job' must be null or an object with the job's 'id'")
        facts = job_facts(job_id) if job_facts is not None else None
        if facts is None or not who.can_act_for(facts["user"]):
            raise DeployRefused(
                400,
                f"'lineage': job {job_id!r} is not a job of yours this service knows; "
                f"deploy a model your own %%train_distributed job brought back",
            )
        job = {"id": job_id, "code_hash": facts["code_hash"], "datasets": facts["datasets"]}
        if facts.get("mlflow_run_id"):  # the job's run in MLflow (service/experiments/)
            job["mlflow_run_id"] = facts["mlflow_run_id"]
    return {
        "created_by": who.name,
        "job": job,
        "quantization": check_quantization(claim.get("quantization")),
    }


def version_lineage(dep: dict, vrow: dict) -> dict:
    """A version's lineage as the API shows it. A version of before lineage was kept
    says it has no job (its owner deployed it: only the owner adds versions)."""
    stored = vrow.get("lineage") or {}
    return {
        "version": vrow["version"],
        "created": vrow["created"],
        "created_by": stored.get("created_by") or dep["user"],
        "job": stored.get("job"),
        "quantization": stored.get("quantization"),
    }


def model_lineage(dep: dict, versions: list[dict]) -> dict:
    """``GET /models/{owner}/{name}/lineage``: every version of the endpoint."""
    return {
        "owner": dep["user"],
        "name": dep["name"],
        "versions": [version_lineage(dep, v) for v in versions],
    }


def audit_summary(lineage: dict) -> dict:
    """What the deployment's audit entry says of the new version's origin (short)."""
    job = lineage.get("job") or {}
    quant = lineage.get("quantization") or {}
    datasets = [f"{d['name']}@{d['version'][:12]}" for d in job.get("datasets") or []]
    return {
        "job": job.get("id"),
        "code_hash": job.get("code_hash"),
        "datasets": datasets[:AUDIT_DATASETS] or None,
        "quantization": quant.get("scheme"),
    }
