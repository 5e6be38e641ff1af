"""The deployment manager: model endpoints placed by the ledger, run by a serving backend.

A deployment is what callers name (``<owner>/<name>``); it has one or two
*versions* (a stable one and a canary), each a model directory and a number of
replicas that the autoscaler (:mod:`gpulab.service.endpoints.scaling`) moves between the
deployment's ``min_replicas`` and ``max_replicas``. Each replica holds a slice
(ledger owner ``<version id>/<replica>``, kind ``deployment``). Where the
replicas run is the serving backend's business (:mod:`gpulab.backend.serving_base`:
processes on this machine, or Deployments on Kubernetes); it gets one version at
a time, as a *unit* dict (:func:`.live.serving_unit`). One loop (every
second) asks the backend how each version is, writes it to the tables and lets
the autoscaler act; a version that fails gives its slices back. Replicas
outlive a restart of the service, which adopts them again in
:meth:`DeploymentManager.start`.

The manager is built of parts, each given what it works with: what is kept in
memory of each endpoint (:mod:`.live`), calls from clients (:mod:`.calls`), a
version's replicas placed and stopped (:mod:`.placement`), the autoscaler's steps
(:mod:`.scaling`), versions (canary, promote, rollback: :mod:`.versions`).
Checking what clients send lives in :mod:`.settings`; where a version's model came
from (its job, its quantization) in :mod:`.lineage`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from collections.abc import Awaitable, Callable

from gpulab.backend.serving_base import ServingBackend
from gpulab.db import clock as gpulab_clock
from gpulab.db.deployments import DeploymentStore, NameTaken
from gpulab.db.llm_usage import TokenUsageStore
from gpulab.scheduler.slices import plural
from gpulab.service.auth import Identity
from gpulab.service.endpoints.calls import LiveCalls
from gpulab.service.endpoints.lineage import resolve as resolve_lineage
from gpulab.service.endpoints.lineage import version_lineage
from gpulab.service.endpoints.live import (
    LiveEndpoints,
    Unit,
    replica_owners,
    serving_unit,
)
from gpulab.service.endpoints.openai_gateway import CAUSAL_LM_KIND, OpenAIGateway
from gpulab.service.endpoints.placement import VersionPlacement
from gpulab.service.endpoints.proxy import EndpointProxy
from gpulab.service.endpoints.router import EndpointRouter, RouterAddress
from gpulab.service.endpoints.scaling import Scaling
from gpulab.service.endpoints.settings import (
    DeployRefused,
    EndpointLimits,
    check_create,
    check_patch,
)
from gpulab.service.endpoints.standby import StandbyProcess
from gpulab.service.endpoints.table import EndpointTable
from gpulab.service.endpoints.token_meter import LlmLimits, TokenMeter
from gpulab.service.endpoints.traffic import quantile_ms
from gpulab.service.endpoints.versions import Versions
from gpulab.service.jobs.cpu_quota import CpuQuota
from gpulab.service.plugins import build
from gpulab.service.tasks import KeptTask, TaskSet, wait_for_wake

log = logging.getLogger("gpulab.service.endpoints.manager")

TICK_S = 1.0
LOG_BYTES = 256 * 1024

__all__ = ["DeployRefused", "DeploymentManager", "serving_backend"]


def upload_spool(data_dir: str) -> str:
    """Where model uploads are written while they arrive (private to the service)."""
    return os.path.join(data_dir, "uploads")


def serving_backend(service) -> ServingBackend:
    """The backend ``c.GpuLabService.serving_backend_class`` names (processes on this
    machine by default; Kubernetes with
    :class:`~gpulab.backend.kubernetes.serving_settings.KubernetesServingSettings`,
    or where the deprecated ``c.GpuLabService.kubernetes_deployments`` is set), built
    the one way (:func:`gpulab.service.plugins.build`)."""
    from gpulab.backend.kubernetes.serving import KubernetesServing

    legacy = dict(service.kubernetes_deployments)  # it selected the class at init
    cls, gpus = service.serving_backend_class, service.gpus
    serving = service.site_pools.serving()
    if serving is not None:  # the pool endpoints run in, and its GPUs
        cls, gpus = serving.serving, serving.gpus
    return build(
        cls,
        service,
        root=os.path.join(service.data_dir, "deployments"),
        gpus=gpus,
        shortcut=("kubernetes_deployments", legacy) if issubclass(cls, KubernetesServing) else None,
    )


class DeploymentManager:
    """Endpoints: their versions, replicas (on ``serving``), scaling, and calls
    through the router. Built from the parts it works with (:meth:`of` names them
    from the service's)."""

    def __init__(
        self,
        *,
        ledger,
        engine,
        serving: ServingBackend,
        preemption,
        groups_of: Callable[[str], Awaitable[dict[str, set[str]]]],
        identify: Callable[[dict], Awaitable[Identity]],
        over_quota: Callable[[str, int, int, str], str | None],
        limits: EndpointLimits,
        prefix: str,
        data_dir: str,
        max_upload_mib: int,
        router_address: RouterAddress,
        job_facts: Callable[[str], dict | None] | None = None,
        meter: TokenMeter | None = None,
    ):
        # Endpoints are placed on the GPUs of the pool they run in.
        self.ledger = ledger
        self.store = DeploymentStore(engine)
        self.serving = serving
        self.preemption = preemption
        self.over_quota = over_quota
        self.limits = limits
        self.prefix = prefix
        self.data_dir = data_dir
        self.max_upload_mib = max_upload_mib
        #: A job's id -> its owner, code hash and datasets (a version's lineage), or None.
        self.job_facts = job_facts
        self.live = LiveEndpoints(
            self.store, serving, gpu_delay_floor_s=limits.min_gpu_scale_down_delay_s
        )
        self._tasks = TaskSet()
        self.placement = VersionPlacement(
            self.store, ledger, serving, preemption, groups_of, limits
        )
        self.calls = LiveCalls(self.live, serving, limits, EndpointProxy())
        #: The OpenAI-compatible gateway (``<prefix>v1``) over the same calls.
        self.gateway = OpenAIGateway(self.calls, meter or TokenMeter(LlmLimits()))
        self.scaling = Scaling(self.live, ledger, serving, preemption, groups_of, self._tasks.spawn)
        self.versions = Versions(self.live, self.placement, limits, self._tasks.spawn)
        self.router = EndpointRouter(
            self.calls,
            prefix=prefix,
            max_upload_mib=max_upload_mib,
            identify=identify,
            address=router_address,
            gateway=self.gateway,
        )
        #: The endpoint table and the standby router that answers from it while this
        #: service is down (:mod:`gpulab.service.endpoints.standby`); None: no standby.
        self.table: EndpointTable | None = None
        self.standby: StandbyProcess | None = None
        self._loop = KeptTask("gpulab-deployments", self.loop)
        #: Deployments being stopped (their replicas outside the lock): done when gone.
        self._stopping: dict[str, asyncio.Future] = {}
        # The job loop places claims holding its own lock: launch in a task of ours,
        # so the two managers' locks are never taken in opposite orders.
        preemption.on_placed["deployment"] = self._on_claim_placed

    @classmethod
    def of(cls, service) -> DeploymentManager:
        """The service's deployment manager, from its settings and parts; its serving
        backend is built here, so bad settings stop the start."""
        return cls(
            ledger=service.ledger_for("deployment"),
            engine=service.ledger.engine,
            serving=serving_backend(service),
            preemption=service.preemption,
            groups_of=service.hub_groups.groups_of,
            identify=service.identify,
            over_quota=CpuQuota.of(service).over,
            limits=EndpointLimits(
                slice_sizes=tuple(service.inventory_settings.slice_sizes),
                max_deployment_replicas=service.endpoint_settings.max_deployment_replicas,
                max_user_deployments=service.endpoint_settings.max_user_deployments,
                max_model_mib=service.endpoint_settings.max_model_mib,
                model_storage_quota_mib=service.endpoint_settings.model_storage_quota_mib,
                cold_start_seconds=service.endpoint_settings.endpoint_cold_start_seconds,
                stop_with_server=service.endpoint_settings.deployments_stop_with_server,
                local=service.serving_backend_class.name == "local",
                min_gpu_scale_down_delay_s=service.endpoint_settings.min_gpu_scale_down_delay_s,
            ),
            prefix=service.prefix,
            data_dir=service.data_dir,
            max_upload_mib=service.max_upload_mib,
            router_address=RouterAddress(
                proxy_api_url=service.endpoint_settings.proxy_api_url,
                ip=service.endpoint_settings.endpoint_router_ip,
                port=service.endpoint_settings.endpoint_router_port,
                url=service.endpoint_settings.endpoint_router_url,
            ),
            job_facts=service.jobs.lineage_of,  # built before this manager
            meter=TokenMeter(
                service.llm_settings.llm_limits(),
                store=TokenUsageStore(service.ledger.engine),
                threads=service.db_threads,
            ),
        )

    # -- reading -----------------------------------------------------------------------
    def path(self, dep: dict) -> str:
        return f"{self.prefix.rstrip('/')}/endpoints/{dep['user']}/{dep['name']}"

    def card(self, version_id: str) -> dict | None:
        try:
            with open(os.path.join(self.serving.model_dir(version_id), "model.json")) as f:
                card = json.load(f)
        except (OSError, ValueError):
            return None
        out = {k: card.get(k) for k in ("name", "inputs", "outputs", "max_batch_size")}
        out["kind"] = card.get("kind") or "torch-export"
        return out

    def view(self, dep: dict) -> dict:
        rec = self.live.record(dep)  # the versions as stored now (a claim's message, a promotion)
        units = rec.by_version()
        versions = [self._version_view(dep, u) for u in units]
        stable = versions[0] if versions else None
        out = dict(dep)
        out["path"] = self.path(dep)
        out["min_replicas"] = dep["replicas"]
        out["replicas"] = sum(v["replicas"] for v in versions)
        out["replicas_ready"] = sum(v["replicas_ready"] for v in versions)
        out["restarts"] = sum(v["restarts"] for v in versions)
        if stable is not None and dep["state"] != "failed":
            out["state"], out["message"] = stable["state"], stable["message"]
        out["model"] = stable["model"] if stable else None
        #: What the endpoint serves ("causal-lm", "sentence-embedding", "torch-export"...).
        out["model_kind"] = (out["model"] or {}).get("kind")
        if out["model_kind"] == CAUSAL_LM_KIND:
            # What %deploy --list shows of a language model.
            engines = [self.gateway.engines.get(u.row["id"]) for u in units]
            out["engine"] = next((e for e in engines if e), None)
            out["tokens_per_second"] = self.gateway.meter.tokens_per_second(dep["id"])
        windows = [u.traffic.window() for u in units]
        merged: dict[float, float] = {}
        for w in windows:
            for le, n in w["cumulative"].items():
                merged[le] = merged.get(le, 0) + n
        out["requests_total"] = sum(u.traffic.calls_total for u in units)
        out["requests_per_second"] = sum(w["requests_per_second"] for w in windows)
        out["p99_latency_ms"] = quantile_ms(merged, 0.99) if merged else None
        out["gpus"] = [r["gpu_uuid"] for u in units for r in self.placement.rows(u.row)]
        out["versions"] = versions
        return out

    def _version_view(self, dep: dict, unit: Unit) -> dict:
        v = unit.row
        window = unit.traffic.window()
        message = v["message"]
        if unit.blocked and v["state"] != "failed":
            message = f"{message}; {unit.blocked}"
        return {
            "version": v["version"],
            "weight": v["weight"],
            "state": v["state"],
            "message": message,
            "replicas": v["replicas"],
            "replicas_ready": unit.ready if v["state"] != "failed" else 0,
            "inflight": unit.traffic.busy(),
            "gpu_milli": v["gpu_milli"],
            "max_batch_size": v["max_batch_size"],
            "max_latency_ms": v["max_latency_ms"],
            "max_queue": v["max_queue"],
            "restarts": v["restarts"],
            "created": v["created"],
            "model": self.card(v["id"]),
            "requests_total": unit.traffic.calls_total,
            "errors_total": unit.traffic.errors_total,
            "requests_per_second": window["requests_per_second"],
            "error_rate": window["error_rate"],
            "p99_latency_ms": window["p99_latency_ms"],
            "cold_starts": unit.cold_starts,
            "last_cold_start_s": unit.last_cold_start_s,
            "lineage": version_lineage(dep, v),
        }

    def units_traffic(self) -> list[dict]:
        """Every version's calls now, for the metrics (ids only)."""
        return [
            {
                "deployment": rec.row["id"],
                "version": unit.row["version"],
                "unit": unit.row["id"],
                "inflight": unit.traffic.busy(),
                "replicas": unit.row["replicas"],
                "calls": unit.traffic.calls_total,
                "errors": unit.traffic.errors_total,
            }
            for rec, unit in self.live.units()
        ]

    def find_version(self, dep: dict, number: int | None) -> dict:
        """A version row by number (None: the stable one, the oldest); DeployRefused
        404 when there is no such version (none: the deployment is being stopped)."""
        versions = self.store.versions(dep["id"])
        if not versions:
            raise DeployRefused(
                404, f"{dep['name']} has no version now; it is being stopped or replaced"
            )
        if number is None:
            return versions[0]
        for v in versions:
            if v["version"] == number:
                return v
        raise DeployRefused(
            404,
            f"{dep['name']} has no version {number}; it has "
            f"{', '.join(str(v['version']) for v in versions)}",
        )

    async def logs(self, dep: dict, vrow: dict, replica: int) -> str:
        """The end of one replica's log (its pod's, on Kubernetes)."""
        return await self.serving.logs(serving_unit(dep, vrow), replica, LOG_BYTES)

    # -- creating ------------------------------------------------------------------
    def check_may_deploy(self, who) -> None:
        """What can be refused before a byte of the upload is read."""
        if who.kind != "user":
            raise DeployRefused(403, "deployments are made by users (with a user's token)")

    def _check_count(self, who) -> None:
        cap = self.limits.max_user_deployments
        held = len(self.store.list(user=who.name))
        if held >= cap:
            raise DeployRefused(
                403,
                f"you have {plural(held, 'deployment')}, the most one user may "
                f"have ({cap}); stop one first (%deploy --stop NAME)",
            )

    async def create(self, who, settings: dict, model_tar: str) -> dict:
        """A new deployment, or a canary version of one (``canary`` in ``settings``).
        ``model_tar``: the path of the uploaded archive (the caller removes it)."""
        self.check_may_deploy(who)
        settings = dict(settings)
        # Where the model came from, checked before a byte of it is unpacked.
        lineage = resolve_lineage(settings.pop("lineage", None), who, self.job_facts)
        if "canary" in settings:
            return self.view(await self.versions.add_canary(who, settings, model_tar, lineage))
        self._check_count(who)
        dep = check_create(self.limits, who.name, settings, self.over_quota)
        name = dep["name"]
        if self.store.find(who.name, name):
            raise DeployRefused(
                409,
                f"you already have a deployment {name!r}; stop it first "
                f"(%deploy --stop {name}), pick another name, or add a new "
                f"version beside it (%deploy ... --canary PERCENT)",
            )
        dep_id = uuid.uuid4().hex[:12]
        await self.placement.unpack(who.name, dep_id, model_tar, dep)
        try:
            async with self.live.lock:
                self._check_count(who)  # again: another upload may have finished first
                try:
                    row = self.store.add({"id": dep_id, "user": who.name, **dep}, lineage=lineage)
                except NameTaken:
                    raise DeployRefused(409, f"you already have a deployment {name!r}") from None
                rec = self.live.record(row)
                try:
                    await self.placement.place_new(row, rec.units[dep_id].row)
                except DeployRefused:
                    self.store.remove(dep_id)
                    self.live.drop(dep_id)
                    raise
        except BaseException:
            if self.store.get(dep_id) is None:
                self.placement.remove(dep_id)
            raise
        log.info(
            "Deployment %s/%s (%s): %d..%d replica(s) x %d milli-GPU",
            who.name,
            name,
            dep_id,
            dep["replicas"],
            dep["max_replicas"],
            dep["gpu_milli"],
        )
        return self.view(self.store.get(dep_id))

    async def _on_claim_placed(self, claim, rows: list[dict]) -> None:
        self._tasks.spawn(self.claim_placed(claim, rows))

    async def claim_placed(self, claim, rows: list[dict]) -> None:
        """The slices preemption freed are placed: launch the new version, or the
        replica the autoscaler was waiting for."""
        version_id = claim.members[0][0].split("/", 1)[0]
        async with self.live.lock:
            vrow = self.store.version(version_id)
            dep = self.store.get(vrow["deployment_id"]) if vrow else None
            if version_id in self.live.stopping or (
                vrow is not None and vrow["deployment_id"] in self.live.stopping_deployments
            ):
                dep = None  # being retired or stopped: not launched
            if version_id in self.placement.waiting:
                self.placement.waiting.discard(version_id)
                if dep is not None and vrow["state"] != "failed":
                    self.store.update_version(version_id, message="starting replicas")
                    await self.serving.launch(
                        serving_unit(dep, self.store.version(version_id)), rows
                    )
                    self.live.record(dep)
                    return
            elif dep is not None and await self.scaling.grow_with(dep, vrow, claim.members, rows):
                return
            for owner, _ in claim.members:  # stopped or scaled down while it waited
                await self.ledger.aio.release("deployment", owner)

    # -- changing and stopping -----------------------------------------------------
    def share(self, dep: dict, body: dict) -> dict:
        values = check_patch(body)
        if values:
            self.store.update(dep["id"], **values)
        dep = self.store.get(dep["id"])
        self.live.record(dep)  # who may call it changes now
        self.live.wake.set()  # and in the standby's table at the next pass
        return self.view(dep)

    async def stop_deployment(self, dep: dict, reason: str) -> dict:
        """Stop every replica of every version, release the slices, forget it.

        Marked stopping under the lock (calls, the loop and the autoscaler leave it be;
        a second stop waits for the first); its replicas, which may take their grace
        period to exit, are stopped after the lock is released, so nobody else's
        changes wait for them; its rows go once they are gone."""
        async with self.live.lock:
            done = self._stopping.get(dep["id"])
            if done is None:
                done = self._stopping[dep["id"]] = asyncio.get_running_loop().create_future()
                versions = self.store.versions(dep["id"])
                marked = {v["id"] for v in versions} - self.live.stopping  # not retiring
                self.live.stopping |= marked
                self.live.stopping_deployments.add(dep["id"])
                for vrow in versions:
                    self.placement.waiting.discard(vrow["id"])
                self.live.wake.set()  # out of the standby's table at the next pass
            else:
                versions = None
        if versions is None:
            await asyncio.shield(done)  # stopped by the first
        else:
            failed: BaseException | None = None
            try:
                released = sum(
                    await asyncio.gather(*(self.placement.stop(dep, v) for v in versions))
                )
                async with self.live.lock:
                    self.store.remove(dep["id"])
                    self.live.drop(dep["id"])
            except BaseException as e:
                failed = e
                raise
            finally:
                self.live.stopping -= marked
                self.live.stopping_deployments.discard(dep["id"])
                del self._stopping[dep["id"]]
                # A second stop waiting on this one is told how it went, not "stopped".
                if failed is None:
                    done.set_result(None)
                else:
                    done.set_exception(RuntimeError(f"stopping it failed: {failed!r}"))
                    done.exception()  # retrieved here: no warning when nobody waits
            self.live.wake.set()
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

    # -- the loop --------------------------------------------------------------------
    async def start(self) -> None:
        """After a (re)start: clear cut-short uploads, drop slices of versions that no
        longer exist, adopt the replicas of the rest, then keep them running."""
        shutil.rmtree(upload_spool(self.data_dir), ignore_errors=True)  # none in flight yet
        deps = {d["id"]: d for d in self.store.list()}
        versions = self.store.versions()
        owners = {
            o
            for v in versions
            if v["state"] != "failed" and v["deployment_id"] in deps
            for o in replica_owners(v)
        }
        for row in await self.ledger.aio.reconcile("deployment", owners):
            log.warning("Released slice %s of a replica that no longer exists", row["owner"])
        for dep in deps.values():
            self.live.record(dep, [v for v in versions if v["deployment_id"] == dep["id"]])
        for vrow in versions:
            dep = deps.get(vrow["deployment_id"])
            if dep is None or vrow["state"] == "failed" or vrow["replicas"] == 0:
                continue
            if not self.placement.rows(vrow) and vrow["gpu_milli"]:
                if self.preemption.pending("deployment", replica_owners(vrow)[0]):
                    self.placement.waiting.add(vrow["id"])  # still being made room for
                else:
                    self.store.update_version(
                        vrow["id"],
                        state="failed",
                        weight=0,
                        message="its GPUs were not freed before the service restarted; "
                        "deploy it again",
                    )
                continue
            try:
                # Idempotent: what a crash between placing and launching left out goes now.
                await self.serving.adopt(serving_unit(dep, vrow), self.placement.rows(vrow))
            except Exception:
                log.exception("Adopting the replicas of version %s", vrow["id"])
        self._loop.start()
        await self.router.start()
        # A standby takes over the router's socket if this process dies; not where the
        # proxy comes from elsewhere (Kubernetes) or the port is fixed (the next
        # service could not bind it).
        address = self.router.address
        if self.router.socket is not None and not (address.url or address.port):
            await self._start_standby()

    async def _start_standby(self) -> None:
        self.table = EndpointTable(self.data_dir, self.prefix, self.max_upload_mib)
        self.standby = StandbyProcess(self.data_dir)
        try:
            await asyncio.to_thread(self.table.write, self.calls.endpoint_table())
            await asyncio.to_thread(self.standby.replace, os.getpid(), self.router.socket.fileno())
        except Exception:  # the service runs without one: endpoints stop with it, as before
            log.exception("Starting the standby endpoint router")

    async def suspend(self, grace_s: float) -> None:
        """The platform stops with its endpoints (``gpulab up``'s Ctrl-C): end the
        loop and stop every replica; the versions keep their slices and replica
        counts, so the next start launches them again."""
        async with self.live.lock:
            await self._loop.stop()
            units = [
                serving_unit(rec.row, unit.row)
                for rec in self.live.deps.values()
                for unit in rec.units.values()
                if unit.row["replicas"]
            ]
            await asyncio.gather(*(self.serving.suspend(u, grace_s) for u in units))
        if units:
            log.info("Stopped %d endpoint version(s) until gpulab's next start", len(units))

    async def stop(self) -> None:
        """The service stops: cancel every task started here and close connections. The
        replicas keep running; the next service adopts them."""
        if self.standby is not None:  # first: it would answer on our socket once we are gone
            await asyncio.to_thread(self.standby.stop)
        await self.router.stop()
        await self._loop.stop()
        await self._tasks.cancel()
        await self.calls.proxy.close()
        await self.serving.close()

    async def loop(self) -> None:
        while True:
            # Cleared before the pass: a wake during it starts the next one at once.
            self.live.wake.clear()
            try:
                async with self.live.lock:
                    await self._pass()
            except Exception:  # the loop must outlive one bad deployment
                log.exception("deployment loop")
            # Quicker while a call waits for a cold start: it is answered sooner.
            tick = 0.2 if self.live.cold_waiting() else TICK_S
            await wait_for_wake(self.live.wake, tick)

    async def _pass(self) -> None:
        deps = self.store.list()
        versions = self.store.versions()
        for gone in set(self.live.deps) - {d["id"] for d in deps}:
            self.live.drop(gone)
        now = gpulab_clock.monotonic()  # the autoscaler's time: a test may fake it
        for dep in deps:
            rec = self.live.record(dep, [v for v in versions if v["deployment_id"] == dep["id"]])
            if dep["id"] in self.live.stopping_deployments:
                continue  # its replicas are being stopped: none is checked or restarted
            for unit in rec.by_version():
                vrow = unit.row
                if (
                    vrow["state"] == "failed"
                    or vrow["id"] in self.placement.waiting
                    or vrow["id"] in self.live.stopping
                ):
                    continue
                await self._check(dep, unit)
                if unit.row["state"] != "failed":
                    self.scaling.autoscale(dep, unit, now)
            await self.versions.check_rollback(dep, rec)
        if self.table is not None:
            await asyncio.to_thread(self.table.write, self.calls.endpoint_table())

    async def _check(self, dep: dict, unit: Unit) -> None:
        vrow = unit.row
        cluster = self.serving.cluster_autoscales(serving_unit(dep, vrow))
        if vrow["replicas"] == 0 and not cluster:  # scaled to zero: nothing runs to ask
            unit.ready = 0
            unit.became_ready.clear()
            changes = {"state": "idle", "message": "scaled to zero; the next call starts a replica"}
        elif unit.scaling and unit.draining_from is not None:
            return  # replicas are being stopped; asked again once they are
        else:
            health = await self.serving.check(serving_unit(dep, vrow))
            unit.ready = min(health.ready, vrow["replicas"])
            if unit.ready:
                unit.became_ready.set()
                self.gateway.note_ready(dep, unit, self._tasks.spawn)
            else:
                unit.became_ready.clear()
            if health.state == "failed":
                await self.fail_version(dep, unit, health.message, health.restarts)
                return
            changes = {
                "state": health.state,
                "message": health.message,
                "restarts": health.restarts,
            }
            if cluster and health.replicas is not None and health.replicas != vrow["replicas"]:
                # The cluster's autoscaler decided: the ledger follows (best effort:
                # there the cluster's scheduler, not the ledger, places the pods).
                await self.scaling.follow_cluster(dep, vrow, health.replicas)
                changes["replicas"] = health.replicas
        changes = {k: v for k, v in changes.items() if vrow[k] != v}
        if changes:
            self.store.update_version(vrow["id"], **changes)
            vrow.update(changes)
            if vrow["version"] == min(
                u.row["version"] for u in self.live.deps[dep["id"]].units.values()
            ):
                mirror = {k: changes[k] for k in ("state", "message") if k in changes}
                if mirror:
                    self.store.update(dep["id"], **mirror)

    async def fail_version(self, dep: dict, unit: Unit, message: str, restarts: int) -> None:
        """A version's replicas keep crashing: send its calls to the other version (if
        there is one), then stop them and free their slices in a task of its own (the
        loop's lock is not held while they take their grace period to exit)."""
        vrow = unit.row
        unit.ready = 0
        unit.became_ready.clear()
        self.store.update_version(
            vrow["id"], state="failed", weight=0, message=message, restarts=restarts
        )
        vrow.update(state="failed", weight=0, message=message, restarts=restarts)
        self._tasks.spawn(self._stop_failed(serving_unit(dep, vrow)))
        others = [
            u
            for u in self.live.deps[dep["id"]].units.values()
            if u is not unit and u.row["state"] != "failed"
        ]
        if others:
            self.store.set_weights({others[0].row["id"]: 100})
            log.warning(
                "Deployment %s/%s: version %d failed; version %d takes every call",
                dep["user"],
                dep["name"],
                vrow["version"],
                others[0].row["version"],
            )
        else:
            self.store.update(dep["id"], state="failed", message=message, restarts=restarts)

    async def _stop_failed(self, unit: dict) -> None:
        """A failed version's replicas stopped, then its slices released (the loop no
        longer looks at it: it is failed). Cut short (the service stops), its slices stay
        held: the next start releases those of failed versions."""
        await self.serving.stop(unit)
        for owner in replica_owners(unit):
            await self.ledger.aio.release("deployment", owner)
