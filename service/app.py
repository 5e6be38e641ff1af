"""The gpulab service: a JupyterHub-managed tornado app holding the ledger.

The hub starts it (``python -m gpulab.service``) with the usual
``JUPYTERHUB_*`` variables and restarts it if it dies. Settings come from
``<data-dir>/gpulab_config.py``, the same file that overrides the hub's
configuration, e.g.::

    c.GpuLabService.default_user_quota_milli = 1000
    c.GpuLabService.group_quota_milli = {"students": 4000}
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import logging
import os
import socket
import sys
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Bool, Dict, Float, Int, List, Unicode, default
from traitlets.config import Application

from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.accounts import UserAccounts
from gpulab.db.engine import make_engine, utcnow
from gpulab.scheduler.inventory import Gpu, load_inventory
from gpulab.scheduler.ledger import Ledger
from gpulab.scheduler.policy import get_policy
from gpulab.scheduler.quota import Quotas
from gpulab.scheduler.slices import DEFAULT_SLICE_SIZES

from . import api, deployments_api, jobs_api, ledger_guard, pages, telemetry_api
from .auth import Identity
from .hubapi import HubAPI
from .metrics import Metrics
from .request_body import JSON_BODY_LIMIT

log = logging.getLogger("gpulab.service")

#: Group property that sets a group's quota in milli-GPU from the hub's admin page.
GROUP_QUOTA_PROPERTY = "gpulab_quota_milli"


class GpuLabService(Application):
    name = "gpulab-service"
    description = "The gpulab service: GPU inventory, slice allocations and quotas behind JupyterHub."

    data_dir = Unicode(
        help="""Where the service keeps its database. Set by `gpulab up --data-dir`.

        c.GpuLabService.data_dir = "/srv/gpulab"
        """,
    ).tag(config=True)

    @default("data_dir")
    def _data_dir(self):
        return os.environ.get("GPULAB_DATA_DIR", os.path.abspath(".gpulab"))

    db_url = Unicode(
        help="""SQLAlchemy URL of the ledger's database. Default: SQLite in the data dir.

        c.GpuLabService.db_url = "postgresql://gpulab:secret@db.example.org/gpulab"
        """,
    ).tag(config=True)

    @default("db_url")
    def _db_url(self):
        return os.environ.get("GPULAB_DB_URL") or f"sqlite:///{self.data_dir}/gpulab.sqlite"

    simulate_gpus = Unicode(
        help="""Declare GPUs on a machine without any (nothing is enforced on them).

        c.GpuLabService.simulate_gpus = "2xA100-80GB"
        """,
    ).tag(config=True)

    @default("simulate_gpus")
    def _simulate_gpus(self):
        return os.environ.get("GPULAB_SIMULATE_GPUS", "")

    node_name = Unicode(
        help="""Name of this node in the inventory. Default: the host name.

        c.GpuLabService.node_name = "gpu-node-1"
        """,
    ).tag(config=True)

    @default("node_name")
    def _node_name(self):
        return socket.gethostname()

    inventory_source = Unicode(
        "local",
        help="""Where GPUs come from: "local" (NVML, or simulate_gpus) or "kubernetes"
        (the cluster's nodes: allocatable GPUs, MIG resources, HAMi's registration).

        c.GpuLabService.inventory_source = "kubernetes"
        """,
    ).tag(config=True)

    kubernetes_node_selector = Unicode(
        "",
        help="""Label selector of the Kubernetes nodes whose GPUs are counted.

        c.GpuLabService.kubernetes_node_selector = "nvidia.com/gpu.present=true"
        """,
    ).tag(config=True)

    policy = Unicode(
        "gpulab",
        help="""Placement policy (see `gpulab.scheduler.policy.policy_names()`): gpulab's
        fragmentation-aware default, or best-fit, fgd, packing, dot-product, random.

        c.GpuLabService.policy = "best-fit"
        """,
    ).tag(config=True)

    slice_sizes = List(
        Int(),
        list(DEFAULT_SLICE_SIZES),
        help="""Slice sizes offered, in milli-GPU (250 = 1/4 GPU, 2000 = 2 GPUs).

        c.GpuLabService.slice_sizes = [0, 100, 250, 500, 1000, 2000, 4000]
        """,
    ).tag(config=True)

    default_user_quota_milli = Int(
        None,
        allow_none=True,
        help="""Milli-GPU each user may hold at once, unless set per user. None: unlimited.

        c.GpuLabService.default_user_quota_milli = 1000
        """,
    ).tag(config=True)

    user_quota_milli = Dict(
        help="""Per-user quotas in milli-GPU.

        c.GpuLabService.user_quota_milli = {"alice": 4000}
        """,
    ).tag(config=True)

    group_quota_milli = Dict(
        help="""Per-group quotas in milli-GPU (all members together). A hub group's
        property `gpulab_quota_milli` sets it too; this setting wins.

        c.GpuLabService.group_quota_milli = {"students": 2000}
        """,
    ).tag(config=True)

    reconcile_interval = Float(
        60.0,
        help="""Seconds between checks that every server allocation still has a server,
        and that every running server, job and deployment still holds its slice (what
        is found is logged and listed at GET /api/v1/ledger).

        c.GpuLabService.reconcile_interval = 30
        """,
    ).tag(config=True)

    authenticate_prometheus = Bool(
        True,
        help="""Require a hub token for /metrics (as JupyterHub does for its own).

        c.GpuLabService.authenticate_prometheus = False
        """,
    ).tag(config=True)

    local_sampler = Bool(
        True,
        help="""Sample this node's GPUs, NICs and dataset cache in the service itself
        (the embedded default). Turn off where `gpulab agent` runs on every node.

        c.GpuLabService.local_sampler = False
        """,
    ).tag(config=True)

    sample_interval = Float(
        1.0,
        help="""Seconds between local telemetry samples.

        c.GpuLabService.sample_interval = 2.0
        """,
    ).tag(config=True)

    kubernetes_jobs = Dict(
        help="""Run jobs submitted with backend "kubernetes" as Indexed Jobs (JobSets where
        installed) in this namespace; see gpulab.service.kube_jobs for every key.

        c.GpuLabService.kubernetes_jobs = {"namespace": "gpulab", "jobs_pvc": "gpulab-jobs",
                                           "enforcement": "hami", "queue": "gpulab-jobs"}
        """,
    ).tag(config=True)

    kubernetes_deployments = Dict(
        help="""Run `%deploy` endpoints as a Deployment + Service each in this namespace
        (instead of processes on the service's machine); see
        gpulab.service.kube_serving for every key.

        c.GpuLabService.kubernetes_deployments = {"namespace": "gpulab",
            "models_pvc": "gpulab-models", "image": "example.org/gpulab:1", "enforcement": "hami"}
        """,
    ).tag(config=True)

    deployments_stop_with_server = Bool(
        False,
        help="""Stop a user's deployments when their (default) server stops, unless the
        deployment says otherwise (`%deploy --stop-with-server` / `--keep-running`).

        c.GpuLabService.deployments_stop_with_server = True
        """,
    ).tag(config=True)

    max_upload_mib = Int(
        2048,
        help="""Largest request body the service takes, in MiB: a model uploaded by
        `%deploy` (as sent, compressed), or an inference request to an endpoint. Other
        routes take JSON bodies of at most 1 MiB (jobs: see max_job_vars_mib).

        c.GpuLabService.max_upload_mib = 8192
        """,
    ).tag(config=True)

    max_model_mib = Int(
        4096,
        help="""Largest model a `%deploy` upload may unpack to, in MiB (model.pt2 and
        model.json together, as the archive declares them). A small .tar.xz can expand to
        gigabytes; it is refused (413) before it is unpacked, and nothing is kept.

        c.GpuLabService.max_model_mib = 16384
        """,
    ).tag(config=True)

    max_deployment_replicas = Int(
        4,
        help="""Most replicas one deployment may ask for (`%deploy --replicas`).

        c.GpuLabService.max_deployment_replicas = 8
        """,
    ).tag(config=True)

    user_cpu_quota = Float(
        0.0,
        help="""CPU cores one user's CPU-only jobs and endpoints may hold at once (each of
        their processes counts c.AccountLimits.cpu_floor cores, queued jobs included).
        0: no CPU quota. GPU work is bounded by the milli-GPU quotas instead.

        c.GpuLabService.user_cpu_quota = 8
        """,
    ).tag(config=True)

    max_user_deployments = Int(
        5,
        help="""Most deployments one user may have at once (failed ones count until stopped).

        c.GpuLabService.max_user_deployments = 10
        """,
    ).tag(config=True)

    max_job_ranks = Int(
        64,
        help="""Most ranks one job may have (nodes x nproc_per_node), CPU-only jobs too:
        each rank is a process on a node of the cluster.

        c.GpuLabService.max_job_ranks = 256
        """,
    ).tag(config=True)

    max_job_vars_mib = Int(
        256,
        help="""Largest variables a job may carry, in MiB (the cloudpickle bytes of
        `%%train_distributed --vars`, before base64). Larger data belongs in a dataset
        the ranks read (the dataset cache), not in the request.

        c.GpuLabService.max_job_vars_mib = 1024
        """,
    ).tag(config=True)

    config_file = Unicode(
        help="Python config file to load. Default: <data-dir>/gpulab_config.py if it exists."
    ).tag(config=True)

    aliases = {"config": "GpuLabService.config_file", "db-url": "GpuLabService.db_url",
               "simulate-gpus": "GpuLabService.simulate_gpus"}

    def initialize(self, argv=None):
        super().initialize(argv)
        path = self.config_file or os.path.join(self.data_dir, "gpulab_config.py")
        if os.path.exists(path):
            self.load_config_file(path)
        logging.basicConfig(level=logging.INFO,
                            format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
        # What the service writes (databases, job and model files) is private
        # unless it says otherwise; users reach it through the API only.
        os.umask(0o077)
        os.makedirs(self.data_dir, exist_ok=True)
        #: Who users' job ranks and model replicas run as (c.UserAccounts settings).
        self.accounts = UserAccounts(config=self.config)
        #: Their CPU, memory and device limits (c.AccountLimits settings).
        self.account_limits = AccountLimits(config=self.config)
        if self.inventory_source == "kubernetes" and not self.simulate_gpus:
            from gpulab.scheduler.inventory_kube import load_cluster_inventory

            self.gpus, self.inventory_reason = asyncio.run(
                load_cluster_inventory(label_selector=self.kubernetes_node_selector))
        else:
            self.gpus, self.inventory_reason = load_inventory(self.simulate_gpus or None,
                                                              node=self.node_name)
        if self.inventory_reason:
            log.warning("No GPUs: %s. Only gpu_milli=0 can be placed.", self.inventory_reason)
        self.ledger = Ledger(make_engine(self.db_url), self.gpus, get_policy(self.policy),
                             Quotas(self.default_user_quota_milli, dict(self.user_quota_milli),
                                    dict(self.group_quota_milli)))
        self.hub = HubAPI(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])
        self.service_name = os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpulab")
        self.prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")
        self.metrics = Metrics(self)
        telemetry_api.setup(self)
        ledger_guard.setup(self)

    # -- identities and groups ---------------------------------------------------
    async def identify(self, model: dict) -> Identity:
        if model.get("kind") == "service":
            return Identity(model["name"], "service",
                            internal=model["name"] == self.service_name)
        user = await self.hub.user(model["name"]) or {}
        return Identity(model["name"], "user", admin=bool(user.get("admin")),
                        groups=frozenset(user.get("groups") or []))

    async def groups_of(self, user: str) -> dict[str, set[str]]:
        """The user's groups that carry a quota, with their members."""
        quotas = await self.group_quotas()
        found = {}
        for g in await self.hub.groups():
            if g["name"] in quotas and user in (g.get("users") or []):
                found[g["name"]] = set(g.get("users") or [])
        return found

    async def group_quotas(self) -> dict[str, int]:
        quotas: dict[str, int] = {}
        for g in await self.hub.groups():
            value = (g.get("properties") or {}).get(GROUP_QUOTA_PROPERTY)
            if isinstance(value, int) and not isinstance(value, bool):
                quotas[g["name"]] = value
        quotas.update(self.group_quota_milli)
        self.ledger.quotas.group_milli = quotas
        return quotas

    def inventory(self) -> dict:
        held = self.ledger.allocated_by_gpu()
        nodes: dict[str, list[dict]] = {}
        for gpu in self.gpus:
            nodes.setdefault(gpu.node, []).append(self._gpu_json(gpu, held))
        if not nodes:
            nodes[self.node_name] = []
        return {"nodes": [{"name": n, "gpus": g} for n, g in nodes.items()],
                "reason": self.inventory_reason}

    @staticmethod
    def _gpu_json(gpu: Gpu, held: dict[str, int]) -> dict:
        return {"uuid": gpu.uuid, "index": gpu.index, "model": gpu.model,
                "memory_mib": gpu.memory_mib, "allocated_milli": held.get(gpu.uuid, 0),
                "simulated": gpu.simulated, "mig_parent": gpu.mig_parent}

    # -- keeping the ledger true ---------------------------------------------------
    async def reconcile_servers(self) -> None:
        """Release server allocations whose server is gone (hub says not active)."""
        started = utcnow()
        alive = await self.hub.active_servers()
        # Only allocations made before we asked: a spawn that allocated after
        # the hub answered is alive even though the answer does not list it.
        stale = [a for a in self.ledger.list(owner_kind="server")
                 if a["owner"] not in alive
                 and dt.datetime.fromisoformat(a["created"]) < started]
        for owner in sorted({a["owner"] for a in stale}):
            released = self.ledger.release("server", owner)
            log.warning("Released %d allocation(s) of server %s: it is not running",
                        len(released), owner)
            await self.server_stopped(owner)

    async def server_stopped(self, owner: str) -> None:
        """A server is gone: what follows it (deployments that asked to) stops too."""
        manager = getattr(self, "deployments", None)
        if manager is not None:
            await manager.server_stopped(owner)

    async def reconcile_loop(self) -> None:
        delay = 1.0
        while True:
            try:
                await self.reconcile_servers()
                await self.lost_slices.check()
                delay = self.reconcile_interval
            except Exception as e:  # the hub may still be starting
                log.warning("Could not reconcile with the hub yet: %s", e)
                delay = min(max(delay * 2, 1.0), self.reconcile_interval)
            await asyncio.sleep(delay)

    # -- serving -----------------------------------------------------------------
    def make_app(self) -> web.Application:
        token = os.environ["JUPYTERHUB_API_TOKEN"]
        cookie_secret = hmac.new(token.encode(), b"gpulab-cookie", hashlib.sha256).hexdigest()
        # The handlers' mixin uses the HubOAuth singleton; configure it once here.
        hub_auth = HubOAuth.instance(api_token=token, cache_max_age=60)
        p = self.prefix
        routes = [
            (url_path_join(p, "oauth_callback"), HubOAuthCallbackHandler),
            *[(url_path_join(p, path), handler)
              for module in (api, jobs_api, deployments_api, telemetry_api, ledger_guard)
              for path, handler in module.routes],
            *[(url_path_join(p, path), handler) for path, handler in pages.routes],
        ]
        return web.Application(routes, gpulab=self, hub_auth=hub_auth,
                               cookie_secret=cookie_secret, xsrf_cookies=False)

    def start(self):
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        app = self.make_app()

        async def main():
            # Routes that take more (uploads, jobs' variables) raise it per request.
            server = HTTPServer(app, xheaders=True, max_body_size=JSON_BODY_LIMIT)
            server.listen(url.port, url.hostname)
            log.info("gpulab service on %s (prefix %s), %d GPU(s), database %s", url.geturl(),
                     self.prefix, len(self.gpus), self.db_url.split("@")[-1])
            asyncio.ensure_future(self.reconcile_loop())
            # Rooms with background work (job re-attachment, sampling) start here.
            await jobs_api.start(self)
            await deployments_api.start(self)
            await telemetry_api.start(self)
            await asyncio.Event().wait()

        try:
            asyncio.run(main())
        except KeyboardInterrupt:  # the hub stops its services with SIGINT
            log.info("gpulab service stopped")


def main(argv=None):
    app = GpuLabService()
    app.initialize(argv if argv is not None else sys.argv[1:])
    app.start()
