"""The deployment manager: model endpoints placed by the ledger, run as replicas.

A deployment is a model directory (uploaded by ``%deploy``), a number of
replicas, each holding a slice (ledger owner ``<deployment id>/<replica>``,
kind ``deployment``), and the batching settings of the model server. One loop
(every second) keeps the replicas true to the table: a replica whose process
is gone is started again (on a new port); one that keeps crashing fails the
deployment, which then gives its slices back. Replicas outlive a restart of
the service, which finds them again by pid; the loop's first pass is the
re-attachment.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import uuid

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpulab.backend.local_serving import LocalServing
from gpulab.db.deployments import DeploymentStore, NameTaken
from gpulab.scheduler.ledger import NoCapacity, OwnerConflict
from gpulab.scheduler.quota import QuotaExceeded
from gpulab.scheduler.slices import SliceError, parse_gpu_milli

from .cpu_quota import over_cpu_quota
from .model_archive import ArchiveRefused, unpack_model

log = logging.getLogger("gpulab.service.deployments")

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$")
_PRINCIPAL = re.compile(r"^[^/\s\x00]{1,255}$")
TICK_S = 1.0
STATS_EVERY_S = 5.0
#: A replica that dies this many times within CRASH_WINDOW_S fails its deployment.
MAX_CRASHES = 5
CRASH_WINDOW_S = 300.0
DEFAULT_MAX_BATCH = 32

#: What a client may set, with the defaults.
SETTINGS = {"name": None, "replicas": 1, "gpu_milli": 0, "max_batch_size": None,
            "max_latency_ms": 5.0, "max_queue": 256, "stop_with_server": None,
            "share_users": [], "share_groups": []}


class DeployRefused(Exception):
    """Create/change refused; ``status`` is the HTTP code to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _number(body: dict, key: str, lo: float, hi: float, kind=int):
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)) \
            or not lo <= v <= hi:
        raise DeployRefused(400, f"{key!r} must be {'an integer' if kind is int else 'a number'} "
                                 f"from {lo:g} to {hi:g}, got {v!r}")
    return kind(v)


def _names(body: dict, key: str) -> list[str]:
    v = body[key]
    if not isinstance(v, list) or not all(isinstance(x, str) and _PRINCIPAL.match(x) for x in v):
        raise DeployRefused(400, f"{key!r} must be a list of names")
    return sorted(set(v))


def check_sharing(body: dict) -> dict:
    """The sharing fields of a create or PATCH body, validated."""
    out = {}
    for key in ("share_users", "share_groups"):
        if key in body:
            out[key] = _names(body, key)
    if "stop_with_server" in body:
        if not isinstance(body["stop_with_server"], bool):
            raise DeployRefused(400, "'stop_with_server' must be true or false")
        out["stop_with_server"] = body["stop_with_server"]
    return out


