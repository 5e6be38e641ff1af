"""Client calls for telemetry: recent samples, slices and jobs; all-reduce results."""

from __future__ import annotations


class TelemetryAPI:
    async def telemetry(self, since: float | None = None) -> dict:
        """Everything the dashboard shows, newer than ``since`` (unix seconds).

        Shape (see the OpenAPI document): ``now``, ``interval_s``, ``nodes``
        (per node: ``samples`` newer than since, ``missing`` sources with the
        reason), ``inventory``, ``slices`` (yours; an admin's: everyone's),
        ``free_sizes`` per node, ``jobs`` and ``allreduce`` results.
        """
        return await self.request("GET", "/telemetry", query={"since": since})

    async def report_allreduce(self, result: dict) -> dict:
        """Record an all-reduce probe result (``%gpulab nettest``) for the dashboard."""
        return await self.request("POST", "/telemetry/allreduce", body=result)
