"""Each ``%%train_distributed`` job as an MLflow run of its user, written by the service.

When a job ends, the service writes its run through the MLflow proxy in the job's
user's name (its own token and ``X-Gpulab-User``; the proxy trusts the gpulab service
for that header only): in the user's experiment ``<user>/jobs``, named as the job, its
flags as params, what rank 0 ``report()``-ed as metrics (with their steps and times),
its code as ``code/cell.py``, ``--out``'s state dict as ``model/state_dict.pt`` when it
is small enough, its end as the run's status. The run's id goes beside the job
(``mlflow-run.json``), so a deployed model's lineage names it.

Why the service and not the ranks: the service already reads what the ranks report
(from the job's folder, with no network from the ranks, on every backend), and a job
outlives the notebook and the server that started it, and any token they held.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Iterator
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.backend.jobdir import SPEC_READ_BYTES, JobDir
from gpulab.backend.spec import MAX_CODE_BYTES
from gpulab.enforcement.peer_account import refuse_foreign_listener
from gpulab.service.jobs.lineage import MLFLOW_RUN_FILE as RUN_FILE
from gpulab.service.tls import platform_client_context
from gpulab.training.metrics import finite_number

from .proxy import ON_BEHALF_HEADER

log = logging.getLogger("gpulab.experiments")

#: The experiment (in each user's namespace) that jobs' runs go to.
JOBS_EXPERIMENT = "jobs"
#: MLflow's UI shows such an experiment as model training (not GenAI).
KIND = [{"key": "mlflow.experimentKind", "value": "custom_model_development"}]
#: The keys of a ``report()`` record that are not metrics.
NOT_METRICS = frozenset({"time", "rank", "restart", "world_size", "step", "total_steps"})
#: A job's flags that are not params (its code and variables, who and where).
NOT_PARAMS = frozenset({"code", "vars_b64", "env", "id", "user", "checkpoint_dir"})
#: The most of rank 0's reports read into a run, and the most metric values taken from
#: them (a line of many one-letter keys made 130,000 values a MiB: 32 MiB held 1.2 GB).
MAX_REPORT_BYTES = 32 << 20
MAX_RUN_METRICS = 100_000
#: MLflow's limits per log-batch call.
BATCH_METRICS = 1000
BATCH_PARAMS = 100
#: The job states as MLflow's run statuses.
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def job_params(spec: dict) -> list[dict]:
    """The job's flags as MLflow params (strings, at most 6000 characters each)."""
    return [
        {"key": k, "value": str(v)[:6000]}
        for k, v in sorted(spec.items())
        if k not in NOT_PARAMS and isinstance(v, (str, int, float, bool))
    ]


def run_metrics(records: Iterable[dict], most: int = MAX_RUN_METRICS) -> list[dict]:
    """``report()`` records as MLflow metrics: each numeric value, its step and time;
    the first ``most`` of them."""
    out: list[dict] = []
    for n, record in enumerate(records):
        step = record.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else n
        stamp = _epoch_ms(record.get("time"))
        for key, value in record.items():
            if len(out) >= most:
                return out
            if key not in NOT_METRICS and finite_number(value):
                out.append({"key": key, "value": float(value), "timestamp": stamp, "step": step})
    return out


def _epoch_ms(seconds) -> int:
    """A record's ``time`` (seconds since the epoch, as ``report()`` writes it) in
    milliseconds; 0 for anything else (the rank's file is its user's to write)."""
    return int(seconds * 1000) if finite_number(seconds) and 0 <= seconds < 1e11 else 0


def read_reports(jobdir: JobDir, limit: int = MAX_REPORT_BYTES) -> Iterator[dict]:
    """Rank 0's ``report()`` records, the first ``limit`` bytes of them (a rank may
    write any amount; the service reads it as every file of the ranks'), one at a time
    (their reader takes what it keeps)."""
    try:
        data = jobdir.read_user("metrics/rank0.jsonl", 0, limit)
    except OSError:
        return
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            yield record


