"""The site's telemetry settings (``c.TelemetrySettings.<name>``): whether the service
samples its own node and how often (read where it builds the
:class:`~gpulab.service.telemetry.local_sampler.LocalSampler`, and by the telemetry
route), and whether ``/metrics`` asks for a token (the metrics route)."""

from __future__ import annotations

from traitlets import Bool, Float
from traitlets.config import Configurable


class TelemetrySettings(Configurable):
    authenticate_prometheus = Bool(
        True,
        help="""Require a hub token for /metrics (as JupyterHub does for its own). Every
        series needs an admin or a token with JupyterHub's read:metrics scope (give
        Prometheus one); a user's token reads the cluster's series and those of the
        user's own jobs and endpoints. Off: a call without a token reads every series
        straight at the service's port, and the cluster's only through the hub's proxy
        (the Helm chart's annotation scrape; keep users off the service's port).

        c.TelemetrySettings.authenticate_prometheus = False
        """,
    ).tag(config=True)

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
