"""The deployment manager: model endpoints placed by the ledger, run by a serving backend.

A deployment is a model directory (uploaded by ``%deploy``), a number of
replicas, each holding a slice (ledger owner ``<deployment id>/<replica>``,
kind ``deployment``), and the batching settings of the model server. Where the
replicas run is the serving backend's business (:mod:`gpulab.backend.serving_base`:
processes on this machine, or a Deployment on Kubernetes). One loop (every
second) asks the backend how each deployment is and writes it to the table; a
deployment that fails gives its slices back. Replicas outlive a restart of the
service, which adopts them again in :meth:`DeploymentManager.start`.

Checking what clients send lives in :mod:`.deployment_settings`, forwarding
calls in :mod:`.endpoint_proxy`, the traffic maths in :mod:`.serving_metrics`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field

from gpulab.backend.local_serving import LocalServing
from gpulab.backend.serving_base import ServingBackend
from gpulab.db.deployments import DeploymentStore, NameTaken
from gpulab.scheduler.ledger import NoCapacity, OwnerConflict
from gpulab.scheduler.quota import QuotaExceeded

from .deployment_settings import DeployRefused, check_batch, check_create, check_patch
from .endpoint_proxy import EndpointProxy
from .model_archive import ArchiveRefused, unpack_model
from .serving_metrics import RequestStats

log = logging.getLogger("gpulab.service.deployments")

TICK_S = 1.0
STATS_EVERY_S = 5.0
LOG_BYTES = 256 * 1024

__all__ = ["DeployRefused", "Deployment", "DeploymentManager", "serving_backend"]


def upload_spool(service) -> str:
    """Where model uploads are written while they arrive (private to the service)."""
    return os.path.join(service.data_dir, "uploads")


def serving_backend(service) -> ServingBackend:
    """The backend ``c.GpuLabService.serving_backend_class`` names (processes on this
    machine by default; Kubernetes with :class:`~.kube_serving.KubernetesServingSettings`,
    or where the deprecated ``c.GpuLabService.kubernetes_deployments`` is set).
    ValueError for settings it cannot start with."""
    from gpulab.backend.kubernetes.serving import KubernetesServing

    from .kube_serving import kubernetes_serving, settings_from_dict

    root = os.path.join(service.data_dir, "deployments")
    legacy = dict(getattr(service, "kubernetes_deployments", None) or {})
    settings = settings_from_dict(legacy, parent=service)
    cls = getattr(service, "serving_backend_class", None) or (
        KubernetesServing if legacy else LocalServing
    )
    if issubclass(cls, KubernetesServing):
        return kubernetes_serving(settings, root, service.gpus, cls=cls)
    if issubclass(cls, LocalServing):
        return cls(
            root,
            real_gpus=any(not g.simulated for g in service.gpus),
            accounts=service.accounts,
            limits=service.account_limits,
            gpu_count=len(service.gpus),
        )
    if hasattr(cls, "from_service"):  # a site's own backend builds itself
        return cls.from_service(service, root)
    raise ValueError(
        f"c.GpuLabService.serving_backend_class = {cls.__module__}."
        f"{cls.__qualname__}: the service cannot build it; give the class a "
        f"classmethod from_service(service, root) returning a ServingBackend"
    )


def _write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


@dataclass
class Deployment:
    """What the manager keeps in memory of one deployment."""

    row: dict  # as of the last loop pass (the endpoint's per-call lookup, off the database)
    ready: int = 0
    token: str | None = None
    traffic: RequestStats = field(default_factory=RequestStats)


class DeploymentManager:
    def __init__(self, service, serving: ServingBackend | None = None):
        self.service = service
        self.ledger = service.ledger
        self.store = DeploymentStore(service.ledger.engine)
        self.serving = serving if serving is not None else serving_backend(service)
        self.proxy = EndpointProxy()
        self._deps: dict[str, Deployment] = {}
        self._by_name: dict[tuple[str, str], str] = {}  # (user, name) -> id
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        #: Deployments whose slices are being freed by preemption (not launched yet).
        self.waiting: set[str] = set()
        # The job loop places claims holding its own lock: launch in a task of ours,
        # so the two managers' locks are never taken in opposite orders.
        service.jobs.preemptor.on_placed["deployment"] = self._on_claim_placed

    def _record(self, row: dict) -> Deployment:
        rec = self._deps.get(row["id"])
        if rec is None:
            rec = self._deps[row["id"]] = Deployment(row)
        rec.row = row
        self._by_name[(row["user"], row["name"])] = row["id"]
        return rec

    def _drop(self, dep_id: str) -> None:
        rec = self._deps.pop(dep_id, None)
        if rec is not None and self._by_name.get((rec.row["user"], rec.row["name"])) == dep_id:
            del self._by_name[(rec.row["user"], rec.row["name"])]
        self.serving.forget(dep_id)

    # -- reading -------------------------------------------------------------------
    def path(self, dep: dict) -> str:
        return f"{self.service.prefix.rstrip('/')}/endpoints/{dep['user']}/{dep['name']}"

    def view(self, dep: dict) -> dict:
        rec = self._deps.get(dep["id"]) or Deployment(dep)
        out = dict(dep)
        out["path"] = self.path(dep)
        out["replicas_ready"] = rec.ready
        try:
            with open(os.path.join(self.serving.model_dir(dep["id"]), "model.json")) as f:
                card = json.load(f)
            out["model"] = {k: card.get(k) for k in ("name", "inputs", "outputs", "max_batch_size")}
        except (OSError, ValueError):
            out["model"] = None
        out.update(rec.traffic.view())
        out["gpus"] = [r["gpu_uuid"] for r in self._rows(dep)]
        return out

    def _owners(self, dep: dict) -> list[str]:
        return [f"{dep['id']}/{r}" for r in range(dep["replicas"])]

    def _rows(self, dep: dict) -> list[dict]:
        return [
            r for o in self._owners(dep) for r in self.ledger.list(owner_kind="deployment", owner=o)
        ]

    def can_use(self, who, dep: dict) -> bool:
        """Owner, admins, and those it is shared with (by name or group)."""
        return (
            who.can_act_for(dep["user"])
            or who.name in dep["share_users"]
            or bool(who.groups & set(dep["share_groups"]))
        )

    async def logs(self, dep: dict, replica: int) -> str:
        """The end of one replica's log (its pod's, on Kubernetes)."""
        return await self.serving.logs(dep, replica, LOG_BYTES)

    # -- creating ------------------------------------------------------------------
    def check_may_deploy(self, who) -> None:
        """What can be refused before a byte of the upload is read."""
        if who.kind != "user":
            raise DeployRefused(403, "deployments are made by users (with a user's token)")
        cap = self.service.max_user_deployments
        held = len(self.store.list(user=who.name))
        if held >= cap:
            raise DeployRefused(
                403,
                f"you have {held} deployment(s), the most one user may "
                f"have ({cap}); stop one first (%deploy --stop NAME)",
            )

    async def create(self, who, settings: dict, model_tar: str) -> dict:
        """``model_tar``: the path of the uploaded archive (the caller removes it)."""
        self.check_may_deploy(who)
        dep = check_create(self.service, who.name, settings)
        name = dep["name"]
        if self.store.find(who.name, name):
            raise DeployRefused(
                409,
                f"you already have a deployment {name!r}; stop it first "
                f"(%deploy --stop {name}) or pick another name",
            )
        dep_id = uuid.uuid4().hex[:12]
        model_dir = self.serving.prepare(dep_id)
        added = False
        try:
            try:
                # Decompressing can take seconds: off the event loop, so others are answered.
                card = await asyncio.get_running_loop().run_in_executor(
                    None,
                    unpack_model,
                    model_tar,
                    model_dir,
                    self.service.max_model_mib * 2**20,
                    "max_model_mib",
                )
            except ArchiveRefused as e:
                raise DeployRefused(e.status, str(e)) from None
            check_batch(dep, card)
            card["name"] = name  # the endpoint's model is called by the deployment's name
            await asyncio.to_thread(_write_json, os.path.join(model_dir, "model.json"), card)
            async with self._lock:
                row, rows = await self._admit(who, dep_id, dep)
                added = True
                rec = self._record(row)
                if rows is None:  # batch jobs are stopping to make room: launched then
                    return self.view(self.store.get(dep_id))
                await self.serving.launch(row, rows)
        except BaseException:
            if not added:
                self.serving.remove(dep_id)
            raise
        rec.traffic.update(await self.serving.stats(row))
        log.info(
            "Deployment %s/%s (%s): %d replica(s) x %d milli-GPU",
            who.name,
            name,
            dep_id,
            dep["replicas"],
            dep["gpu_milli"],
        )
        return self.view(self.store.get(dep_id))

    async def _admit(self, who, dep_id: str, dep: dict) -> tuple[dict, list[dict]]:
        """Store the deployment and place its slices, or neither."""
        self.check_may_deploy(who)  # again: another upload may have finished first
        try:
            row = self.store.add({"id": dep_id, "user": who.name, **dep})
        except NameTaken:
            raise DeployRefused(409, f"you already have a deployment {dep['name']!r}") from None
        members = [(o, dep["gpu_milli"]) for o in self._owners(row)]
        try:
            rows = await self.ledger.aio.allocate_gang(
                who.name, "deployment", members, await self.service.groups_of(who.name)
            )
        except NoCapacity as e:
            claim = await self.service.jobs.make_room(who.name, "deployment", members)
            if claim is None:
                self.store.remove(dep_id)
                raise DeployRefused(409, str(e)) from None
            self.waiting.add(dep_id)
            self.store.update(dep_id, message=claim.message())
            return self.store.get(dep_id), None
        except (QuotaExceeded, OwnerConflict) as e:
            self.store.remove(dep_id)
            raise DeployRefused(403 if isinstance(e, QuotaExceeded) else 409, str(e)) from None
        return row, rows

    async def _on_claim_placed(self, claim, rows: list[dict]) -> None:
        self._spawn(self.claim_placed(claim, rows))

    async def claim_placed(self, claim, rows: list[dict]) -> None:
        """The slices preemption freed for a waiting deployment are placed: launch it."""
        dep_id = claim.members[0][0].split("/", 1)[0]
        async with self._lock:
            self.waiting.discard(dep_id)
            row = self.store.get(dep_id)
            if row is None or row["state"] == "failed":  # stopped while it waited
                for owner, _ in claim.members:
                    await self.ledger.aio.release("deployment", owner)
                return
            self.store.update(dep_id, message="starting replicas")
            await self.serving.launch(self.store.get(dep_id), rows)
            self._record(self.store.get(dep_id))

    # -- changing and stopping -----------------------------------------------------
    def share(self, dep: dict, body: dict) -> dict:
        values = check_patch(body)
        if values:
            self.store.update(dep["id"], **values)
        dep = self.store.get(dep["id"])
        self._record(dep)  # who may call it changes now
        return self.view(dep)

    async def stop_deployment(self, dep: dict, reason: str) -> dict:
        """Stop every replica, release the slices, forget the deployment."""
        async with self._lock:
            self.waiting.discard(dep["id"])
            await self.serving.stop(dep)
            released = sum(
                [len(await self.ledger.aio.release("deployment", o)) for o in self._owners(dep)]
            )
            self.store.remove(dep["id"])
            self.serving.remove(dep["id"])
            self._drop(dep["id"])
        log.info(
            "Deployment %s/%s stopped (%s); released %d slice(s)",
            dep["user"],
            dep["name"],
            reason,
            released,
        )
        return {
            **dep,
            "state": "stopped",
            "message": reason,
            "replicas_ready": 0,
            "path": self.path(dep),
        }

    async def server_stopped(self, owner: str) -> None:
        """The hub stopped a server: stop its user's deployments that asked to follow it."""
        user, _, server_name = owner.partition("/")
        if server_name:  # only the default server stands for its user
            return
        for dep in self.store.list(user=user):
            if dep["stop_with_server"]:
                await self.stop_deployment(dep, f"{user}'s server stopped")

    # -- routing ---------------------------------------------------------------------
    def ready_urls(self, dep: dict) -> list[str]:
        return self.serving.ready_urls(dep)

    def token(self, dep: dict) -> str:
        rec = self._deps.get(dep["id"]) or self._record(dep)
        if rec.token is None:
            rec.token = self.serving.token(dep["id"])
        return rec.token

    def endpoint(self, user: str, name: str) -> dict | None:
        """The deployment an endpoint call names (as of the last second), or None."""
        dep_id = self._by_name.get((user, name))
        if dep_id is not None:
            return self._deps[dep_id].row
        dep = self.store.find(user, name)
        if dep is not None:
            self._record(dep)
        return dep

    async def forward(self, dep: dict, method: str, path: str, headers: dict, body: bytes | None):
        """One call to a ready replica: ``(status, reason, headers, body)``, or None."""
        return await self.proxy.forward(
            self.ready_urls(dep), self.token(dep), method, path, headers, body
        )

    # -- the loop --------------------------------------------------------------------
    async def start(self) -> None:
        """After a (re)start: clear cut-short uploads, drop slices of deployments that no
        longer exist, adopt the replicas of the rest, then keep them running."""
        shutil.rmtree(upload_spool(self.service), ignore_errors=True)  # none in flight yet
        deps = self.store.list()
        owners = {o for d in deps if d["state"] != "failed" for o in self._owners(d)}
        for row in await self.ledger.aio.reconcile("deployment", owners):
            log.warning("Released slice %s of a deployment that no longer exists", row["owner"])
        for dep in deps:
            rec = self._record(dep)
            if dep["state"] == "failed":
                continue
            if not self._rows(dep) and dep["gpu_milli"]:
                if self.service.jobs.preemptor.pending("deployment", self._owners(dep)[0]):
                    self.waiting.add(dep["id"])  # still being made room for
                else:
                    self.store.update(
                        dep["id"],
                        state="failed",
                        message="its GPUs were not freed before the service restarted; "
                        "deploy it again",
                    )
                continue
            try:
                # Idempotent: what a crash between placing and launching left out goes now.
                await self.serving.adopt(dep, self._rows(dep))
                rec.traffic.update(await self.serving.stats(dep))
            except Exception:
                log.exception("Adopting the replicas of deployment %s", dep["id"])
        self._spawn(self.loop())

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """The service stops: cancel every task started here and close connections. The
        replicas keep running; the next service adopts them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.proxy.close()
        await self.serving.close()

    async def loop(self) -> None:
        last_stats = 0.0
        while True:
            try:
                async with self._lock:
                    deps = self.store.list()
                    for gone in set(self._deps) - {d["id"] for d in deps}:
                        self._drop(gone)
                    for dep in deps:
                        self._record(dep)
                        if dep["state"] != "failed" and dep["id"] not in self.waiting:
                            await self._check(dep)
                if time.monotonic() - last_stats > STATS_EVERY_S:
                    last_stats = time.monotonic()
                    for dep in self.store.list():
                        self._record(dep).traffic.update(await self.serving.stats(dep))
            except Exception:  # the loop must outlive one bad deployment
                log.exception("deployment loop")
            await asyncio.sleep(TICK_S)

    async def _check(self, dep: dict) -> None:
        health = await self.serving.check(dep)
        rec = self._deps[dep["id"]]
        rec.ready = health.ready
        if health.state == "failed":
            await self.serving.stop(dep)
            rec.ready = 0
            for o in self._owners(dep):
                await self.ledger.aio.release("deployment", o)
            self.store.update(
                dep["id"], state="failed", message=health.message, restarts=health.restarts
            )
            return
        changes = {
            k: v
            for k, v in (
                ("state", health.state),
                ("message", health.message),
                ("restarts", health.restarts),
            )
            if dep[k] != v
        }
        if changes:
            self.store.update(dep["id"], **changes)
            dep.update(changes)
