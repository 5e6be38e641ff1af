"""The gpulab service: a JupyterHub-managed tornado app holding the ledger.

The hub starts it (``python -m gpulab.service``) with the usual
``JUPYTERHUB_*`` variables and restarts it if it dies. Settings come from
``<data-dir>/gpulab_config.py``, the same file that overrides the hub's
configuration, e.g.::

    c.SharingSettings.default_user_quota_milli = 1000
    c.SharingSettings.group_quota_milli = {"students": 4000}

It is built in one place, :meth:`GpuLabService.initialize`, as an ordered list of
``init_*`` steps; a setting it cannot work with stops it there, before anything
listens (:class:`~gpulab.service.jobs.backends.ConfigError`: one log line, exit code 1). ``start()``
listens, then starts each manager's background work; ``stop()`` ends all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import signal
import sys
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import (
    Bool,
    Dict,
    Float,
    Instance,
    Int,
    List,
    TraitError,
    Unicode,
    default,
)
from traitlets.config import Application, PyFileConfigLoader

from gpulab.backend.kubernetes.inventory import KubernetesInventory
from gpulab.backend.kubernetes.job_settings import KubernetesJobsSettings
from gpulab.backend.kubernetes.serving_settings import KubernetesServingSettings
from gpulab.backend.log_pipe import DEFAULT_LOG_MAX_BYTES
from gpulab.backend.spec import SpecError
from gpulab.db.engine import make_engine
from gpulab.db.threads import DbThreads
from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.accounts import UserAccounts
from gpulab.scheduler.inventory import Gpu, InventoryError
from gpulab.scheduler.ledger import Ledger
from gpulab.scheduler.policy import get_policy
from gpulab.scheduler.quota import Quotas
from gpulab.service import listen_addresses, tls
from gpulab.service.api import alerts as alerts_api
from gpulab.service.api import allocations as api
from gpulab.service.api import audit as audit_api
from gpulab.service.api import collections as collections_api
from gpulab.service.api import deployments as deployments_api
from gpulab.service.api import gpus as gpus_api
from gpulab.service.api import hibernations as hibernations_api
from gpulab.service.api import jobs as jobs_api
from gpulab.service.api import ledger as ledger_api
from gpulab.service.api import openai_v1 as openai_api
from gpulab.service.api import pages
from gpulab.service.api import pools as pools_api
from gpulab.service.api import schedules as schedules_api
from gpulab.service.api import telemetry as telemetry_api
from gpulab.service.api import usage as usage_api
from gpulab.service.api.request_body import JSON_BODY_LIMIT
from gpulab.service.auth import (
    TOKEN_CACHE_S,
    GuardedHubOAuth,
    Identity,
    TokenAnswers,
    identity_of,
)
from gpulab.service.budgets import BudgetSettings, UserBudgets
from gpulab.service.endpoints.fine_tuning import FineTuning
from gpulab.service.endpoints.fine_tuning_api import FineTuningRoutes
from gpulab.service.endpoints.llm_settings import LlmSettings
from gpulab.service.endpoints.manager import DeploymentManager
from gpulab.service.endpoints.site_settings import Endpoints
from gpulab.service.experiments.recorder import RunRecorder
from gpulab.service.experiments.settings import ExperimentSettings
from gpulab.service.hibernation.manager import Hibernations
from gpulab.service.hibernation.servers import ServerCalls
from gpulab.service.hibernation.settings import Hibernation
from gpulab.service.hubapi import HubAPI
from gpulab.service.jobs.backends import refuse_local_user_code
from gpulab.service.jobs.cpu_quota import HostQuota
from gpulab.service.jobs.inventory_settings import InventorySettings
from gpulab.service.jobs.manager import JobManager
from gpulab.service.jobs.pools import Pools, load_gpus, read_pools
from gpulab.service.jobs.preemption import Preemption
from gpulab.service.jobs.queue_settings import JobQueue
from gpulab.service.jobs.schedules import ScheduledJobs
from gpulab.service.moved_settings import carry_moved, moved_map
from gpulab.service.operations.actions import AlertActions
from gpulab.service.operations.alerting import Alerting
from gpulab.service.operations.alerts import AlertEngine
from gpulab.service.operations.audit import AuditLog
from gpulab.service.operations.audit_settings import AuditTrail
from gpulab.service.operations.facts import FactsBuilder
from gpulab.service.operations.lost_slices import LostSlices
from gpulab.service.operations.metrics import OpsCollector
from gpulab.service.operations.reconcile import Reconciler
from gpulab.service.operations.rules import Thresholds
from gpulab.service.operations.self_healing import CordonCollector, SelfHealing
from gpulab.service.plugins import (
    JOB_BACKENDS,
    SERVING_BACKENDS,
    ConfigError,
    NamedType,
)
from gpulab.service.sharing import HubGroups, SharingSettings
from gpulab.service.tasks import run_unless
from gpulab.service.telemetry.local_sampler import LocalSampler
from gpulab.service.telemetry.metrics import (
    EndpointCollector,
    JobQueueCollector,
    LedgerCollector,
    Metrics,
)
from gpulab.service.telemetry.settings import TelemetrySettings
from gpulab.service.telemetry.store import TelemetryStore
from gpulab.service.vectors.manager import CollectionManager
from gpulab.service.vectors.settings import VectorSettings
from gpulab.telemetry import SampleCollector

log = logging.getLogger("gpulab.service")

#: The modules whose ``routes`` the service serves under its prefix (besides pages).
ROUTE_MODULES = (
    api,
    jobs_api,
    deployments_api,
    telemetry_api,
    usage_api,
    ledger_api,
    audit_api,
    alerts_api,
    gpus_api,
    pools_api,
    hibernations_api,
    collections_api,
    openai_api,
    schedules_api,
)

#: Ends the service and leaves its jobs and replicas running for the next service to
#: adopt, whatever ``stop_work_on_exit`` says: `gpulab up` sends it to the service of a
#: hub that died without its shutdown (hub_ext/leftover_processes.py, which names the
#: same signal). Its default action, before the handler is in place, ends the process
#: and leaves the work running too.
LEAVE_WORK_SIGNAL = signal.SIGUSR1

#: The parts' own settings classes, once settings of GpuLabService: built with
#: ``parent=`` the service (the same config file); ``c.GpuLabService.<name>`` still
#: sets each, with a warning that names the new place (moved_settings.py).
SETTINGS_PARTS = (
    Thresholds,
    Alerting,
    Hibernation,
    Endpoints,
    JobQueue,
    VectorSettings,
    LlmSettings,
    BudgetSettings,
    ExperimentSettings,
    HostQuota,
    AuditTrail,
    TelemetrySettings,
    InventorySettings,
    SharingSettings,
)
MOVED_SETTINGS = moved_map(SETTINGS_PARTS)

#: What one init step may raise that means "this configuration cannot work".
CONFIG_ERRORS = (ConfigError, SpecError, InventoryError, TraitError, ValueError)


def configure_logging() -> None:
    """The service's log format on the root logger (once: later calls change nothing)."""
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"
    )


