"""How long the audit trail keeps its entries and whose X-Forwarded-For it believes:
``c.AuditTrail.*`` in the service's config, read by
:class:`~gpulab.service.operations.audit.AuditLog`."""

from __future__ import annotations

from traitlets import Float, Int, List, Unicode, validate
from traitlets.config import Configurable

from gpulab.service.operations.audit import LOOPBACK

from ..setting_checks import positive, zero_or_more


class AuditTrail(Configurable):
    """The audit trail's retention and trusted proxies."""

    audit_retention_days = Float(
        365.0,
        help="""Days the audit trail (GET /api/v1/audit) keeps an entry; older ones are
        deleted once an hour. 0: keep every entry forever.

        c.AuditTrail.audit_retention_days = 730
        """,
    ).tag(config=True)

    audit_trusted_proxies = List(
        Unicode(),
        list(LOOPBACK),
        help="""Addresses (or networks) of the proxies in front of the hub and the service,
        whose X-Forwarded-For the audit trail believes when it records where a change
        came from. Default: this machine (the embedded hub's proxy). On Kubernetes, add
        the pods' network, and an ingress's address if one is in front.

        c.AuditTrail.audit_trusted_proxies = ["127.0.0.0/8", "::1/128", "10.0.0.0/8"]
        """,
    ).tag(config=True)

    denials_per_minute = Int(
        60,
        help="""Refusals (403) of one caller the audit trail writes a minute. Past it,
        the rest of that minute's are counted, not written, and the caller's next
        entry says how many were not (detail.unwritten_denials): one caller looping
        on a refused request would otherwise fill the trail and hold every other
        change's write behind its own.

        c.AuditTrail.denials_per_minute = 600
        """,
    ).tag(config=True)

    @validate("denials_per_minute")
    def _positive(self, proposal):
        return positive(proposal)

    @validate("audit_retention_days")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "keep every entry")
