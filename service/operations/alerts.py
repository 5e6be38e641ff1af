"""The alert engine: the rules of :mod:`gpulab.service.operations.rules`, evaluated by the service
itself.

Every ``c.Alerting.alert_interval_seconds`` it takes a
:class:`~gpulab.service.operations.rules.Facts` snapshot
(:class:`~gpulab.service.operations.facts.FactsBuilder`) and
runs every rule on it. A finding must hold for its rule's ``for`` before it
*fires*; a fired alert is a row of ``gpulab_alerts`` (one per episode) that
*resolves* at the first round its finding is gone. Rows outlive a restart: the
engine reloads the unresolved ones on start and resolves, at its first round,
those whose cause has gone meanwhile. A rule that raises is logged and its open
alerts are left as they are for that round.

Others hear of each change through :meth:`AlertEngine.subscribe` (self-healing,
for one): ``callback("fired" | "resolved" | "acknowledged", alert)``, where ``alert`` has the
shape of ``GET /alerts``; a coroutine callback runs as a task of its own, and a
callback that raises is logged. With ``c.Alerting.alert_webhook_url`` each
change is also POSTed as Alertmanager's webhook JSON (:mod:`gpulab.service.operations.webhook`).
Resolved rows older than :data:`KEEP_RESOLVED_DAYS` days are pruned.

An alert's owner or an admin acknowledges it (:meth:`AlertEngine.acknowledge`): it
no longer counts as firing (the lab's badge, ``%gpulab``'s line) and subscribers hear
``"acknowledged"``; an alert about an event (a failed job:
:data:`~gpulab.service.operations.rules.RESOLVED_BY_ACKNOWLEDGING`) resolves then,
and its finding, which may hold for a while yet, does not fire it again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import json
import logging
import os
from collections.abc import Callable
from urllib.parse import urlsplit

from gpulab.db import clock as gpulab_clock
from gpulab.db.operations import AlertStore, alert_json, iso
from gpulab.service.operations.facts import FactsBuilder
from gpulab.service.operations.rules import (
    RESOLVED_BY_ACKNOWLEDGING,
    Facts,
    Finding,
    Rule,
    Thresholds,
    rules,
)
from gpulab.service.operations.webhook import AlertWebhook
from gpulab.service.tasks import KeptTask, TaskSet

log = logging.getLogger("gpulab.service.operations.alerts")

KEEP_RESOLVED_DAYS = 30
PRUNE_EVERY_S = 3600
STATES = ("firing", "resolved", "all")


class AlertEngine:
    """Judges the :class:`FactsBuilder`'s facts with the rules every ``interval``
    seconds; keeps the alerts in ``engine``'s table (written on ``db_threads``); tells
    subscribers and the webhook (``webhook_url``) what fired and what resolved."""

    def __init__(
        self,
        *,
        builder: FactsBuilder,
        thresholds: Thresholds,
        engine,
        db_threads,
        interval: float,
        webhook_url: str = "",
        prefix: str = "/services/gpulab/",
        clock=gpulab_clock.now,
    ):
        self.engine = engine
        self.rows = AlertStore(engine)
        self.db_threads = db_threads
        self.prefix = prefix
        self.clock = clock
        self.interval = float(interval)
        self.thresholds = thresholds
        self.rules: list[Rule] = rules(self.thresholds)
        self.by_name = {r.name: r for r in self.rules}
        self.builder = builder
        self.webhook = (
            AlertWebhook(webhook_url, external_url=self._external_url()) if webhook_url else None
        )
        #: The latest snapshot (for the metrics the chart's rules read).
        self.last_facts: Facts | None = None
        self._open: dict[str, dict] = {}  # key -> the firing alert
        self._pending: dict[str, float] = {}  # key -> when its finding was first seen
        #: Keys whose alert was resolved by acknowledging it: not fired again while
        #: their finding holds (forgotten once it is gone).
        self._acknowledged: set[str] = set()
        self._subscribers: list[Callable] = []
        self._tasks = TaskSet()  # awaitable subscribers' answers
        self._pruned_at = 0.0
        self._loop = KeptTask("gpulab-alerts", self.loop)

    def _external_url(self) -> str:
        # The hub's public origin, where it is known; the prefix carries any base_url.
        public = urlsplit(os.environ.get("JUPYTERHUB_PUBLIC_URL", ""))
        origin = f"{public.scheme}://{public.netloc}" if public.netloc else ""
        return f"{origin}{self.prefix.rstrip('/')}/api/v1/alerts"

    # -- running ---------------------------------------------------------------------
    async def start(self) -> None:
        """Reload the alerts still firing (a restart), then evaluate every interval."""
        try:
            rows = await self.db_threads.run(self.rows.open)
            self._open = {r.key: alert_json(r) | {"_key": r.key} for r in rows}
            since = dt.datetime.fromtimestamp(self.clock(), dt.UTC) - dt.timedelta(days=1)
            self._acknowledged = await self.db_threads.run(self.rows.acknowledged_keys, since)
        except Exception:
            log.exception("Reloading open alerts")
        if self.webhook is not None:
            self.webhook.start()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self._tasks.cancel()
        if self.webhook is not None:
            await self.webhook.stop()

    async def loop(self) -> None:
        while True:
            try:
                await self.evaluate()
            except Exception:  # the loop outlives a bad round (a database hiccup)
                log.exception("alert evaluation")
            await asyncio.sleep(self.interval)

    def subscribe(self, callback: Callable) -> Callable[[], None]:
        """``callback(event, alert)`` on each change; returns the unsubscribe call."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def firing(self) -> list[dict]:
        """The alerts firing now (the service's memory of them)."""
        return [_public(a) for a in self._open.values()]

    # -- one round -------------------------------------------------------------------
    async def evaluate(self) -> None:
        facts = await self.builder.build()
        self.last_facts = facts
        now = facts.now
        found: dict[str, tuple[Rule, Finding]] = {}
        broken: set[str] = set()
        for rule in self.rules:
            try:
                for finding in rule.evaluate(facts):
                    found[f"{rule.name}|{finding.subject}"] = (rule, finding)
            except Exception:
                log.exception("Alert rule %s", rule.name)
                broken.add(rule.name)
        for key in set(self._pending) - set(found):
            del self._pending[key]
        self._acknowledged &= set(found)  # their causes gone: may fire again later
        for key in self._acknowledged:
            found.pop(key, None)
        fire, changed = [], []
        for key, (rule, finding) in found.items():
            alert = self._open.get(key)
            if alert is not None:
                if (alert["message"], alert["labels"], alert["owner"]) != (
                    finding.message,
                    finding.labels,
                    finding.owner,
                ):
                    changed.append((alert, finding))
                continue
            first = self._pending.setdefault(key, now)
            if now - first >= rule.for_s:
                fire.append((key, rule, finding, first))
        resolve = [
            a for key, a in self._open.items() if key not in found and a["name"] not in broken
        ]
        if not (fire or changed or resolve) and now - self._pruned_at < PRUNE_EVERY_S:
            return
        fired, resolved = await self.db_threads.run(self._write, now, fire, changed, resolve)
        for alert in fired:
            self._pending.pop(alert["_key"], None)
            self._open[alert["_key"]] = alert
            self._notify("fired", alert)
        for alert in resolved:
            self._open.pop(alert["_key"], None)
            self._notify("resolved", alert)

    # -- acknowledging -------------------------------------------------------------------
    async def acknowledge(self, row, by: str) -> dict:
        """``by`` has seen the alert of ``row`` (a ``gpulab_alerts`` row the caller may
        see); the alert as ``GET /alerts`` shows it now. Acknowledging again changes
        nothing."""
        resolve = row.name in RESOLVED_BY_ACKNOWLEDGING and row.resolved_at is None
        at = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        after = await self.db_threads.run(self.rows.acknowledge, row.id, by, at, resolve)
        alert = alert_json(after)
        key = after.key
        held = self._open.get(key)
        if held is None or held.get("id") != row.id:
            return alert  # resolved already, or another episode fires now
        if resolve:
            self._open.pop(key, None)
            self._pending.pop(key, None)
            self._acknowledged.add(key)
            self._notify("resolved", held | alert)
        elif row.acknowledged_at is None:
            held.update(acknowledged_at=alert["acknowledged_at"], acknowledged_by=by)
            self._notify("acknowledged", held)
        return alert

    # -- the table -----------------------------------------------------------------------
    def _write(self, now: float, fire: list, changed: list, resolve: list):
        at = dt.datetime.fromtimestamp(now, dt.UTC)
        rows = [
            {
                "key": key[:400],
                "name": rule.name,
                "severity": rule.severity,
                "subject_kind": f.subject_kind,
                "subject": f.subject[:255],
                "owner": f.owner,
                "message": f.message,
                "labels": json.dumps(f.labels),
                "since": dt.datetime.fromtimestamp(first, dt.UTC),
                "resolved_at": None,
            }
            for key, rule, f, first in fire
        ]
        prune_before = None
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            prune_before = at - dt.timedelta(days=KEEP_RESOLVED_DAYS)
        updates = [
            (alert["id"], {"message": f.message, "labels": json.dumps(f.labels), "owner": f.owner})
            for alert, f in changed
        ]
        inserted, gone = self.rows.write_round(
            at, rows, updates, [a["id"] for a in resolve], prune_before
        )
        if gone:
            log.info("Pruned %d alert(s) resolved over %d days ago", gone, KEEP_RESOLVED_DAYS)
        for alert, f in changed:
            alert.update(message=f.message, labels=f.labels, owner=f.owner)
        fired = [alert | {"_key": key} for alert, (key, *_) in zip(inserted, fire, strict=True)]
        resolved = [alert | {"state": "resolved", "resolved_at": iso(at)} for alert in resolve]
        return fired, resolved

    # -- telling others ------------------------------------------------------------------
    def _notify(self, event: str, alert: dict) -> None:
        public = _public(alert)
        log.info(
            "Alert %s %s: %s (%s)", public["name"], event, public["subject"], public["message"]
        )
        if self.webhook is not None and event != "acknowledged":  # seen: no new message
            rule = self.by_name.get(public["name"])
            self.webhook.send(event, public, rule.description if rule else "")
        for callback in list(self._subscribers):
            try:
                result = callback(event, dict(public))
            except Exception:
                log.exception("Alert subscriber %r", callback)
                continue
            if inspect.isawaitable(result):
                self._tasks.spawn(self._guard(callback, result))

    @staticmethod
    async def _guard(callback, awaitable) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Alert subscriber %r", callback)


def _public(alert: dict) -> dict:
    return {k: v for k, v in alert.items() if not k.startswith("_")}
