"""Alert notifications as Alertmanager's webhook JSON (``c.Alerting.alert_webhook_url``).

Each fired or resolved alert is one POST of the payload Alertmanager sends to a
``webhook_config`` receiver (version "4"), so whatever takes Alertmanager's
webhooks (a chat bridge, an incident tool, Alertmanager-aware scripts) takes
gpulab's. Deliveries queue and go out in order from a task of their own, each
retried with exponential backoff a bounded number of times, so a slow or dead
receiver never holds up the evaluation. The URL may hold a secret (a token in
its path or query): logs name only its scheme and host.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from urllib.parse import urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from gpulab.service.tasks import KeptTask

log = logging.getLogger("gpulab.service.operations.alerts")

#: Alertmanager's endsAt of an alert that still fires.
NEVER = "0001-01-01T00:00:00Z"
QUEUE_MAX = 1000


def redact(url: str) -> str:
    """The URL without what may be secret: user, password, path and query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<the webhook URL>"
    return (
        f"{parts.scheme}://{host}{port}/…"
        if parts.path not in ("", "/")
        else (f"{parts.scheme}://{host}{port}")
    )


def fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def payload(event: str, alert: dict, description: str, external_url: str) -> dict:
    """Alertmanager's webhook body for one alert that fired or resolved."""
    labels = {
        "alertname": alert["name"],
        "severity": alert["severity"],
        "subject_kind": alert["subject_kind"],
        "subject": alert["subject"],
        **{str(k): str(v) for k, v in (alert.get("labels") or {}).items()},
    }
    if alert.get("owner"):
        labels["owner"] = alert["owner"]
    annotations = {"summary": alert["message"], "description": description}
    status = "resolved" if event == "resolved" else "firing"
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{alert["name"]}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "gpulab",
        "groupLabels": {"alertname": alert["name"]},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": external_url,
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": annotations,
                "startsAt": alert["since"],
                "endsAt": alert.get("resolved_at") or NEVER,
                "generatorURL": external_url,
                "fingerprint": fingerprint(f"{alert['name']}|{alert['subject']}"),
            }
        ],
    }


class AlertWebhook:
    def __init__(
        self,
        url: str,
        external_url: str = "",
        attempts: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
    ):
        self.url = url
        self.external_url = external_url
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self.delivered = 0
        self.given_up = 0
        self._worker = KeptTask("gpulab-alert-webhook", self._run)

    def start(self) -> None:
        self._worker.start()

    async def stop(self) -> None:
        await self._worker.stop()
        if self.queue.qsize():
            log.warning(
                "%d alert notification(s) to %s not sent: the service stopped",
                self.queue.qsize(),
                redact(self.url),
            )

    def send(self, event: str, alert: dict, description: str) -> None:
        """Queue one notification; never waits."""
        if self.queue.qsize() >= QUEUE_MAX:
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            log.warning("Alert webhook %s: queue full, dropped the oldest", redact(self.url))
        self.queue.put_nowait(payload(event, alert, description, self.external_url))

    async def _run(self) -> None:
        while True:
            body = await self.queue.get()
            try:
                await self.deliver(body)
            except Exception:
                log.exception("Alert webhook %s", redact(self.url))

    async def deliver(self, body: dict) -> bool:
        """POST ``body``, retried with backoff; False when every try failed."""
        data = json.dumps(body)
        reason = ""
        for attempt in range(self.attempts):
            try:
                response = await AsyncHTTPClient().fetch(
                    HTTPRequest(
                        self.url,
                        method="POST",
                        body=data,
                        headers={"Content-Type": "application/json"},
                        request_timeout=self.timeout_s,
                        follow_redirects=False,
                    ),
                    raise_error=False,
                )
                if 200 <= response.code < 300:
                    self.delivered += 1
                    return True
                reason = f"HTTP {response.code}"
            except Exception as e:  # refused, timed out, a bad name: the same retry
                reason = f"{type(e).__name__}: {str(e).replace(self.url, redact(self.url))}"
            if attempt + 1 < self.attempts:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        self.given_up += 1
        log.warning(
            "Alert webhook %s: %s %s not delivered after %d tries (%s)",
            redact(self.url),
            body["alerts"][0]["labels"]["alertname"],
            body["status"],
            self.attempts,
            reason,
        )
        return False
