"""How the service acts on its alert rules: how often it judges them, where alerts
go, what a stalled job gets. ``c.Alerting.*`` in the service's config (the rules'
thresholds are :class:`~gpulab.service.operations.rules.Thresholds`)."""

from __future__ import annotations

from traitlets import Float, Int, Unicode, validate
from traitlets.config import Configurable

from ..setting_checks import positive, zero_or_more


class Alerting(Configurable):
    """Read by the alert engine (:class:`~gpulab.service.operations.alerts.AlertEngine`)
    and what acts on its alerts (:class:`~gpulab.service.operations.actions.AlertActions`)."""

    alert_interval_seconds = Float(
        15.0,
        help="""Seconds between two evaluations of the alert rules by the service
        (docs/howto/alerts.md).

        c.Alerting.alert_interval_seconds = 30
        """,
    ).tag(config=True)

    alert_webhook_url = Unicode(
        "",
        help="""Where to POST each alert that fires or resolves, as Alertmanager's webhook
        JSON (version 4); empty: nowhere. Retried with backoff; the URL is never logged
        beyond its host, so it may carry a token.

        c.Alerting.alert_webhook_url = "https://hooks.example.org/gpulab?token=..."
        """,
    ).tag(config=True)

    job_stall_restarts = Int(
        0,
        help="""How often a stalled job (JobStalled: no report() for
        c.Thresholds.job_stall_seconds) is restarted from its latest checkpoint before
        it is left to its owner. 0: never.

        c.Alerting.job_stall_restarts = 2
        """,
    ).tag(config=True)

    @validate("alert_interval_seconds")
    def _positive(self, proposal):
        return positive(proposal)

    @validate("job_stall_restarts")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "off")
