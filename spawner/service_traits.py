"""What every gpulab spawner shares: where the gpulab service is, and how to ask it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from tornado import web
from traitlets import Float, Unicode
from traitlets.config import LoggingConfigurable

from .form import ran_since
from .placement import Placement
from .service_client import ServiceClient


class GpuLabServiceMixin(LoggingConfigurable):
    gpulab_api_url = Unicode(
        help="""The gpulab service's API as the hub reaches it.

        c.FractionalLocalSpawner.gpulab_api_url = "http://127.0.0.1:10101/services/gpulab/api/v1"
        c.FractionalKubeSpawner.gpulab_api_url = "http://gpulab:10101/services/gpulab/api/v1"
        """,
    ).tag(config=True)

    gpulab_public_api_url = Unicode(
        help="""The gpulab API as single-user servers reach it (GPULAB_API_URL in their
        environment). Default: gpulab_api_url.

        c.FractionalLocalSpawner.gpulab_public_api_url = "http://127.0.0.1:8000/services/gpulab/api/v1"
        """,
    ).tag(config=True)

    gpulab_ca_file = Unicode(
        help="""A CA certificate file servers trust for GPULAB_API_URL (GPULAB_CA_FILE in
        their environment), where the hub's public certificate is not from a CA the
        system trusts. `gpulab up --tls self-signed` sets it to <data-dir>/tls/ca.pem.

        c.FractionalLocalSpawner.gpulab_ca_file = "/etc/gpulab/ca.pem"
        """,
    ).tag(config=True)

    mlflow_tracking_uri = Unicode(
        help="""MLflow's tracking server behind the hub (MLFLOW_TRACKING_URI in servers'
        environment, with the server's own token, its user's, as MLFLOW_TRACKING_TOKEN).
        `gpulab up` sets it to <hub>/services/mlflow; empty: no MLflow.

        c.FractionalLocalSpawner.mlflow_tracking_uri = "https://hub.example.org/services/mlflow"
        """,
    ).tag(config=True)

    def service_env(self) -> dict[str, str]:
        """Where a server finds the gpulab API, and the CA that vouches for it."""
        env = {"GPULAB_API_URL": self.gpulab_public_api_url or self.gpulab_api_url}
        if self.gpulab_ca_file:
            env["GPULAB_CA_FILE"] = self.gpulab_ca_file
            # MLflow's client (requests) trusts the same CA for the hub.
            if self.mlflow_tracking_uri:
                env["MLFLOW_TRACKING_SERVER_CERT_PATH"] = self.gpulab_ca_file
        if self.mlflow_tracking_uri:
            env["MLFLOW_TRACKING_URI"] = self.mlflow_tracking_uri
            # The server's token: its user's own, never the platform's.
            env["MLFLOW_TRACKING_TOKEN"] = self.api_token or ""
        return env

    gpulab_api_token = Unicode(
        help="""The gpulab service's API token (lets the hub allocate for any user).

        c.FractionalLocalSpawner.gpulab_api_token = os.environ["GPULAB_SERVICE_TOKEN"]
        """,
    ).tag(config=True)

    gpulab_freeing_timeout = Float(
        120.0,
        help="""Seconds a start waits while the service frees a slice for it (batch jobs
        saving a checkpoint to stop). Keep it above the service's
        c.JobQueue.preemption_grace_seconds, and c.Spawner.start_timeout above both.

        c.FractionalLocalSpawner.gpulab_freeing_timeout = 180
        """,
    ).tag(config=True)

    #: Where this server's slice went (the admin page's "GPU slices"); kept in the
    #: hub's state so a restarted hub still shows it. None: not started by gpulab.
    gpulab_placement: Placement | None = None

    def get_state(self):
        state = super().get_state()
        if self.gpulab_placement is not None:
            state["gpulab_placement"] = self.gpulab_placement.to_state()
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpulab_placement = Placement.from_state(state.get("gpulab_placement"))

    def clear_state(self):
        super().clear_state()
        self.gpulab_placement = None

    def _client(self) -> ServiceClient:
        return ServiceClient(self.gpulab_api_url, self.gpulab_api_token, log=self.log)

    @property
    def _owner(self) -> str:
        """The ledger's owner name of this server: ``user/server-name``."""
        return f"{self.user.name}/{self.name}"

    async def waiting_hibernation(self) -> dict | None:
        """This server's latest hibernation when its kernels still wait to wake (the
        spawn form says so); None otherwise, or when the service cannot say."""
        try:
            rows = await ServiceClient(
                self.gpulab_api_url, self.gpulab_api_token, retry_seconds=2
            ).request("GET", "/hibernations", query={"user": self.user.name, "server": self.name})
        except Exception:  # the form works without it
            return None
        if not rows or rows[0]["state"] != "hibernated":
            return None
        # Started again and stopped since (a plain stop): not "hibernated" any more.
        return {**rows[0], "stopped_since": ran_since(rows[0], self.orm_spawner.last_activity)}

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await self._release()

    async def _allocate(self, milli: int) -> list[dict]:
        """Ask the service for this server's slice; its ledger rows (none for 0).

        While preemptible jobs stop to make room the service answers "freeing"
        (202); the start waits, and the spawn page shows why (:meth:`progress`).
        """
        body = {
            "user": self.user.name,
            "owner_kind": "server",
            "owner": self._owner,
            "gpu_milli": milli,
        }
        deadline = time.monotonic() + self.gpulab_freeing_timeout
        while True:
            answer = await self._client().request("POST", "/allocations", body=body)
            if not (isinstance(answer, dict) and answer.get("state") == "freeing"):
                return answer
            said = getattr(self, "_gpulab_events", [])
            if not said or said[-1]["message"] != answer["message"]:
                self.report_progress(30, answer["message"])
            if time.monotonic() > deadline:
                raise web.HTTPError(
                    409,
                    f"no GPU was freed within {self.gpulab_freeing_timeout:g} s; "
                    f"try again, or pick a smaller slice",
                )
            await asyncio.sleep(float(answer.get("retry_after", 1)))

    def begin_progress(self) -> None:
        """A new start: the spawn page shows none of an earlier start's events."""
        self._gpulab_events = []
        self._gpulab_events_changed = asyncio.Event()

    def report_progress(self, progress: int, message: str) -> None:
        """Add an event to the spawn page (``/hub/spawn-pending/<name>``) and the hub's
        progress API: where the slice went, what holds it, what starts next."""
        if not hasattr(self, "_gpulab_events"):
            self.begin_progress()
        self._gpulab_events.append({"progress": progress, "message": message})
        self._gpulab_events_changed.set()

    async def gpulab_progress(self, until: str | None = None):
        """This start's events from the first on (every reader of the progress API
        gets them all): "waiting for GPU to free", "Placed 1/4 GPU on ...",
        "Enforced by: ...", then ``until`` (a message after which the caller's own
        events follow). The hub stops reading once the start is done."""
        seen = 0
        while True:
            events = getattr(self, "_gpulab_events", [])
            while seen < len(events):
                event = events[seen]
                seen += 1
                yield event
                if until is not None and event["message"] == until:
                    return
            changed = getattr(self, "_gpulab_events_changed", None)
            if changed is None:
                await asyncio.sleep(0.5)  # no start has begun yet
                continue
            changed.clear()
            if seen < len(getattr(self, "_gpulab_events", [])):
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=1)

    def freeing_progress(self):
        """The spawn page's events from gpulab (kept name: the local spawner's progress)."""
        return self.gpulab_progress()

    async def _release(self) -> None:
        """Give the slice back. Waits briefly: when the hub shuts down, the service
        is already gone, and its reconciliation frees whatever a lost release
        leaves behind when it next starts."""
        client = ServiceClient(
            self.gpulab_api_url, self.gpulab_api_token, retry_seconds=10, log=self.log
        )
        try:
            await client.request(
                "DELETE", "/allocations", query={"owner_kind": "server", "owner": self._owner}
            )
        except web.HTTPError as e:
            if e.status_code < 500:
                raise
            self.log.warning(
                "Could not release the slice of %s now (%s); the gpulab service "
                "releases it when it next reconciles",
                self._owner,
                e.log_message,
            )