class DeploymentManager:
    def __init__(self, service, serving: LocalServing | None = None):
        self.service = service
        self.ledger = service.ledger
        self.store = DeploymentStore(service.ledger.engine)
        root = os.path.join(service.data_dir, "deployments")
        if serving is None and service.kubernetes_deployments:
            from .kube_serving import kubernetes_serving

            serving = kubernetes_serving(service.kubernetes_deployments, root, service.gpus)
        real_gpus = any(not g.simulated for g in service.gpus)
        self.serving = serving or LocalServing(root, real_gpus=real_gpus,
                                               accounts=service.accounts,
                                               limits=service.account_limits,
                                               gpu_count=len(service.gpus))
        self._session: aiohttp.ClientSession | None = None
        self._tokens: dict[str, str] = {}
        # (user, name) -> deployment row, refreshed every loop pass: the endpoint's
        # per-request lookup, kept off the database.
        self._live: dict[tuple[str, str], dict] = {}
        self._lock = asyncio.Lock()
        self._ready: dict[tuple[str, int], int] = {}  # (dep id, replica) -> port answering ready
        self._crashes: dict[tuple[str, int], list[float]] = {}
        self._next: dict[str, int] = {}  # round-robin cursor per deployment
        self._urls: dict[str, list[str]] = {}  # managed replicas: the ready Service's URL
        self._managed_ready: dict[str, int] = {}
        self._stats: dict[str, dict] = {}
        self._scraped: dict[str, tuple[float, dict]] = {}

    # -- reading -------------------------------------------------------------------
    def path(self, dep: dict) -> str:
        return f"{self.service.prefix.rstrip('/')}/endpoints/{dep['user']}/{dep['name']}"

    def view(self, dep: dict) -> dict:
        out = dict(dep)
        out["path"] = self.path(dep)
        if self.serving.managed_restarts:
            out["replicas_ready"] = self._managed_ready.get(dep["id"], 0)
        else:
            out["replicas_ready"] = sum((dep["id"], r) in self._ready
                                        for r in range(dep["replicas"]))
        try:
            with open(os.path.join(self.serving.model_dir(dep["id"]), "model.json")) as f:
                card = json.load(f)
            out["model"] = {k: card.get(k) for k in ("name", "inputs", "outputs", "max_batch_size")}
        except (OSError, ValueError):
            out["model"] = None
        # Traffic comes from the replicas' own metrics; behind a Kubernetes Service
        # the service cannot ask each replica (Prometheus scrapes them there).
        stats = self._stats.get(dep["id"], {}) if not self.serving.managed_restarts else \
            {"requests_total": None, "requests_per_second": None}
        out["requests_total"] = stats.get("requests_total", 0)
        out["requests_per_second"] = stats.get("requests_per_second", 0.0)
        out["p99_latency_ms"] = stats.get("p99_latency_ms")
        out["gpus"] = [r["gpu_uuid"] for r in self._rows(dep)]
        return out

    def _owners(self, dep: dict) -> list[str]:
        return [f"{dep['id']}/{r}" for r in range(dep["replicas"])]

    def _rows(self, dep: dict) -> list[dict]:
        return [r for o in self._owners(dep)
                for r in self.ledger.list(owner_kind="deployment", owner=o)]

    def can_use(self, who, dep: dict) -> bool:
        """Owner, admins, and those it is shared with (by name or group)."""
        return (who.can_act_for(dep["user"]) or who.name in dep["share_users"]
                or bool(who.groups & set(dep["share_groups"])))

    # -- creating ------------------------------------------------------------------
    def check_may_deploy(self, who) -> None:
        """What can be refused before a byte of the upload is read."""
        if who.kind != "user":
            raise DeployRefused(403, "deployments are made by users (with a user's token)")
        cap = self.service.max_user_deployments
        held = len(self.store.list(user=who.name))
        if held >= cap:
            raise DeployRefused(403, f"you have {held} deployment(s), the most one user may "
                                     f"have ({cap}); stop one first (%deploy --stop NAME)")

    async def create(self, who, settings: dict, model_tar: str) -> dict:
        """``model_tar``: the path of the uploaded archive (the caller removes it)."""
        self.check_may_deploy(who)
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            raise DeployRefused(400, f"unknown field(s): {', '.join(sorted(unknown))}; "
                                     f"known: {', '.join(SETTINGS)}")
        body = {**SETTINGS, **settings}
        name = body["name"]
        if not isinstance(name, str) or not _NAME.match(name):
            raise DeployRefused(400, f"'name' must be 1-63 lower-case letters, digits, '.', '_' "
                                     f"or '-' (starting and ending with a letter or digit), "
                                     f"got {name!r}")
        cap = self.service.max_deployment_replicas
        if isinstance(body["replicas"], int) and body["replicas"] > cap:
            raise DeployRefused(400, f"'replicas' {body['replicas']} is more than the {cap} one "
                                     f"deployment may have; an admin can raise "
                                     f"c.GpuLabService.max_deployment_replicas")
        dep = {"name": name,
               "replicas": _number(body, "replicas", 1, cap),
               "max_batch_size": (None if body["max_batch_size"] is None
                                  else _number(body, "max_batch_size", 1, 4096)),
               "max_latency_ms": _number(body, "max_latency_ms", 0, 10_000, float),
               "max_queue": _number(body, "max_queue", 1, 100_000),
               "stop_with_server": self.service.deployments_stop_with_server,
               **check_sharing({k: body[k] for k in ("share_users", "share_groups",
                                                     "stop_with_server")
                                if body[k] is not None})}
        try:
            dep["gpu_milli"] = parse_gpu_milli(body["gpu_milli"], tuple(self.service.slice_sizes))
        except SliceError as e:
            raise DeployRefused(400, str(e)) from None
        if not dep["gpu_milli"]:
            reason = over_cpu_quota(self.service, who.name, dep["replicas"])
            if reason:
                raise DeployRefused(403, reason)
        if self.store.find(who.name, name):
            raise DeployRefused(409, f"you already have a deployment {name!r}; stop it first "
                                     f"(%deploy --stop {name}) or pick another name")

        dep_id = uuid.uuid4().hex[:12]
        model_dir = self.serving.prepare(dep_id)
        added = False
        try:
            try:
                # Decompressing can take seconds: off the event loop, so others are answered.
                card = await asyncio.get_running_loop().run_in_executor(
                    None, unpack_model, model_tar, model_dir,
                    self.service.max_model_mib * 2**20, "max_model_mib")
            except ArchiveRefused as e:
                raise DeployRefused(e.status, str(e)) from None
            if dep["max_batch_size"] is None:  # default: 32, or what the model takes
                dep["max_batch_size"] = min(DEFAULT_MAX_BATCH, card["max_batch_size"])
            if dep["max_batch_size"] > card["max_batch_size"]:
                raise DeployRefused(400, f"max_batch_size {dep['max_batch_size']} is above the "
                                         f"{card['max_batch_size']} rows the model was exported "
                                         f"for; lower it or export again with a larger one")
            # The endpoint's model is called by the deployment's name.
            card["name"] = name
            with open(os.path.join(model_dir, "model.json"), "w") as f:
                json.dump(card, f)
            async with self._lock:
                self.check_may_deploy(who)  # again: another upload may have finished first
                try:
                    row = self.store.add({"id": dep_id, "user": who.name, **dep})
                except NameTaken:
                    raise DeployRefused(409, f"you already have a deployment {name!r}") from None
                added = True
                try:
                    rows = self.ledger.allocate_gang(
                        who.name, "deployment",
                        [(o, dep["gpu_milli"]) for o in self._owners(row)],
                        await self.service.groups_of(who.name))
                except (NoCapacity, QuotaExceeded, OwnerConflict) as e:
                    self.store.remove(dep_id)
                    added = False
                    status = 403 if isinstance(e, QuotaExceeded) else 409
                    raise DeployRefused(status, str(e)) from None
                if self.serving.managed_restarts:
                    await self.serving.launch(row, rows)
                else:
                    self._start_all(row, rows)
        except BaseException:
            if not added:
                self.serving.remove(dep_id)
            raise
        log.info("Deployment %s/%s (%s): %d replica(s) x %d milli-GPU", who.name, name, dep_id,
                 dep["replicas"], dep["gpu_milli"])
        return self.view(self.store.get(dep_id))

    def _start_all(self, dep: dict, rows: list[dict]) -> None:
        for r in range(dep["replicas"]):
            try:
                self._start(dep, r, rows)
            except OSError:  # the loop launches it again
                log.exception("Launching replica %d of %s", r, dep["id"])

    def _start(self, dep: dict, replica: int, rows: list[dict] | None = None) -> None:
        rows = rows if rows is not None else self._rows(dep)
        gpu = next((a["gpu_uuid"] for a in rows if a["owner"] == f"{dep['id']}/{replica}"), None)
        self._ready.pop((dep["id"], replica), None)
        self.serving.start_replica(dep, replica, gpu)

    # -- changing and stopping -----------------------------------------------------
    def share(self, dep: dict, body: dict) -> dict:
        unknown = set(body) - {"share_users", "share_groups", "stop_with_server"}
        if unknown:
            raise DeployRefused(400, f"only share_users, share_groups and stop_with_server can "
                                     f"change; not {', '.join(sorted(unknown))}")
        values = check_sharing(body)
        if values:
            self.store.update(dep["id"], **values)
        dep = self.store.get(dep["id"])
        self._live[(dep["user"], dep["name"])] = dep  # who may call it changes now
        return self.view(dep)

    async def stop(self, dep: dict, reason: str) -> dict:
        """Stop every replica, release the slices, forget the deployment."""
        async with self._lock:
            await self.serving.stop(dep)
            released = sum(len(self.ledger.release("deployment", o)) for o in self._owners(dep))
            self.store.remove(dep["id"])
            self.serving.remove(dep["id"])
            self._forget(dep)
        log.info("Deployment %s/%s stopped (%s); released %d slice(s)", dep["user"], dep["name"],
                 reason, released)
        return {**dep, "state": "stopped", "message": reason, "replicas_ready": 0,
                "path": self.path(dep)}

    def _forget(self, dep: dict) -> None:
        self._live.pop((dep["user"], dep["name"]), None)
        self._tokens.pop(dep["id"], None)
        for r in range(dep["replicas"]):
            self._ready.pop((dep["id"], r), None)
            self._crashes.pop((dep["id"], r), None)
        for d in (self._next, self._stats, self._scraped, self._urls, self._managed_ready):
            d.pop(dep["id"], None)

    async def server_stopped(self, owner: str) -> None:
        """The hub stopped a server: stop its user's deployments that asked to follow it."""
        user, _, server_name = owner.partition("/")
        if server_name:  # only the default server stands for its user
            return
        for dep in self.store.list(user=user):
            if dep["stop_with_server"]:
                await self.stop(dep, f"{user}'s server stopped")

    # -- routing ---------------------------------------------------------------------
    def ready_urls(self, dep: dict) -> list[str]:
        """Base URLs of the ready replicas, rotated so calls spread over them (on
        Kubernetes: the Service, which spreads them itself)."""
        if self.serving.managed_restarts:
            return list(self._urls.get(dep["id"], []))
        urls = [f"http://127.0.0.1:{self._ready[(dep['id'], r)]}" for r in range(dep["replicas"])
                if (dep["id"], r) in self._ready]
        if not urls:
            return []
        i = self._next.get(dep["id"], 0) % len(urls)
        self._next[dep["id"]] = i + 1
        return urls[i:] + urls[:i]

    def token(self, dep: dict) -> str:
        if dep["id"] not in self._tokens:
            self._tokens[dep["id"]] = self.serving.token(dep["id"])
        return self._tokens[dep["id"]]

    def endpoint(self, user: str, name: str) -> dict | None:
        """The deployment an endpoint call names (as of the last second), or None."""
        dep = self._live.get((user, name))
        if dep is None:
            dep = self.store.find(user, name)
            if dep is not None:
                self._live[(user, name)] = dep
        return dep

    @property
    def session(self) -> aiohttp.ClientSession:
        # Kept-alive connections to the replicas: a new TCP connection per call
        # would cost more than the call. Bodies pass through as they are.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=512), auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=300))
        return self._session

    async def forward(self, dep: dict, method: str, path: str, headers: dict,
                      body: bytes | None):
        """Send one call to a ready replica (the next in turn; on a refused connection the
        one after): ``(status, reason, headers, body)``, or None when none answers."""
        headers = {**headers, "Authorization": f"Bearer {self.token(dep)}"}
        for base in self.ready_urls(dep):
            try:
                async with self.session.request(method, f"{base}/{path}",
                                                headers=headers, data=body) as resp:
                    return resp.status, resp.reason, resp.headers, await resp.read()
            except aiohttp.ClientConnectionError:
                continue  # that replica just went away; try the next
        return None

    # -- the loop --------------------------------------------------------------------
    async def start(self) -> None:
        """After a (re)start: drop slices of deployments that no longer exist, keep the rest."""
        deps = self.store.list()
        owners = {o for d in deps if d["state"] != "failed" for o in self._owners(d)}
        for row in self.ledger.reconcile("deployment", owners):
            log.warning("Released slice %s of a deployment that no longer exists", row["owner"])
        if self.serving.managed_restarts:
            # Idempotent: what a crash between placing and launching left out is sent now.
            for dep in deps:
                if dep["state"] != "failed":
                    try:
                        await self.serving.launch(dep, self._rows(dep))
                    except Exception:
                        log.exception("Re-applying the objects of deployment %s", dep["id"])
        asyncio.ensure_future(self.loop())

    async def loop(self) -> None:
        last_stats = 0.0
        while True:
            try:
                async with self._lock:
                    deps = self.store.list()
                    self._live = {(d["user"], d["name"]): d for d in deps}
                    for dep in deps:
                        if dep["state"] != "failed":
                            await self._check(dep)
                if time.monotonic() - last_stats > STATS_EVERY_S:
                    last_stats = time.monotonic()
                    await self._scrape_all()
            except Exception:  # the loop must outlive one bad deployment
                log.exception("deployment loop")
            await asyncio.sleep(TICK_S)

    async def _check(self, dep: dict) -> None:
        if self.serving.managed_restarts:
            await self._check_managed(dep)
            return
        down = []
        for r in range(dep["replicas"]):
            if self.serving.alive(dep["id"], r):
                if (dep["id"], r) not in self._ready:
                    await self._probe_ready(dep, r)
            else:
                down.append(r)
        for r in down:
            if self.serving.record(dep["id"], r) is None:
                self._start(dep, r)  # admitted but never launched (a crash in between)
                continue
            tail = self.serving.log_tail(dep["id"], r)
            code = self.serving.exit_code(dep["id"], r)
            now = time.monotonic()
            crashes = [t for t in self._crashes.get((dep["id"], r), []) if now - t < CRASH_WINDOW_S]
            crashes.append(now)
            self._crashes[(dep["id"], r)] = crashes
            self._ready.pop((dep["id"], r), None)
            what = f"replica {r} exited" + (f" with code {code}" if code is not None else "")
            if len(crashes) >= MAX_CRASHES:
                await self.serving.stop(dep)
                for i in range(dep["replicas"]):
                    self._ready.pop((dep["id"], i), None)
                for o in self._owners(dep):
                    self.ledger.release("deployment", o)
                self.store.update(dep["id"], state="failed",
                                  message=f"{what} ({len(crashes)} times in "
                                          f"{CRASH_WINDOW_S:g} s); slices released. "
                                          f"Last log: {tail}")
                log.warning("Deployment %s/%s failed: %s", dep["user"], dep["name"], tail)
                return
            log.warning("Deployment %s/%s: %s; restarting it. Log: %s", dep["user"],
                        dep["name"], what, tail)
            dep["restarts"] += 1
            dep["message"] = f"{what}; restarted it"
            self.store.update(dep["id"], restarts=dep["restarts"], message=dep["message"])
            self._start(dep, r)
        ready = sum((dep["id"], r) in self._ready for r in range(dep["replicas"]))
        state = ("running" if ready == dep["replicas"]
                 else "degraded" if dep["state"] != "starting" or down else "starting")
        if state != dep["state"]:
            message = dep["message"]
            if state == "running":
                message = f"{ready} replica(s) ready" + (
                    f"; {dep['restarts']} restart(s) so far" if dep["restarts"] else "")
            self.store.update(dep["id"], state=state, message=message)

    async def _check_managed(self, dep: dict) -> None:
        """Replicas Kubernetes keeps running: follow how many are ready."""
        ready = await self.serving.ready(dep)
        self._urls[dep["id"]] = [self.serving.url(dep)] if ready else []
        state = ("running" if ready >= dep["replicas"]
                 else "starting" if dep["state"] == "starting" else "degraded")
        message = (f"{ready} replica(s) ready" if state == "running"
                   else f"{ready} of {dep['replicas']} replica(s) ready")
        if (state, message) != (dep["state"], dep["message"]):
            self.store.update(dep["id"], state=state, message=message)
        self._managed_ready[dep["id"]] = ready

    async def _probe_ready(self, dep: dict, replica: int) -> None:
        rec = self.serving.record(dep["id"], replica)
        resp = await self._fetch(dep, rec["port"], "/v2/health/ready", timeout=2)
        if resp is not None and resp[0] == 200:
            self._ready[(dep["id"], replica)] = rec["port"]

    async def _fetch(self, dep: dict, port: int, path: str, timeout: float):
        """``(status, body)`` of a GET to one replica, or None if it does not answer."""
        try:
            async with self.session.get(
                    f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=timeout),
                    headers={"Authorization": f"Bearer {self.token(dep)}"}) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    # -- requests/s and p99 for the listing ------------------------------------------------
    async def _scrape_all(self) -> None:
        for dep in self.store.list():
            totals: dict = {"count": 0.0, "buckets": {}}
            for r in range(dep["replicas"]):
                port = self._ready.get((dep["id"], r))
                resp = port and await self._fetch(dep, port, "/metrics", timeout=2)
                if resp and resp[0] == 200:
                    _add_histogram(totals, resp[1].decode())
            now = time.monotonic()
            before_t, before = self._scraped.get(dep["id"], (None, None))
            self._scraped[dep["id"]] = (now, totals)
            stats = {"requests_total": int(totals["count"])}
            if before is not None and now > before_t:
                count = totals["count"] - before["count"]
                stats["requests_per_second"] = max(0.0, count) / (now - before_t)
                stats["p99_latency_ms"] = _quantile_ms(
                    {le: n - before["buckets"].get(le, 0) for le, n in totals["buckets"].items()},
                    0.99)
            self._stats[dep["id"]] = stats


def _add_histogram(totals: dict, text: str) -> None:
    """Add a replica's request-duration histogram (all models, all codes) to ``totals``."""
    for family in text_string_to_metric_families(text):
        if family.name != "gpulab_serving_request_duration_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                totals["buckets"][le] = totals["buckets"].get(le, 0) + s.value
            elif s.name.endswith("_count"):
                totals["count"] += s.value


def _quantile_ms(buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of cumulative ``le`` buckets, interpolated within its bucket as
    Prometheus' ``histogram_quantile`` does; in ms. None without observations."""
    total = buckets.get(float("inf"), 0)
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in sorted(buckets):
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower * 1000  # beyond the largest bound: report that bound
            inside = buckets[le] - below
            fraction = (rank - below) / inside if inside > 0 else 1.0
            return (lower + (le - lower) * fraction) * 1000
        lower, below = le, buckets[le]
    return None
