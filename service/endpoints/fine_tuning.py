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
from gpulab.service.endpoints.fine_tuning_files import (
    TrainingFiles,
    check_training_file,
    epoch,
    for_training,
    listed_user,
)
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
#: The most fine-tuning jobs one user may have open (queued or running) at once: each
#: carries a copy of its base model.
MAX_OPEN_JOBS = 8
#: What serving its adapter says of one job, at most (the newest are kept).
MAX_NOTES = 50
#: The largest ``trained_tokens`` taken from what a job wrote (its column's range).
MAX_TRAINED_TOKENS = 2**62
#: Numbers a report() record may carry into an event (a loss, a step, a time).
_NUMBER_LIMIT = 2**62


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _NUMBER_LIMIT


def _number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < _NUMBER_LIMIT if isinstance(value, int) else math.isfinite(value)


def trained_tokens(summary) -> int | None:
    """``trained_tokens`` of the summary a job wrote (``out/sft.json``, the user's own
    file): an integer from 0 to 2**62, else None (not a number the table can hold)."""
    if not isinstance(summary, dict):
        return None
    tokens = summary.get("trained_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        return None
    return tokens if 0 <= tokens <= MAX_TRAINED_TOKENS else None


def metric_event(record, created: int) -> tuple | None:
    """A ``report()`` record (the user's code wrote it: any JSON) as a step's event,
    or None when it is not a step's loss: a step that is not a count or a loss that
    is not a finite number is left out, not a 500 for the whole list."""
    if not isinstance(record, dict):
        return None
    step, loss, total = record.get("step"), record.get("loss"), record.get("total_steps")
    if not _integer(step) or not _number(loss):
        return None
    if not _integer(total):
        total = None
    at = record.get("time", created)
    at = int(at) if _number(at) and at >= 0 else created
    return (
        at,
        "info",
        "metrics",
        f"Step {step}/{total}: training loss={loss:.4f}",
        {"step": step, "total_steps": total, "train_loss": loss},
    )


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

    def __init__(
        self,
        store: FineTuningStore,
        files: TrainingFiles,
        jobs,
        deployments,
        *,
        refuse_over_budget=None,
        max_open_jobs: int = MAX_OPEN_JOBS,
    ):
        self.store = store
        self.files = files
        self.jobs = jobs
        self.deployments = deployments
        #: ``await refuse_over_budget(user, gpu_milli)`` raises ``BudgetExceeded`` when
        #: the user has used their GPU-hours (the check ``POST /deployments`` makes):
        #: an adapter served is a new version holding a GPU. None: no budgets.
        self.refuse_over_budget = refuse_over_budget
        #: The most fine-tuning jobs one user may have open at once.
        self.max_open_jobs = max_open_jobs
        #: Each user's creates one at a time: each reads the whole base model.
        self._creating: dict[str, asyncio.Lock] = {}
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
        return cls(
            store,
            files,
            service.jobs,
            service.deployments,
            refuse_over_budget=service.budgets.refuse_over_budget,
            max_open_jobs=service.llm_settings.max_open_fine_tuning_jobs,
        )

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
        milli = self.deployments.store.versions(dep["id"])[0]["gpu_milli"]
        # One create of a user's at a time, and what would refuse the job checked
        # before the base model is read and copied into it (up to the site's cap on a
        # job's variables, per request): requests at once cannot hold many copies.
        async with self._creating.setdefault(who.name, asyncio.Lock()):
            self._check_open(who.name)
            try:
                await self.jobs.intake.check_room(who, {"gpu_milli": milli})
            except JobRefused as e:
                raise OpenAIError(e.status, str(e)) from None
            ft_id, adapter, job = await self._submit(who, doc, dep, row, hyper, suffix, milli)
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

    def _check_open(self, user: str) -> None:
        """429 when ``user`` has as many fine-tuning jobs open as one may."""
        open_jobs = self.store.open_jobs_of(user)
        if open_jobs >= self.max_open_jobs:
            raise OpenAIError(
                429,
                f"you have {open_jobs} fine-tuning jobs queued or running, the most one user "
                f"may have at once ({self.max_open_jobs}): wait for one to end, or cancel "
                f"one you no longer need (client.fine_tuning.jobs.cancel(id))",
                code="rate_limit_exceeded",
            )

    async def _submit(self, who, doc: dict, dep: dict, row: dict, hyper, suffix, milli: int):
        """``(ft_id, adapter, job)``: the job that trains, submitted as ``who`` with the
        base model's files and the training file as its variables."""
        paths = await asyncio.to_thread(self._base_paths, dep)
        sizes = await asyncio.to_thread(lambda: sum(os.path.getsize(p) for p in paths.values()))
        self._check_size(doc["model"].strip(), sizes + row["bytes"])
        data = await asyncio.to_thread(self.files.read, row)
        # Checked at upload; again here (off the loop), so no job ever starts on a bad line.
        await asyncio.to_thread(check_training_file, data)
        data = await asyncio.to_thread(for_training, data)
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
            "gpu_milli": milli,
        }
        try:
            job = await self.jobs.submit(who, body)
        except JobRefused as e:
            raise OpenAIError(e.status, str(e)) from None
        return ft_id, adapter, job

    def get(self, who, ft_id: str) -> dict:
        row = self.store.job(ft_id)
        if row is None or not who.can_act_for(row["user"]):
            raise _not_found("fine-tuning job", ft_id)
        return row

    def list(self, who, user: str | None = None) -> list[dict]:
        """The caller's jobs, or (admins and the service: ``?user=``) ``user``'s."""
        return self.store.jobs(listed_user(who, user, "fine-tuning jobs"))

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

    async def remove(self, who, ft_id: str) -> None:
        """A job's row gone (its gpulab job cancelled first if it has not ended), for an
        admin or the service: a hub user removed takes their fine-tuning jobs along,
        so a later user given the name finds none of them."""
        if not (who.admin or who.internal):
            raise OpenAIError(
                403, "removing a fine-tuning job is for admins; cancel it instead", param="remove"
            )
        row = self.get(who, ft_id)
        if row["status"] not in FINAL:
            await self.cancel(who, ft_id)
        self.store.remove_job(ft_id)
        self.notes.pop(ft_id, None)

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
                event = metric_event(r, created)
                if event is not None:
                    out.append(event)
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
        notes = self.notes.setdefault(ft_id, [])
        notes.append((time.time(), text))
        del notes[:-MAX_NOTES]

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
            # The user's own file: any JSON, or none.
            tokens = trained_tokens(jd.read_user_json("out/sft.json", {}))
            dep = self.deployments.store.get(row["deployment_id"])
            if dep is None:
                raise PublishFailed("its base endpoint was stopped before the adapter was served")
            self._note(row["id"], f"Serving adapter {row['adapter']} on {dep['name']}")
            if row["status"] == "queued":  # it ran between two looks
                self.store.update_job(row["id"], status="running")
            owner = Identity(row["user"], "user")
            await serve_adapter(
                self.deployments,
                owner,
                dep,
                row["adapter"],
                files,
                job["id"],
                refuse_over_budget=self.refuse_over_budget,
            )
            current = self.store.job(row["id"])
            if current is None or current["status"] in FINAL:
                return  # cancelled (or removed) while its adapter was being served
            self.store.update_job(
                row["id"],
                status="succeeded",
                fine_tuned_model=f"{dep['name']}:{row['adapter']}",
                trained_tokens=tokens,
            )
        except Exception as e:  # anything: the job fails saying why, never tried again
            if isinstance(e, (PublishFailed, OSError)):
                log.warning("Fine-tuning job %s: %s", row["id"], e)
                reason = str(e)
            else:
                log.exception("Fine-tuning job %s: serving its adapter", row["id"])
                reason = f"serving its adapter failed ({type(e).__name__}: {e})"
            current = self.store.job(row["id"])
            if current is not None and current["status"] not in FINAL:
                self.store.update_job(row["id"], status="failed", error=reason[:2000])
        finally:
            self._publishing.discard(row["id"])
