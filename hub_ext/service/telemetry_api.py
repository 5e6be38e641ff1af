"""Telemetry routes (``/api/v1/telemetry``) and the embedded local sampler.

Agents POST one sample per request (shape: ``gpulab.telemetry.sample``); in
the embedded default the service samples its own node every second instead.
``GET /telemetry?since=`` serves what the dashboard shows, under the same
visibility rules as allocations: a user sees their own slices, processes and
jobs plus totals; an admin sees everyone's, with names.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import os
import time

from tornado import web

from gpulab.telemetry import NodeSampler, SampleCollector, validate_sample

from .auth import APIHandler, Identity
from .telemetry_store import TelemetryStore

log = logging.getLogger("gpulab.service")

#: Services other than gpulab that may push samples (an agent's own service token).
AGENT_SERVICE = "gpulab-agent"


def _visible_sample(sample: dict, who: Identity) -> dict:
    """Hide other users' names on GPU processes from non-admins."""
    if who.admin or who.internal:
        return sample
    out = copy.deepcopy(sample)
    for gpu in out.get("gpus") or []:
        for proc in gpu.get("processes") or []:
            if proc.get("user") != who.name:
                proc.update({"user": None, "unix_user": None, "pid": None,
                             "cmdline": None, "other_user": True})
    return out


class TelemetryHandler(APIHandler):
    def get(self):
        who = self.require_identity()
        since = self.get_argument("since", None)
        try:
            since = float(since) if since not in (None, "") else None
            if since is not None and not math.isfinite(since):
                raise ValueError
        except ValueError:
            raise web.HTTPError(400, "'since' must be unix seconds, e.g. since=1764400000.5")
        svc = self.gpulab
        store: TelemetryStore = svc.telemetry
        mine = None if (who.admin or who.internal) else who.name
        nodes = {}
        for node, samples in store.since(since).items():
            nodes[node] = {"samples": [_visible_sample(s, who) for s in samples],
                           "missing": (samples[-1] if samples else
                                       (store.latest_for(node) or {})).get("missing", {})}
        slices = [{k: a[k] for k in ("user", "owner_kind", "owner", "node", "gpu_uuid",
                                     "gpu_index", "milli", "memory_mib")}
                  for a in svc.ledger.list(user=mine)]
        free = svc.ledger.free_sizes(svc.slice_sizes)
        allreduce = [r for r in store.allreduce() if mine is None or r.get("user") in (None, mine)]
        jobs = svc.jobs.summaries(mine) if getattr(svc, "jobs", None) else []
        self.write_json({
            "now": time.time(), "interval_s": svc.sample_interval, "nodes": nodes,
            "you": {"name": who.name, "admin": who.admin},
            "inventory": svc.inventory(), "slices": slices, "free_sizes": free,
            "jobs": jobs, "allreduce": allreduce,
        })

    def post(self):
        """An agent's sample. Only gpulab itself, the agent service and admins may push."""
        who = self.require_identity()
        if not (who.internal or who.admin or (who.kind == "service" and who.name == AGENT_SERVICE)):
            raise web.HTTPError(403, f"only the {AGENT_SERVICE} service or an admin may push samples")
        sample = self.json_body()
        problems = validate_sample(sample)
        if problems:
            raise web.HTTPError(400, "bad sample: " + "; ".join(problems))
        self.gpulab.telemetry.add(sample)
        self.write_json({"stored": True}, status=201)


class AllreduceHandler(APIHandler):
    """A user's all-reduce probe result (``%gpulab nettest``)."""

    def post(self):
        who = self.require_identity()
        body = self.json_body()
        try:
            busbw = float(body["busbw_bytes_per_second"])
            algbw = float(body["algbw_bytes_per_second"])
            size = int(body["size_bytes"])
            world = int(body["world_size"])
        except (KeyError, TypeError, ValueError):
            raise web.HTTPError(
                400, "expected busbw_bytes_per_second, algbw_bytes_per_second (numbers), "
                     "size_bytes and world_size (integers)") from None
        if not all(math.isfinite(x) and x >= 0 for x in (busbw, algbw)) or size < 1 or world < 1:
            raise web.HTTPError(400, "bandwidths must be finite and >= 0, size and world >= 1")
        result = {"ts": time.time(), "user": who.name, "busbw_bytes_per_second": busbw,
                  "algbw_bytes_per_second": algbw, "size_bytes": size, "world_size": world,
                  "backend": str(body.get("backend", "")),
                  "nodes": [str(n) for n in body.get("nodes") or []][:64],
                  "node": str((body.get("nodes") or [self.gpulab.node_name])[0]),
                  # The nettest job it ran in (``%gpulab nettest --nodes``), if any.
                  "job_id": str(body.get("job_id") or "")[:64] or None}
        self.gpulab.telemetry.add_allreduce(result)
        self.write_json(result, status=201)


routes = [
    (r"api/v1/telemetry", TelemetryHandler),
    (r"api/v1/telemetry/allreduce", AllreduceHandler),
]


def setup(service) -> None:
    """Attach the store and the exporter to the service (before it serves)."""
    service.telemetry = TelemetryStore()
    service.metrics.registry.register(SampleCollector(service.telemetry.latest_for_export))


async def start(service) -> None:
    """Sample this node every ``sample_interval`` seconds, off the event loop."""
    if not service.local_sampler:
        return
    sampler = NodeSampler(node=service.node_name,
                          cache_dir=os.environ.get("GPULAB_CACHE_DIR") or None)

    async def loop():
        while True:
            try:
                sample = await asyncio.to_thread(sampler.sample)
                sample["allreduce"] = []
                service.telemetry.add(sample)
            except Exception:
                log.exception("local telemetry sample failed")
            await asyncio.sleep(service.sample_interval)

    asyncio.ensure_future(loop())
