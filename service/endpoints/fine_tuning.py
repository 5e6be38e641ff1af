"""Fine-tuning jobs of the OpenAI-compatible API (``POST /v1/fine_tuning/jobs``).

A fine-tuning job is a gpulab job like any other: submitted as its caller
(:meth:`~gpulab.service.jobs.manager.JobManager.submit`), queued, placed on the
caller's slices, preempted and accounted, shown in ``/jobs``. Its cell is
:func:`gpulab.training.sft.lora_sft` with the base endpoint's Hugging Face folder
and the training file as its variables; its ``report()`` lines are the job's
events (the loss of each step). When the job succeeds its adapter is served on
the base endpoint (:mod:`.fine_tuning_publish`) and ``fine_tuned_model`` is
``NAME:ADAPTER``, callable through the gateway at once; the endpoint's new
version names the job in its lineage.

Files and jobs are their owner's: anyone else is told they do not exist (404).
The base must be an endpoint of the caller's own (the adapter changes it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import pickle
import re
import time
import uuid

from gpulab.db.fine_tuning import FINAL, FineTuningStore
from gpulab.service.auth import Identity
from gpulab.service.endpoints.calls import CallRefused
from gpulab.service.endpoints.fine_tuning_files import TrainingFiles, check_training_file, epoch
from gpulab.service.endpoints.fine_tuning_files import not_found as _not_found
from gpulab.service.endpoints.fine_tuning_publish import (
    ADAPTER_FILES,
    PublishFailed,
    serve_adapter,
)
from gpulab.service.endpoints.openai_errors import OpenAIError, model_not_found
from gpulab.service.jobs.manager import JobRefused
from gpulab.service.tasks import KeptTask, TaskSet

log = logging.getLogger("gpulab.service.endpoints.fine_tuning")

#: What the job runs: the SFT loop over its variables.
CELL = (
    "from gpulab.training.sft import lora_sft\n"
    "lora_sft(ft_base, ft_training, **ft_hyperparameters)\n"
)
#: OpenAI's hyperparameters: (lowest, highest, what "auto" means).
HYPERPARAMETERS = {
    "n_epochs": (1, 50, 3),
    "batch_size": (1, 256, 4),
    "learning_rate_multiplier": (1e-3, 1000.0, 1.0),
}
SUFFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
#: The gpulab job's states as OpenAI's clients know them (``succeeded`` waits for
#: the adapter to be served).
STATUS = {"queued": "queued", "running": "running", "failed": "failed", "cancelled": "cancelled"}
POLL_S = 1.0


def check_hyperparameters(doc: dict) -> dict:
    """``hyperparameters`` (or ``method.supervised.hyperparameters``) with "auto"
    and what is left out filled in; 400 for one unknown or out of range."""
    given = doc.get("hyperparameters")
    method = doc.get("method")
    if method is not None:
        if not isinstance(method, dict) or method.get("type", "supervised") != "supervised":
            raise OpenAIError(
                400, "method: only supervised fine-tuning is offered here", param="method"
            )
        inner = (method.get("supervised") or {}).get("hyperparameters")
        given = {**(given or {}), **(inner or {})}
    given = given or {}
    if not isinstance(given, dict):
        raise OpenAIError(400, "hyperparameters must be an object", param="hyperparameters")
    unknown = sorted(set(given) - set(HYPERPARAMETERS))
    if unknown:
        raise OpenAIError(
            400,
            f"hyperparameters: {', '.join(unknown)} not known; give {', '.join(HYPERPARAMETERS)}",
            param="hyperparameters",
        )
    out = {}
    for key, (lo, hi, auto) in HYPERPARAMETERS.items():
        value = given.get(key, "auto")
        if value == "auto" or value is None:
            value = auto
        integer = isinstance(auto, int)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and integer:
            ok = float(value).is_integer()
        if not ok or not math.isfinite(value) or not lo <= value <= hi:
            kind = "an integer" if integer else "a number"
            raise OpenAIError(
                400,
                f"hyperparameters.{key} must be {kind} from {lo:g} to {hi:g} or 'auto', "
                f"got {value!r}",
                param=f"hyperparameters.{key}",
            )
        out[key] = int(value) if integer else float(value)
    return out


def job_object(row: dict) -> dict:
    """A fine-tuning job as OpenAI's API shows it (``gpulab_job``: the job that trains)."""
    error = None
    if row["status"] == "failed":
        error = {"code": "job_failed", "message": row["error"] or "failed", "param": None}
    return {
        "id": row["id"],
        "object": "fine_tuning.job",
        "created_at": epoch(row["created"]),
        "finished_at": epoch(row["finished"]) if row["finished"] else None,
        "model": row["model"],
        "fine_tuned_model": row["fine_tuned_model"],
        "organization_id": row["user"],
        "status": row["status"],
        "hyperparameters": row["hyperparameters"],
        "method": {
            "type": "supervised",
            "supervised": {"hyperparameters": row["hyperparameters"]},
        },
        "training_file": row["training_file"],
        "validation_file": None,
        "result_files": [],
        "trained_tokens": row["trained_tokens"],
        "error": error,
        "seed": 0,
        "estimated_finish": None,
        "integrations": [],
        "suffix": row["suffix"],
        "gpulab_job": row["job_id"],
    }