def epoch_ms(value) -> int | None:
    """A job row's time (datetime or ISO text) in epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, str):
        import datetime as dt

        value = dt.datetime.fromisoformat(value)
    return int(value.timestamp() * 1000)


class RunRecorder:
    """Writes ended jobs' runs (:meth:`record`), one task per job, kept till done."""

    def __init__(self, url: str, token: str, max_model_bytes: int):
        self.url = url.rstrip("/")
        self._token = token
        self.max_model_bytes = max_model_bytes
        self._ssl = platform_client_context() if self.url.startswith("https:") else None
        self._experiments: dict[str, str] = {}
        self._tasks: set[asyncio.Task] = set()

    def record(self, job: dict, jobdir: JobDir, state: str) -> None:
        """Record ``job`` (ended in ``state``) in the background."""
        task = asyncio.ensure_future(self._record_logged(job, jobdir, state))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        """Until every run begun is written (tests; the service's stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def start(self) -> None:
        """Nothing runs until a job ends."""

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _record_logged(self, job: dict, jobdir: JobDir, state: str) -> None:
        try:
            await self._record(job, jobdir, state)
        except Exception as e:  # MLflow down must not touch the job itself
            log.warning("Job %s of %s not recorded in MLflow: %s", job["id"], job["user"], e)

    async def _call(self, user: str, method: str, path: str, body=None, query=None, raw=None):
        # The service's own token goes with every call: never to a port of this machine
        # that another account took (a user's kernel, while the MLflow service was down).
        await refuse_foreign_listener(self.url, "MLflow's service")
        url = f"{self.url}/{path}" + (f"?{urlencode(query)}" if query else "")
        headers = {"Authorization": f"token {self._token}", ON_BEHALF_HEADER: user}
        if raw is None and body is not None:
            raw = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=raw,
            request_timeout=600,
            ssl_options=self._ssl,
        )
        resp = await AsyncHTTPClient().fetch(req)
        return json.loads(resp.body or b"{}") if resp.body else {}

    async def _experiment(self, user: str) -> str:
        if user in self._experiments:
            return self._experiments[user]
        api = "api/2.0/mlflow"
        try:
            found = await self._call(
                user,
                "GET",
                f"{api}/experiments/get-by-name",
                query={"experiment_name": JOBS_EXPERIMENT},
            )
            experiment_id = found["experiment"]["experiment_id"]
        except HTTPClientError as e:
            if e.code != 404:
                raise
            made = await self._call(
                user, "POST", f"{api}/experiments/create", {"name": JOBS_EXPERIMENT, "tags": KIND}
            )
            experiment_id = made["experiment_id"]
        self._experiments[user] = str(experiment_id)
        return self._experiments[user]

    async def _record(self, job: dict, jobdir: JobDir, state: str) -> None:
        user, api = job["user"], "api/2.0/mlflow"
        spec = await asyncio.to_thread(jobdir.read_json, "spec.json", {}, SPEC_READ_BYTES)
        experiment_id = await self._experiment(user)
        run = await self._call(
            user,
            "POST",
            f"{api}/runs/create",
            {
                "experiment_id": experiment_id,
                "run_name": f"{job.get('name') or 'train'}-{job['id']}",
                "start_time": epoch_ms(job.get("started") or job.get("submitted")),
                "tags": [
                    {"key": "gpulab.job_id", "value": job["id"]},
                    {"key": "gpulab.state", "value": state},
                    {"key": "mlflow.user", "value": user},
                    {"key": "mlflow.source.name", "value": "%%train_distributed"},
                    {"key": "mlflow.source.type", "value": "JOB"},
                ],
            },
        )
        run_id = run["run"]["info"]["run_id"]
        artifacts = run["run"]["info"]["artifact_uri"].split("mlflow-artifacts:/", 1)[-1].strip("/")
        await asyncio.to_thread(
            jobdir.write_json, RUN_FILE, {"run_id": run_id, "experiment_id": experiment_id}
        )
        params = job_params(spec)
        # Up to MAX_REPORT_BYTES of the rank's lines, parsed off the event loop.
        metrics = await asyncio.to_thread(lambda: run_metrics(read_reports(jobdir)))
        for i in range(0, max(len(params), 1), BATCH_PARAMS):
            chunk = params[i : i + BATCH_PARAMS]
            if chunk:
                await self._call(
                    user, "POST", f"{api}/runs/log-batch", {"run_id": run_id, "params": chunk}
                )
        for i in range(0, len(metrics), BATCH_METRICS):
            await self._call(
                user,
                "POST",
                f"{api}/runs/log-batch",
                {"run_id": run_id, "metrics": metrics[i : i + BATCH_METRICS]},
            )
        await self._upload_code(user, artifacts, jobdir)
        await self._upload_model(user, artifacts, jobdir)
        await self._call(
            user,
            "POST",
            f"{api}/runs/update",
            {
                "run_id": run_id,
                "status": STATUS.get(state, "FAILED"),
                "end_time": epoch_ms(job.get("finished")) or epoch_ms(job.get("started")),
            },
        )
        log.info("Job %s of %s recorded as MLflow run %s", job["id"], user, run_id)

    async def _upload_code(self, user: str, artifacts: str, jobdir: JobDir) -> None:
        """The job's ``cell.py``: the service's own file, read as one (no link, bounded)."""
        try:
            data = await asyncio.to_thread(jobdir.read_own, "cell.py", MAX_CODE_BYTES + 1)
        except OSError:
            return
        if len(data) <= MAX_CODE_BYTES:
            await self._put(user, artifacts, "code/cell.py", data)

    async def _upload_model(self, user: str, artifacts: str, jobdir: JobDir) -> None:
        """``--out``'s state dict, read as the ranks' files are (no symlinks, bounded)."""
        try:
            data = await asyncio.to_thread(
                jobdir.read_user, "out/state_dict.pt", 0, self.max_model_bytes + 1
            )
        except OSError:
            return  # no --out, or not a model
        if len(data) <= self.max_model_bytes:
            await self._put(user, artifacts, "model/state_dict.pt", data)

    async def _put(self, user: str, artifacts: str, name: str, data: bytes) -> None:
        where = quote(f"{artifacts}/{name}")
        await self._call(user, "PUT", f"api/2.0/mlflow-artifacts/artifacts/{where}", raw=data)
