"""``python -m gpulab.service.experiments``: the ``mlflow`` service the hub starts.

It listens where the hub says (``JUPYTERHUB_SERVICE_URL``), under its prefix
(``/services/mlflow/``), with the proxy (:mod:`.proxy`) in front of MLflow's server
(:mod:`.tracking_server`, started on first use). Settings are read from the data
dir's ``gpulab_config.py``, as the gpulab service reads its own.
"""

from __future__ import annotations

import asyncio
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
from traitlets import Int, List, Unicode, default
from traitlets.config import Application, PyFileConfigLoader

from gpulab.service import tls
from gpulab.service.auth import TOKEN_CACHE_S, GuardedHubOAuth, TokenAnswers
from gpulab.service.hubapi import HubAPI

from .ownership import Owners
from .proxy import MlflowBackend, ProxyHandler
from .tracking_server import TrackingServer

log = logging.getLogger("gpulab.experiments")

#: The hub's name of this service (its URL is ``<hub>/services/mlflow``).
SERVICE_NAME = "mlflow"


class MlflowProxy(Application):
    """MLflow's tracking server behind the hub, each user's experiments their own."""

    name = "gpulab-mlflow"

    data_dir = Unicode(
        help="""Where MLflow's store (SQLite) and artifacts live: ``<data_dir>/mlflow``.
        Set by `gpulab up --data-dir`.

            c.MlflowProxy.data_dir = "/srv/gpulab"
        """,
    ).tag(config=True)

    @default("data_dir")
    def _data_dir(self):
        return os.environ.get("GPULAB_DATA_DIR", ".gpulab")

    db_url = Unicode(
        help="""The site's database. A PostgreSQL one holds MLflow's tables too, in a
        schema ``mlflow``; otherwise MLflow keeps SQLite in the data dir. Set by
        `gpulab up --db-url`.

            c.MlflowProxy.db_url = "postgresql://gpulab:secret@db.example.org/gpulab"
        """,
    ).tag(config=True)

    @default("db_url")
    def _db_url(self):
        return os.environ.get("GPULAB_DB_URL", "")

    trusted_services = List(
        Unicode(),
        default_value=["gpulab"],
        help="""Hub services that may write runs in a user's name (the gpulab service
        records each job as its user's run). No other service reaches MLflow here.

            c.MlflowProxy.trusted_services = ["gpulab"]
        """,
    ).tag(config=True)

    max_upload_mib = Int(
        1024,
        help="""The largest artifact upload the proxy takes, in MiB (a call of MLflow's
        JSON API takes at most 16 MiB). A body is taken only from a caller the hub
        knows, and past its first MiB it waits in a temporary file, not in memory.

            c.MlflowProxy.max_upload_mib = 4096
        """,
    ).tag(config=True)

    start_timeout_seconds = Int(
        180,
        help="""How long MLflow's server may take to start (its first start creates
        its tables) before a request is answered 503.

            c.MlflowProxy.start_timeout_seconds = 300
        """,
    ).tag(config=True)

    service_name = Unicode(SERVICE_NAME)

    prefix = Unicode()

    @default("prefix")
    def _prefix(self):
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{SERVICE_NAME}/")

    def initialize(self, argv=None):
        super().initialize(argv)
        path = os.path.join(self.data_dir, "gpulab_config.py")
        if os.path.exists(path):
            self.update_config(PyFileConfigLoader(path, log=self.log).load_config())
        logging.basicConfig(
            level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s"
        )
        self.tracking = TrackingServer(
            self.data_dir, self.db_url, self.prefix, start_timeout=self.start_timeout_seconds
        )
        self.backend = MlflowBackend(self.tracking, self.prefix)
        self.owners = Owners(self.backend.call)
        self.hub = HubAPI(os.environ["JUPYTERHUB_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"])

    def make_app(self) -> web.Application:
        token = os.environ["JUPYTERHUB_API_TOKEN"]
        cookie_secret = hmac.new(
            token.encode(), b"gpulab-mlflow-cookie", hashlib.sha256
        ).hexdigest()
        hub_auth = GuardedHubOAuth.instance(
            api_token=token, cache_max_age=TOKEN_CACHE_S, cache=TokenAnswers(TOKEN_CACHE_S)
        )
        p = self.prefix
        return web.Application(
            [
                (url_path_join(p, "oauth_callback"), HubOAuthCallbackHandler),
                (url_path_join(p, "(.*)"), ProxyHandler),
            ],
            mlflow_proxy=self,
            hub_auth=hub_auth,
            cookie_secret=cookie_secret,
            xsrf_cookies=False,
        )

    async def serve(self) -> None:
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10102"))
        if tls.serves_tls():
            tls.reuse_hub_auth_contexts()
        server = HTTPServer(
            self.make_app(),
            xheaders=True,
            max_body_size=self.max_upload_mib << 20,
            ssl_options=tls.server_context(),
        )
        server.listen(url.port, url.hostname)
        log.info("MLflow behind the hub on %s (prefix %s)", url.geturl(), self.prefix)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
        server.stop()
        await self.backend.close()
        await self.tracking.stop()
        log.info("MLflow behind the hub stopped")

    def start(self):
        asyncio.run(self.serve())


def main(argv=None):
    app = MlflowProxy()
    app.initialize(argv if argv is not None else sys.argv[1:])
    app.start()
