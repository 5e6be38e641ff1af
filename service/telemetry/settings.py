"""The site's telemetry settings (``c.TelemetrySettings.<name>``): whether the service
samples its own node and how often (read where it builds the
:class:`~gpulab.service.telemetry.local_sampler.LocalSampler`, and by the telemetry
route), and whether ``/metrics`` asks for a token (the metrics route)."""

from __future__ import annotations

from traitlets import Bool, Float, Integer, TraitError, validate
from traitlets.config import Configurable


class TelemetrySettings(Configurable):
    authenticate_prometheus = Bool(
        True,
        help="""Require a hub token for /metrics (as JupyterHub does for its own). Every
        series needs an admin or a token with JupyterHub's read:metrics scope (give
        Prometheus one); a user's token reads the cluster's series and those of the
        user's own jobs and endpoints. Off: a call without a token reads the cluster's
        series (no job, endpoint or user of anyone's); every series without a token only
        on `metrics_port`.

        c.TelemetrySettings.authenticate_prometheus = False
        """,
    ).tag(config=True)

    metrics_port = Integer(
        0,
        help="""A port of its own where /metrics answers every series without a token,
        for a scraper that cannot send one (the Helm chart's annotation scrape, with a
        NetworkPolicy that lets only Prometheus reach this port). The service's API
        port is one users reach, so it never gives every series without a token. On
        one machine every account can connect to any port of it: leave it 0 there.
        0: no such port.

        c.TelemetrySettings.metrics_port = 10103
        """,
    ).tag(config=True)

    @validate("metrics_port")
    def _check_metrics_port(self, proposal):
        value = proposal["value"]
        if not 0 <= value <= 65535:
            raise TraitError(
                f"c.TelemetrySettings.metrics_port {value}: a TCP port (1-65535), or 0 for none"
            )
        return value

    local_sampler = Bool(
        True,
        help="""Sample this node's GPUs, NICs and dataset cache in the service itself
        (the embedded default). Turn off where `gpulab agent` runs on every node.

        c.TelemetrySettings.local_sampler = False
        """,
    ).tag(config=True)

    sample_interval = Float(
        1.0,
        help="""Seconds between local telemetry samples.

        c.TelemetrySettings.sample_interval = 2.0
        """,
    ).tag(config=True)