class GpuLabService(Application):
    name = "gpulab-service"
    description = (
        "The gpulab service: GPU inventory, slice allocations and quotas behind JupyterHub."
    )
    # Settings of these classes go in the same config file (and show in --help-all).
    classes = [
        KubernetesJobsSettings,
        KubernetesServingSettings,
        KubernetesInventory,
        UserAccounts,
        AccountLimits,
        *SETTINGS_PARTS,
    ]

    def _load_config(self, cfg, section_names=None, traits=None):
        """Carry settings that moved to a part (``c.GpuLabService.job_stall_seconds``
        -> ``c.Thresholds``) to their new place first, in the config itself, so the
        part built with ``parent=self`` reads them and this class does not warn of
        an unknown name."""
        carry_moved(cfg, MOVED_SETTINGS)
        super()._load_config(cfg, section_names=section_names, traits=traits)

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

    jobs_backend_class = NamedType(
        JOB_BACKENDS,
        klass="gpulab.backend.base.Backend",
        help="""Where this site's jobs run (a job that names no backend runs here):
        "local" (torchrun on the service's machine), "kubernetes" (Indexed Jobs;
        c.KubernetesJobsSettings says where), "slurm" (one sbatch allocation per job;
        c.SlurmSite says which cluster), a site's own entry point, or an import path of
        a gpulab.backend.base.Backend (its settings are its own traits).
        A site of several places sets c.InventorySettings.pools instead.

        c.GpuLabService.jobs_backend_class = "slurm"
        """,
    ).tag(config=True)

    extra_listen_ips = List(Unicode(), help=listen_addresses.HELP).tag(config=True)

    serving_backend_class = NamedType(
        SERVING_BACKENDS,
        klass="gpulab.backend.serving_base.ServingBackend",
        help="""Where `%deploy` endpoints' replicas run: "local" (processes on the
        service's machine), "kubernetes" (a Deployment and a Service each) or an import path.

        c.GpuLabService.serving_backend_class = "kubernetes"
        """,
    ).tag(config=True)

    user_code_in_service = Bool(
        True,
        help="""Whether users' code may run beside the service: job ranks on the "local"
        backend and replicas on the "local" serving backend are processes on the
        service's own machine (with `gpulab up` as root, each as its user's Unix
        account). The Helm chart turns it off: its service pod holds the hub tokens and
        the database, so jobs and endpoints run as pods of their own; a job for the
        "local" backend is then refused with the fix, and a local jobs or serving
        backend class stops the service's start (chart value
        service.allowUserCodeInServicePod: true turns it back on).

        c.GpuLabService.user_code_in_service = False
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

    kubernetes_jobs = Dict(
        help="""Deprecated: set jobs_backend_class = "kubernetes" and c.KubernetesJobsSettings
        (same names) instead. Still works: it selects that class and sets those settings.

        c.GpuLabService.kubernetes_jobs = {"namespace": "gpulab", "jobs_pvc": "gpulab-jobs",
                                           "enforcement": "hami", "queue": "gpulab-jobs"}
        """,
    ).tag(config=True)

    kubernetes_deployments = Dict(
        help="""Deprecated shortcut for serving_backend_class = "kubernetes" with these
        settings: `%deploy` endpoints as a Deployment + Service each in this namespace
        (instead of processes on the service's machine); see c.KubernetesServingSettings.

        c.GpuLabService.kubernetes_deployments = {"namespace": "gpulab",
            "models_pvc": "gpulab-models", "image": "example.org/gpulab:1", "enforcement": "hami"}
        """,
    ).tag(config=True)

    max_upload_mib = Int(
        2048,
        help="""Largest request body the service takes, in MiB: a model uploaded by
        `%deploy` (as sent, compressed), an OIP v2 inference request to an endpoint (at
        most 256 MiB, what a model server takes), a training file (`POST v1/files`).
        Other routes take JSON bodies of at most 1 MiB (jobs: see
        c.JobQueue.max_job_vars_mib; the OpenAI gateway's calls: 16 MiB).

        c.GpuLabService.max_upload_mib = 8192
        """,
    ).tag(config=True)

    job_log_max_bytes = Int(
        DEFAULT_LOG_MAX_BYTES,
        help="""Most bytes each log of a job (each node's and each rank's) and of an
        endpoint's replica keeps on disk. Past it the older half is dropped and the
        log says so on its first line ("[gpulab] log over 64 MiB: older lines
        dropped"). 0: not capped.

        c.GpuLabService.job_log_max_bytes = 256 * 2**20
        """,
    ).tag(config=True)

    stop_work_on_exit = Bool(
        False,
        help="""When the service stops (SIGINT or SIGTERM), stop the work too: each
        running job saves a checkpoint at its next step and stops (killed after
        c.GpuLabService.exit_grace_seconds), and every endpoint's replicas stop. At
        the next start the jobs resume from their checkpoints and the endpoints
        launch again. `gpulab up` turns it on: nothing of it outlives its Ctrl-C. Off
        (the chart), jobs and replicas run on while the service restarts or upgrades,
        and the next service adopts them.

        c.GpuLabService.stop_work_on_exit = True
        """,
    ).tag(config=True)

    exit_grace_seconds = Float(
        3.0,
        help="""With c.GpuLabService.stop_work_on_exit: seconds jobs get to save a
        checkpoint, and replicas to answer what they hold, before they are killed
        (a killed job resumes from its previous checkpoint).

        c.GpuLabService.exit_grace_seconds = 3
        """,
    ).tag(config=True)

    config_file = Unicode(
        help="Python config file to load. Default: <data-dir>/gpulab_config.py if it exists."
    ).tag(config=True)

    aliases = {
        "config": "GpuLabService.config_file",
        "db-url": "GpuLabService.db_url",
        "simulate-gpus": "InventorySettings.simulate_gpus",
    }

    # -- what initialize() builds (not configuration) -----------------------------------
    gpus = List(Instance(Gpu))
    site_pools = Instance(Pools, allow_none=True)
    inventory_reason = Unicode(None, allow_none=True)
    engine = Instance("sqlalchemy.engine.Engine", allow_none=True)
    ledger = Instance(Ledger, allow_none=True)
    db_threads = Instance(DbThreads, allow_none=True)
    metrics = Instance(Metrics, allow_none=True)
    lost_slices = Instance(LostSlices, allow_none=True)
    audit = Instance(AuditLog, allow_none=True)
    alerts = Instance(AlertEngine, allow_none=True)
    alert_actions = Instance(AlertActions, allow_none=True)
    reconciler = Instance(Reconciler, allow_none=True)
    preemption = Instance(Preemption, allow_none=True)
    jobs = Instance(JobManager, allow_none=True)
    budgets = Instance(UserBudgets, allow_none=True)
    schedules = Instance(ScheduledJobs, allow_none=True)
    deployments = Instance("gpulab.service.endpoints.manager.DeploymentManager", allow_none=True)
    fine_tuning = Instance(FineTuning, allow_none=True)
    vectors = Instance(CollectionManager, allow_none=True)
    telemetry = Instance(TelemetryStore, allow_none=True)
    hibernations = Instance(Hibernations, allow_none=True)
    sampler = Instance(LocalSampler, allow_none=True)
    #: Cordons GPUs that fault and moves their jobs (operations/self_healing.py).
    healer = Instance(SelfHealing, allow_none=True)
    tornado_app = Instance(web.Application, allow_none=True)
    hub = Instance(HubAPI)
    #: Who users' job ranks and model replicas run as (c.UserAccounts settings).
    accounts = Instance(UserAccounts)
    #: Their CPU, memory and device limits (c.AccountLimits settings).
    account_limits = Instance(AccountLimits)
    #: The parts' settings (SETTINGS_PARTS), built first by init_settings.
    thresholds = Instance(Thresholds, allow_none=True)
    alerting = Instance(Alerting, allow_none=True)
    hibernation = Instance(Hibernation, allow_none=True)
    endpoint_settings = Instance(Endpoints, allow_none=True)
    job_queue = Instance(JobQueue, allow_none=True)
    vector_settings = Instance(VectorSettings, allow_none=True)
    llm_settings = Instance(LlmSettings, allow_none=True)
    budget_settings = Instance(BudgetSettings, allow_none=True)
    experiment_settings = Instance(ExperimentSettings, allow_none=True)
    host_quota = Instance(HostQuota, allow_none=True)
    audit_trail = Instance(AuditTrail, allow_none=True)
    telemetry_settings = Instance(TelemetrySettings, allow_none=True)
    inventory_settings = Instance(InventorySettings, allow_none=True)
    #: Writes each ended job as an MLflow run of its user (None: no MLflow service).
    run_recorder = Instance(RunRecorder, allow_none=True)
    service_name = Unicode()
    prefix = Unicode()

    @default("hub")
    def _hub(self):
        return HubAPI(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])

    @default("accounts")
    def _accounts(self):
        return UserAccounts(parent=self)

    @default("account_limits")
    def _account_limits(self):
        quota = self.host_quota or HostQuota(parent=self)  # asked before init_settings
        return AccountLimits(
            parent=self, quota_cpu=quota.user_cpu_quota, quota_memory=quota.user_memory_quota
        )

    @default("service_name")
    def _service_name(self):
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpulab")

    @default("prefix")
    def _prefix(self):
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpulab/")

    # -- building it, in order -----------------------------------------------------------
    def initialize(self, argv=None):
        """Parse the command line and config file, then build every part in order.
        Raises :class:`ConfigError` (one line that says what to fix) for settings
        the service cannot start with; nothing listens yet."""
        configure_logging()  # first: loading the config logs where moved settings are now
        super().initialize(argv)
        path = self.config_file or os.path.join(self.data_dir, "gpulab_config.py")
        if os.path.exists(path):
            try:
                # Loaded here, not by load_config_file(), whose errors exit on their own.
                self.update_config(PyFileConfigLoader(path, log=self.log).load_config())
            except CONFIG_ERRORS as e:
                raise ConfigError(f"{path}: {e}") from e
            except Exception as e:  # the file itself does not run
                raise ConfigError(f"{path} does not run: {type(e).__name__}: {e}") from e
        for step in (
            self.init_logging,
            self.init_settings,
            self.init_hub,
            self.init_db,
            self.init_ledger,
            self.init_audit,
            self.init_telemetry_store,
            self.init_hibernation,
            self.init_jobs,
            self.init_deployments,
            self.init_vectors,
            self.init_reconcile,
            self.init_telemetry,
            self.init_alerts,
            self.init_handlers,
        ):
            try:
                step()
            except ConfigError:
                raise
            except CONFIG_ERRORS as e:
                raise ConfigError(str(e)) from e

    def init_logging(self):
        configure_logging()

    def init_settings(self):
        """The parts' settings, from the same config: a value out of range stops the
        start here (one line, from the trait's @validate)."""
        self.thresholds = Thresholds(parent=self)
        self.alerting = Alerting(parent=self)
        self.hibernation = Hibernation(parent=self)
        self.endpoint_settings = Endpoints(parent=self)
        self.job_queue = JobQueue(parent=self)
        self.vector_settings = VectorSettings(parent=self)
        self.llm_settings = LlmSettings(parent=self)
        self.budget_settings = BudgetSettings(parent=self)
        self.experiment_settings = ExperimentSettings(parent=self)
        self.host_quota = HostQuota(parent=self)
        self.audit_trail = AuditTrail(parent=self)
        self.telemetry_settings = TelemetrySettings(parent=self)
        self.inventory_settings = InventorySettings(parent=self)
        self.sharing_settings = SharingSettings(parent=self)

    def init_hub(self):
        """The hub's API (``self.hub``, built from these variables), which the parts
        built below ask: which servers run, who a token is."""
        for name in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN"):
            if not os.environ.get(name):
                raise ConfigError(
                    f"${name} is not set: the service runs under JupyterHub "
                    f"(c.JupyterHub.services), which sets it"
                )

    def init_db(self):
        # What the service writes (databases, job and model files) is private
        # unless it says otherwise; users reach it through the API only.
        os.umask(0o077)
        os.makedirs(self.data_dir, exist_ok=True)
        self.engine = make_engine(self.db_url)
        #: Where the audit trail, alerts and usage query (the ledger has its own).
        self.db_threads = DbThreads()

    def init_ledger(self):
        """The inventory (from inventory_class), the ledger over it, and what watches it."""
        placing, sharing = self.inventory_settings, self.sharing_settings
        policy = get_policy(placing.policy)  # a known name (InventorySettings checks it)
        if self.kubernetes_jobs:
            self._deprecated_shortcut(
                "kubernetes_jobs", "jobs_backend_class", "c.KubernetesJobsSettings"
            )
        if self.kubernetes_deployments:
            self._deprecated_shortcut(
                "kubernetes_deployments", "serving_backend_class", "c.KubernetesServingSettings"
            )
        self.site_pools = Pools(read_pools(self))
        if placing.server_pool and placing.server_pool not in self.site_pools.by_name:
            raise ConfigError(
                f"c.InventorySettings.server_pool = {placing.server_pool!r} is not a pool; "
                f"this site's pools: {self.site_pools.names()}"
            )
        self.gpus, self.inventory_reason = load_gpus(self, self.site_pools.list)
        if self.inventory_reason:
            log.warning("No GPUs: %s. Only gpu_milli=0 can be placed.", self.inventory_reason)
        self.ledger = Ledger(
            self.engine,
            self.gpus,
            policy,
            Quotas(
                sharing.default_user_quota_milli,
                dict(sharing.user_quota_milli),
                dict(sharing.group_quota_milli),
                sharing.default_user_guaranteed_milli,
                dict(sharing.user_guaranteed_milli),
                dict(sharing.group_guaranteed_milli),
            ),
        )
        self.priorities = sharing.make_priorities()
        self.metrics = Metrics()
        self.metrics.registry.register(LedgerCollector(self.ledger, self.gpus, placing.slice_sizes))
        self.metrics.registry.register(JobQueueCollector(self.engine))
        #: Where each user stands against the GPU-hour budgets (BudgetSettings).
        self.budgets = UserBudgets(
            hub=self.hub,
            engine=self.ledger.engine,
            db_threads=self.db_threads,
            config=self.budget_settings.budget_config(),
        )

    def init_audit(self):
        """The audit trail; its writes run on the service's database threads."""
        self.audit = AuditLog(
            self.engine,
            run=self.db_threads.run,
            retention_days=self.audit_trail.audit_retention_days,
            trusted_proxies=self.audit_trail.audit_trusted_proxies,
            denials_per_minute=self.audit_trail.denials_per_minute,
        )

    def init_jobs(self):
        #: What hub groups say (limits, guarantees, classes), read from the hub at each ask.
        sharing = self.sharing_settings
        self.hub_groups = HubGroups(
            self.hub, self.ledger.quotas, sharing.group_quota_milli, sharing.group_guaranteed_milli
        )
        #: Writes each ended job as an MLflow run of its user (None: no MLflow service).
        self.run_recorder = self.experiment_settings.make_run_recorder()
        # job_backends() stops the start on a local backend where user code may not run.
        self.jobs = JobManager.of(self)
        #: Frees slices for servers, endpoints and jobs of a higher class by stopping
        #: jobs: a part of the job manager (its victims are jobs), which others use too.
        self.preemption = self.jobs.preemption
        #: Jobs submitted on a cron schedule, as their owner (notebook job definitions).
        self.schedules = ScheduledJobs.of(self)

    def init_deployments(self):
        serving = self.site_pools.serving() if self.inventory_settings.pools else None
        refuse_local_user_code(self, "serving_backend_class", serving and serving.serving)
        # Configuration errors surface here, before anything listens.
        self.deployments = DeploymentManager.of(self)
        self.metrics.registry.register(EndpointCollector(self.deployments))
        self.deployments.gateway.meter.register(self.metrics.registry)
        #: The fine-tuning API (v1/files, v1/fine_tuning/jobs): LoRA jobs on endpoints.
        self.fine_tuning = FineTuning.of(self)
        FineTuningRoutes(self.fine_tuning, self.deployments.gateway)  # adds itself to it

    def init_vectors(self):
        #: Vector collections; the embedded engine starts at their first use.
        self.vectors = CollectionManager.of(self)

    def init_reconcile(self):
        """The ledger kept true against the hub: slices of servers that are gone
        released, live servers, jobs and endpoints without their slice found."""
        self.lost_slices = LostSlices(
            hub=self.hub, ledger=self.ledger, jobs=self.jobs, deployments=self.deployments
        )
        self.metrics.registry.register(self.lost_slices)
        self.reconciler = Reconciler(
            hub=self.hub,
            ledger=self.ledger,
            lost_slices=self.lost_slices,
            server_stopped=self.server_stopped,
            interval=self.reconcile_interval,
        )

    def _deprecated_shortcut(self, old: str, trait: str, instead: str) -> None:
        """A dict setting of old (kubernetes_jobs...) selects the Kubernetes class."""
        kube = self.traits()[trait].validate(self, "kubernetes")
        if trait in self.config.GpuLabService and not issubclass(getattr(self, trait), kube):
            raise ConfigError(
                f"c.GpuLabService.{old} asks for Kubernetes but "
                f"c.GpuLabService.{trait} is {getattr(self, trait).__name__}; "
                f"remove one of them"
            )
        log.warning(
            "c.GpuLabService.%s is deprecated: set c.GpuLabService.%s = 'kubernetes' "
            "and %s instead",
            old,
            trait,
            instead,
        )
        if not issubclass(getattr(self, trait), kube):
            setattr(self, trait, kube)

    def init_telemetry_store(self):
        #: Nodes' samples and jobs' all-reduce results (the job manager records those).
        self.telemetry = TelemetryStore()

    def init_telemetry(self):
        self.metrics.registry.register(SampleCollector(self.telemetry.latest_for_export))
        settings = self.telemetry_settings
        if settings.local_sampler:
            self.sampler = LocalSampler(
                telemetry=self.telemetry,
                node=self.inventory_settings.node_name,
                interval=settings.sample_interval,
            )
        self.healer = SelfHealing(
            ledger=self.ledger, gpus=self.gpus, jobs=self.jobs, audit=self.audit
        )
        self.telemetry.listeners.append(self.healer.observe)
        self.metrics.registry.register(CordonCollector(self.ledger, self.gpus))

    def init_hibernation(self):
        """Hibernation of idle servers; the scheduler's preemption (built with the job
        manager, after this) asks it for idle servers before it stops any batch job."""
        self.hibernations = Hibernations(
            engine=self.engine,
            db_threads=self.db_threads,
            ledger=self.ledger,
            hub=self.hub,
            # Never the service's own token: each call into a server gets one of its own.
            servers=ServerCalls(self.hub, self.hibernation.servers_url),
            audit=self.audit,
            telemetry=self.telemetry,
            idle_seconds=self.hibernation.hibernate_idle_seconds,
            for_others_seconds=self.hibernation.hibernate_for_others_seconds,
            max_bytes=self.hibernation.hibernate_max_bytes,
        )

    def init_alerts(self):
        """The alert engine (its rules read the settings above) and the metrics the
        chart's PrometheusRule reads."""
        self.alerts = AlertEngine(
            builder=FactsBuilder(
                ledger=self.ledger,
                engine=self.engine,
                db_threads=self.db_threads,
                telemetry=self.telemetry,
                jobs=self.jobs,
                deployments=self.deployments,
                data_dir=self.data_dir,
            ),
            thresholds=self.thresholds,
            engine=self.engine,
            db_threads=self.db_threads,
            interval=self.alerting.alert_interval_seconds,
            webhook_url=self.alerting.alert_webhook_url,
            prefix=self.prefix,
        )
        self.alert_actions = AlertActions(
            alerts=self.alerts,
            healer=self.healer,
            hub=self.hub,
            audit=self.audit,
            stall_restarts=self.alerting.job_stall_restarts,
            cull_seconds=self.thresholds.gpu_idle_cull_seconds,
            alert_interval=self.alerting.alert_interval_seconds,
        )
        self.metrics.registry.register(OpsCollector(self.alerts))

    def init_handlers(self):
        listen_addresses.check_addresses(self.extra_listen_ips)  # a bad one: ConfigError
        self.tornado_app = self.make_app()

    # -- identities and groups ---------------------------------------------------
    async def identify(self, model: dict) -> Identity:
        return await identity_of(model, self.hub, self.service_name)

    def inventory(self) -> dict:
        held = self.ledger.allocated_by_gpu()
        cordons = self.ledger.cordons()
        nodes: dict[str, list[dict]] = {}
        pool_of: dict[str, str] = {}
        for gpu in self.gpus:
            cordoned = gpus_api.public_cordon(self.ledger.cordon_of(gpu, cordons))
            nodes.setdefault(gpu.node, []).append(
                {**self._gpu_json(gpu, held), "cordoned": cordoned}
            )
            pool_of[gpu.node] = gpu.pool
        if not nodes:
            nodes[self.inventory_settings.node_name] = []
        return {
            "nodes": [
                {"name": n, "pool": pool_of.get(n, self.server_pool_name), "gpus": g}
                for n, g in nodes.items()
            ],
            "reason": self.inventory_reason,
        }

    @property
    def server_pool_name(self) -> str:
        """The pool servers take their slices in (c.InventorySettings.server_pool)."""
        return self.inventory_settings.server_pool or self.site_pools.list[0].name

    def pool_for(self, kind: str) -> str:
        """The pool a server's or an endpoint's slices go to: the server pool, or the
        pool endpoints run in."""
        if kind == "deployment":
            serving = self.site_pools.serving()
            return serving.name if serving else self.server_pool_name
        return self.server_pool_name

    def ledger_for(self, kind: str) -> Ledger:
        """The ledger as a server's or an endpoint's placement sees it."""
        return self.ledger.pool(self.pool_for(kind))

    @staticmethod
    def _gpu_json(gpu: Gpu, held: dict[str, int]) -> dict:
        return {
            "uuid": gpu.uuid,
            "index": gpu.index,
            "model": gpu.model,
            "memory_mib": gpu.memory_mib,
            "allocated_milli": held.get(gpu.uuid, 0),
            "simulated": gpu.simulated,
            "mig_parent": gpu.mig_parent,
        }

    async def server_stopped(self, owner: str) -> None:
        """A server is gone: what follows it (deployments that asked to) stops too."""
        if self.deployments is not None:
            await self.deployments.server_stopped(owner)

    # -- serving -----------------------------------------------------------------
    def make_app(self) -> web.Application:
        token = os.environ["JUPYTERHUB_API_TOKEN"]
        cookie_secret = hmac.new(token.encode(), b"gpulab-cookie", hashlib.sha256).hexdigest()
        # The handlers' mixin uses the HubOAuth singleton; configure it once here.
        hub_auth = GuardedHubOAuth.instance(
            api_token=token, cache_max_age=TOKEN_CACHE_S, cache=TokenAnswers(TOKEN_CACHE_S)
        )
        p = self.prefix
        routes = [
            (url_path_join(p, "oauth_callback"), HubOAuthCallbackHandler),
            *[
                (url_path_join(p, path), handler)
                for module in ROUTE_MODULES
                for path, handler in module.routes
            ],
            *[(url_path_join(p, path), handler) for path, handler in pages.routes],
        ]
        return web.Application(
            routes, gpulab=self, hub_auth=hub_auth, cookie_secret=cookie_secret, xsrf_cookies=False
        )

    def make_metrics_app(self) -> web.Application:
        """The app of ``c.TelemetrySettings.metrics_port``: /metrics alone, every series,
        no token (for the scraper the network lets through, and no one else)."""
        paths = (url_path_join(self.prefix, "metrics"), "/metrics")
        return web.Application([(path, api.ScrapeHandler) for path in paths], gpulab=self)

    # -- running -----------------------------------------------------------------
    def managers(self) -> list:
        """What has background work, in start order (stop runs in reverse)."""
        return [
            m
            for m in (
                self.audit,
                self.reconciler,
                self.jobs,
                self.run_recorder,
                self.schedules,
                self.deployments,
                self.fine_tuning,
                self.vectors,
                self.healer,
                self.sampler,
                self.alerts,
                self.alert_actions,
                self.hibernations,
            )
            if m is not None
        ]

    #: The managers whose start began, in order (None: start_managers never ran).
    _started: list | None = None

    async def start_managers(self) -> None:
        self._started = []
        for manager in self.managers():
            self._started.append(manager)  # first: a start cut short is stopped too
            await manager.start()

    #: Set by LEAVE_WORK_SIGNAL: this stop leaves jobs and replicas running whatever
    #: ``stop_work_on_exit`` says (the next service adopts them).
    leaving_work = False

    async def stop(self) -> None:
        """End every background task the service or a manager started. Jobs and
        replicas themselves run on (the next service re-attaches to them), unless
        ``stop_work_on_exit``: then both stop together, the slower one is the wait."""
        # A stop during the start (start_managers cut short) stops what had started.
        running = self.managers() if self._started is None else list(self._started)
        if self.leaving_work:
            log.info("Leaving jobs and endpoints running for the next gpulab service")
        elif self.stop_work_on_exit:
            await asyncio.gather(
                *(self._suspend(m) for m in (self.jobs, self.deployments) if m in running)
            )
        for manager in reversed(running):
            try:
                await manager.stop()
            except Exception:
                log.exception("Stopping %s", type(manager).__name__)
        if self.ledger is not None:
            self.ledger.aio.close()  # its threads: after the managers, which use them
        if self.db_threads is not None:
            self.db_threads.close()

    async def _suspend(self, manager) -> None:
        try:
            await manager.suspend(self.exit_grace_seconds)
        except Exception:
            log.exception("Stopping the work of %s", type(manager).__name__)

    async def serve(self) -> None:
        """Listen, start the managers, run until SIGINT/SIGTERM, then stop()."""
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        # Routes that take more (uploads, jobs' variables) raise it per request.
        if tls.serves_tls():
            tls.reuse_hub_auth_contexts()
        server = HTTPServer(
            self.tornado_app or self.make_app(),
            xheaders=True,
            max_body_size=JSON_BODY_LIMIT,
            ssl_options=tls.server_context(),  # https under internal_ssl (service/tls.py)
        )
        server.listen(url.port, url.hostname)
        listen_addresses.listen_extra(server, url.port, self.extra_listen_ips, url.hostname)
        scrape = None
        if self.telemetry_settings.metrics_port:
            scrape = HTTPServer(self.make_metrics_app(), ssl_options=tls.server_context())
            scrape.listen(self.telemetry_settings.metrics_port, url.hostname)
            log.info(
                "Every /metrics series without a token on port %d (c.TelemetrySettings"
                ".metrics_port)",
                self.telemetry_settings.metrics_port,
            )
        log.info(
            "gpulab service on %s (prefix %s), %d GPU(s), database %s",
            url.geturl(),
            self.prefix,
            len(self.gpus),
            self.db_url.split("@")[-1],
        )
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()

        def leave_work() -> None:
            self.leaving_work = True
            stopping.set()

        for sig, handler in (
            (signal.SIGINT, stopping.set),  # the hub stops services with these
            (signal.SIGTERM, stopping.set),
            (LEAVE_WORK_SIGNAL, leave_work),  # `gpulab up` after a crashed hub
        ):
            # Not the main thread (tests): KeyboardInterrupt stops it instead.
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(sig, handler)
        try:
            # A stop asked while the managers start (the standby router's start alone
            # takes seconds) cuts the start short rather than waiting for its end.
            await run_unless(stopping, self.start_managers())
            await stopping.wait()
        finally:
            server.stop()
            if scrape is not None:
                scrape.stop()
            await self.stop()
            log.info("gpulab service stopped")

    def start(self):
        try:
            asyncio.run(self.serve())
        except KeyboardInterrupt:  # a signal before the handlers were in place
            log.info("gpulab service stopped")


def main(argv=None):
    app = GpuLabService()
    try:
        app.initialize(argv if argv is not None else sys.argv[1:])
    except ConfigError as e:
        logging.basicConfig(
            level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"
        )
        log.critical("Configuration error, not starting: %s", " ".join(str(e).split()))
        sys.exit(1)
    app.start()