#: The largest adapter_config.json taken (PEFT writes a few hundred bytes).
MAX_CONFIG_BYTES = 1 << 20


def adapter_files(jd, max_mib: int) -> dict[str, bytes]:
    """The adapter a fine-tuning job wrote (``out/``), each file at most the site's
    model size: the ranks may write any amount, and the service holds it in memory."""
    files = {}
    for name in ADAPTER_FILES:
        # Its config is a few hundred bytes of JSON, read and checked here (a thread).
        config = name == "adapter_config.json"
        most = MAX_CONFIG_BYTES if config else max_mib << 20
        data = jd.read_user(f"out/{name}", limit=most + 1)
        if len(data) > most:
            why = (
                "more than an adapter's config holds"
                if config
                else "the site's largest model (c.Endpoints.max_model_mib); train a smaller "
                "adapter (a lower LoRA rank)"
            )
            raise PublishFailed(
                f"the job's adapter file out/{name} is over {most / 2**20:g} MiB, {why}"
            )
        files[name] = data
    try:
        json.loads(files["adapter_config.json"])
    except ValueError:
        raise PublishFailed("the job wrote an adapter_config.json that is not JSON") from None
    return files


class FineTuning:
    """Training files and fine-tuning jobs over the job manager (``jobs``) and the
    deployment manager (``deployments``); a loop follows each open job."""

    def __init__(self, store: FineTuningStore, files: TrainingFiles, jobs, deployments):
        self.store = store
        self.files = files
        self.jobs = jobs
        self.deployments = deployments
        #: Fine-tuning job id -> what serving its adapter has said (events).
        self.notes: dict[str, list[tuple[float, str]]] = {}
        self._publishing: set[str] = set()
        self._tasks = TaskSet()
        self._loop = KeptTask("gpulab-fine-tuning", self.loop)

    @classmethod
    def of(cls, service) -> FineTuning:
        store = FineTuningStore(service.ledger.engine)
        folder = os.path.join(service.data_dir, "fine_tuning", "files")
        files = TrainingFiles(store, folder, service.llm_settings.training_files_quota_mib)
        return cls(store, files, service.jobs, service.deployments)

    # -- jobs ------------------------------------------------------------------------
    def base_endpoint(self, who, model) -> dict:
        """The caller's own language-model endpoint ``model`` names."""
        if not isinstance(model, str) or not model.strip():
            raise OpenAIError(
                400, 'name the base: "model": "NAME" (your language-model endpoint)', param="model"
            )
        model = model.strip()
        if ":" in model:
            raise OpenAIError(
                400,
                f"`{model}` is an adapter; fine-tune its base endpoint "
                f"`{model.split(':', 1)[0]}` (each adapter trains from the base)",
                param="model",
            )
        owner, _, name = model.rpartition("/")
        try:
            dep = self.deployments.calls.callable_endpoint(who, owner or who.name, name)
        except CallRefused:
            raise model_not_found(model) from None
        if dep["user"] != who.name:
            raise OpenAIError(
                403,
                f"`{model}` is {dep['user']}'s: a fine-tune adds its adapter to the endpoint, "
                f"so fine-tune an endpoint of your own (%deploy the model as yours first)",
                param="model",
            )
        stable = self.deployments.store.versions(dep["id"])[0]
        card = self.deployments.card(stable["id"]) or {}
        if card.get("kind") != "causal-lm":
            raise OpenAIError(
                400,
                f"`{model}` is a {card.get('kind') or 'torch-export'} endpoint; fine-tuning "
                f"trains language models (%deploy MODEL --name NAME --tokenizer TOK)",
                param="model",
            )
        return dep

    def _base_paths(self, dep: dict) -> dict[str, str]:
        """The base model's Hugging Face files (the service unpacked them: no links)."""
        stable = self.deployments.store.versions(dep["id"])[0]
        hf = os.path.join(self.deployments.serving.model_dir(stable["id"]), "hf")
        paths = {name: os.path.join(hf, name) for name in sorted(os.listdir(hf))}
        return {n: p for n, p in paths.items() if os.path.isfile(p) and not os.path.islink(p)}

    @staticmethod
    def _read_all(paths: dict[str, str]) -> dict[str, bytes]:
        out = {}
        for name, path in paths.items():
            with open(path, "rb") as f:
                out[name] = f.read()
        return out

    def _check_size(self, model: str, size_bytes: int) -> None:
        """The job carries the base model and the file as its variables: within the
        site's cap on a job's variables (checked before either is read), or a 413 that
        says which cap."""
        cap = self.jobs.limits.max_job_vars_mib
        size = size_bytes / 2**20
        if size > cap:
            raise OpenAIError(
                413,
                f"the base model `{model}` and the training file are {size:.0f} MiB; a "
                f"fine-tuning job carries them as its variables, at most {cap} MiB here "
                f"(an admin can raise c.JobQueue.max_job_vars_mib)",
                param="model",
            )

    async def create(self, who, doc: dict) -> dict:
        if who.kind != "user":
            raise OpenAIError(403, "fine-tuning jobs are made by users (with a user's token)")
        dep = self.base_endpoint(who, doc.get("model"))
        fid = doc.get("training_file")
        if not isinstance(fid, str) or not fid:
            raise OpenAIError(
                400, "training_file: give the id of a file you uploaded", param="training_file"
            )
        if doc.get("validation_file"):
            raise OpenAIError(
                400, "validation_file is not offered yet; leave it out", param="validation_file"
            )
        hyper = check_hyperparameters(doc)
        suffix = doc.get("suffix")
        if suffix is not None and (not isinstance(suffix, str) or not SUFFIX.fullmatch(suffix)):
            raise OpenAIError(
                400,
                f"suffix {suffix!r}: up to 40 letters, digits, '.', '_' or '-'",
                param="suffix",
            )
        row = self.files.get(who, fid)
        paths = await asyncio.to_thread(self._base_paths, dep)
        sizes = await asyncio.to_thread(lambda: sum(os.path.getsize(p) for p in paths.values()))
        self._check_size(doc["model"].strip(), sizes + row["bytes"])
        data = await asyncio.to_thread(self.files.read, row)
        # Checked at upload; again here (off the loop), so no job ever starts on a bad line.
        await asyncio.to_thread(check_training_file, data)
        ft_id = f"ftjob-{uuid.uuid4().hex[:24]}"
        adapter = f"{suffix or 'ft'}-{ft_id[6:14]}"
        base = await asyncio.to_thread(self._read_all, paths)
        variables = {"ft_base": base, "ft_training": data, "ft_hyperparameters": hyper}
        # Off the event loop: a base model is megabytes to gigabytes.
        vars_b64 = await asyncio.to_thread(
            lambda: base64.b64encode(pickle.dumps(variables)).decode()
        )
        body = {
            "code": CELL,
            "name": f"fine-tune-{adapter}"[:63],
            "vars_b64": vars_b64,
            "gpu_milli": self.deployments.store.versions(dep["id"])[0]["gpu_milli"],
        }
        try:
            job = await self.jobs.submit(who, body)
        except JobRefused as e:
            raise OpenAIError(e.status, str(e)) from None
        ft = self.store.add_job(
            {
                "id": ft_id,
                "user": who.name,
                "model": doc["model"].strip(),
                "deployment_id": dep["id"],
                "training_file": fid,
                "hyperparameters": hyper,
                "suffix": suffix,
                "adapter": adapter,
                "job_id": job["id"],
                "status": "queued",
            }
        )
        log.info("Fine-tuning job %s of %s: job %s on %s", ft_id, who.name, job["id"], dep["name"])
        return job_object(ft)

    def get(self, who, ft_id: str) -> dict:
        row = self.store.job(ft_id)
        if row is None or not who.can_act_for(row["user"]):
            raise _not_found("fine-tuning job", ft_id)
        return row

    def list(self, who) -> list[dict]:
        return self.store.jobs(who.name)

    async def cancel(self, who, ft_id: str) -> dict:
        row = self.get(who, ft_id)
        if row["status"] in FINAL:
            raise OpenAIError(
                400, f"the job {ft_id} has already {row['status']}; nothing to cancel"
            )
        job = self.jobs.queue.get(row["job_id"]) if row["job_id"] else None
        if job is not None:
            by = "its owner" if who.name == row["user"] else f"{who.kind} {who.name}"
            await self.jobs.cancel(job, f"fine-tuning job cancelled by {by}")
        return self.store.update_job(ft_id, status="cancelled")

    # -- events ----------------------------------------------------------------------
    def events(self, row: dict) -> list[dict]:
        """Oldest first: the job's life, and the loss of each training step."""
        created = epoch(row["created"])
        out = [
            (created, "info", "message", f"Created fine-tuning job {row['id']}", None),
            (created, "info", "message", f"Validated training file {row['training_file']}", None),
            (created, "info", "message", f"Queued as gpulab job {row['job_id']}", None),
        ]
        job = self.jobs.queue.get(row["job_id"]) if row["job_id"] else None
        if job is not None:
            records, _ = self.jobs.jobdir(job).metrics(0, 0)
            for r in records:
                if "loss" not in r or "step" not in r:
                    continue
                total = r.get("total_steps")
                out.append(
                    (
                        int(r.get("time", created)),
                        "info",
                        "metrics",
                        f"Step {r['step']}/{total}: training loss={r['loss']:.4f}",
                        {"step": r["step"], "total_steps": total, "train_loss": r["loss"]},
                    )
                )
        for at, text in self.notes.get(row["id"], []):
            out.append((int(at), "info", "message", text, None))
        if row["status"] in FINAL:
            at = epoch(row["finished"]) if row["finished"] else created
            if row["status"] == "succeeded":
                text = f"The job has successfully completed: {row['fine_tuned_model']}"
                out.append((at, "info", "message", text, None))
            elif row["status"] == "failed":
                out.append((at, "error", "message", f"The job failed: {row['error']}", None))
            else:
                out.append((at, "info", "message", "The job was cancelled", None))
        return [
            {
                "object": "fine_tuning.job.event",
                "id": f"ftevent-{row['id'][6:]}-{n}",
                "created_at": at,
                "level": level,
                "type": kind,
                "message": text,
                "data": data or {},
            }
            for n, (at, level, kind, text, data) in enumerate(out)
        ]

    # -- following the jobs ----------------------------------------------------------
    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self._tasks.cancel()

    async def loop(self) -> None:
        while True:
            try:
                await self.follow()
            except Exception:
                log.exception("Following the fine-tuning jobs")
            await asyncio.sleep(POLL_S)

    async def follow(self) -> None:
        """Each open fine-tuning job takes its gpulab job's state; a succeeded one has
        its adapter served first."""
        for row in await asyncio.to_thread(self.store.jobs, open_only=True):
            job = self.jobs.queue.get(row["job_id"]) if row["job_id"] else None
            if job is None:
                self.store.update_job(row["id"], status="failed", error="its job is gone")
                continue
            state = job["state"]
            if state == "succeeded":
                if row["id"] not in self._publishing:
                    self._publishing.add(row["id"])
                    self._tasks.spawn(self._publish(row, job))
                continue
            status = STATUS[state]
            if status != row["status"]:
                values = {"status": status}
                if status == "failed":
                    values["error"] = job.get("message") or "the training job failed"
                self.store.update_job(row["id"], **values)

    def _note(self, ft_id: str, text: str) -> None:
        self.notes.setdefault(ft_id, []).append((time.time(), text))

    async def _publish(self, row: dict, job: dict) -> None:
        try:
            jd = self.jobs.jobdir(job)
            try:
                files = await asyncio.to_thread(
                    adapter_files, jd, self.deployments.limits.max_model_mib
                )
            except OSError as e:
                raise PublishFailed(
                    f"job {job['id']} ended without its adapter ({e.strerror or e}: "
                    f"out/{ADAPTER_FILES[1]}); its log says why: GET /jobs/{job['id']}/logs"
                ) from None
            summary = jd.read_user_json("out/sft.json", {}) or {}
            dep = self.deployments.store.get(row["deployment_id"])
            if dep is None:
                raise PublishFailed("its base endpoint was stopped before the adapter was served")
            self._note(row["id"], f"Serving adapter {row['adapter']} on {dep['name']}")
            if row["status"] == "queued":  # it ran between two looks
                self.store.update_job(row["id"], status="running")
            owner = Identity(row["user"], "user")
            await serve_adapter(self.deployments, owner, dep, row["adapter"], files, job["id"])
            if self.store.job(row["id"])["status"] in FINAL:
                return  # cancelled while its adapter was being served: it is served anyway
            self.store.update_job(
                row["id"],
                status="succeeded",
                fine_tuned_model=f"{dep['name']}:{row['adapter']}",
                trained_tokens=summary.get("trained_tokens"),
            )
        except (PublishFailed, OSError) as e:
            log.warning("Fine-tuning job %s: %s", row["id"], e)
            if self.store.job(row["id"])["status"] not in FINAL:
                self.store.update_job(row["id"], status="failed", error=str(e))
        finally:
            self._publishing.discard(row["id"])
