"""Alerts through the service (``GET /alerts``): what the dashboard's Alerts tab and
``%gpulab alerts`` show.

A mixin of :class:`~.base.AsyncClient`; the sync :class:`~.base.Client` has the
same method, blocking::

    answer = gl.alerts()                  # firing and resolved, last 24 h
    answer["firing"]                      # how many of them fire now, not acknowledged
    gl.alerts(state="firing")["alerts"]   # only those that fire now
    gl.acknowledge_alert(12)              # seen: it stops counting as firing

Users get the alerts about their own things; admins every alert, also those
about shared things (GPUs, nodes, disks: ``owner`` None).
"""

from __future__ import annotations

from datetime import datetime

from .usage import iso

#: What ``state`` may be: one of the two states an alert is in, or both.
ALERT_QUERY_STATES = ("firing", "resolved", "all")
#: The states of one alert: it fires, then (a new row for a new episode) resolves.
ALERT_STATES = ("firing", "resolved")
#: How bad an alert is, worst first.
ALERT_SEVERITIES = ("critical", "warning", "info")


class AlertsAPI:
    async def alerts(self, state: str = "all", since: datetime | str | None = None) -> dict:
        """Alerts that fired or resolved since ``since`` (default: the service's, 24 h ago).

        ``state`` is ``"firing"``, ``"resolved"`` or ``"all"``. Answer, newest first::

            {"alerts": [{"id": 12, "name": "JobStalled", "severity": "critical",
                         "state": "firing", "subject_kind": "job", "subject": "3f2a...",
                         "owner": "alice", "since": "2026-12-01T10:00:00Z",
                         "resolved_at": None, "acknowledged_at": None,
                         "acknowledged_by": None, "message": "...", "labels": {}}],
             "firing": 1}

        ``firing`` counts the listed alerts that fire now and nobody acknowledged. A
        service older than alerts answers 404 (:class:`~.errors.NotFound`); a bad ``state`` or
        ``since`` 400 (:class:`~.errors.BadRequest`).
        """
        return await self.request("GET", "/alerts", query={"state": state, "since": iso(since)})

    async def acknowledge_alert(self, alert_id: int) -> dict:
        """Say you have seen alert ``alert_id`` (yours; an admin: anyone's). It stops
        counting as firing (``acknowledged_at``, ``acknowledged_by`` set); an alert about
        an event (a failed job's ``JobFailed``) resolves. Another user's alert, or one
        that does not exist: :class:`~.errors.NotFound`. Answers the alert."""
        return await self.request("POST", f"/alerts/{int(alert_id)}/ack")


__all__ = ["ALERT_QUERY_STATES", "ALERT_SEVERITIES", "ALERT_STATES", "AlertsAPI"]
