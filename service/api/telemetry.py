"""Telemetry routes (``/api/v1/telemetry``).

The store (``GpuLabService.telemetry``) and the local sampler
(:mod:`gpulab.service.telemetry.local_sampler`) are made by the service's
``init_telemetry``.

Agents POST one sample per request (shape: ``gpulab.telemetry.sample``); in
the embedded default the service samples its own node every second instead.
``GET /telemetry?since=`` serves what the dashboard shows, under the same
visibility rules as allocations: a user sees their own slices, processes and
jobs plus totals; an admin sees everyone's, with names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time

import orjson
from tornado import web

from gpulab.service.api.page_views import holder_name, version_names
from gpulab.service.auth import APIHandler, Identity
from gpulab.service.telemetry.allreduce import BadResult
from gpulab.service.telemetry.allreduce import validate as validate_allreduce
from gpulab.service.telemetry.store import TelemetryStore
from gpulab.telemetry import validate_sample

log = logging.getLogger("gpulab.service")

#: Services other than gpulab that may push samples (an agent's own service token).
AGENT_SERVICE = "gpulab-agent"


#: What a user sees of another user's GPU process: that it is there, and its memory.
_HIDDEN = {"user": None, "unix_user": None, "pid": None, "cmdline": None, "other_user": True}


def _visible_sample(sample: dict, who: Identity) -> dict:
    """Hide other users' names on GPU processes from non-admins. The stored sample is
    shared by every viewer: only the dicts that change are copied (a deep copy of a
    node's 15 minutes cost as much as encoding them)."""
    if who.admin or who.internal or not sample.get("gpus"):
        return sample

    def hidden(procs: list[dict]) -> list[dict]:
        return [p if p.get("user") == who.name else {**p, **_HIDDEN} for p in procs]

    def gpu(g: dict) -> dict:
        # A MIG device lists its own processes: hidden the same way as a card's.
        migs = g.get("mig") or []
        if not g.get("processes") and not any(m.get("processes") for m in migs):
            return g
        shown = {**g, "processes": hidden(g.get("processes") or [])}
        if migs:
            shown["mig"] = [{**m, "processes": hidden(m.get("processes") or [])} for m in migs]
        return shown

    return {**sample, "gpus": [gpu(g) for g in sample["gpus"]]}


def _encoded(answer: dict) -> bytes:
    """The answer in JSON: orjson's (a node's 15 minutes of samples, 4 to 27 MB, took
    json 120 to 470 ms of the service's loop, orjson a twentieth), json's for what
    orjson does not write (an integer past 64 bits)."""
    try:
        return orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(answer).encode()


def _push_refusal(who: Identity) -> web.HTTPError | None:
    """Why ``who`` may not push a sample (None: they may)."""
    if who.internal or who.admin or (who.kind == "service" and who.name == AGENT_SERVICE):
        return None
    return web.HTTPError(403, f"only the {AGENT_SERVICE} service or an admin may push samples")


class TelemetryHandler(APIHandler):
    def body_limit(self) -> int:
        # A node's sample lists every GPU process; agents are trusted, not unbounded.
        return 8 << 20

    async def get(self):
        who = self.require_identity()
        since = self.get_argument("since", None)
        try:
            since = float(since) if since is not None else None
            if since is not None and not math.isfinite(since):
                raise ValueError
        except ValueError:
            raise web.HTTPError(
                400, "'since' must be unix seconds, e.g. since=1764400000.5"
            ) from None
        svc = self.gpulab
        store: TelemetryStore = svc.telemetry
        mine = None if (who.admin or who.internal) else who.name
        nodes = {}
        for node, samples in store.since(since).items():
            nodes[node] = {
                "samples": [_visible_sample(s, who) for s in samples],
                "missing": (samples[-1] if samples else (store.latest_for(node) or {})).get(
                    "missing", {}
                ),
            }
        versions = version_names(svc, mine)
        slices = [
            {
                **{
                    k: a[k]
                    for k in (
                        "user",
                        "owner_kind",
                        "owner",
                        "node",
                        "gpu_uuid",
                        "gpu_index",
                        "milli",
                        "memory_mib",
                    )
                },
                # What holds it, as the service's pages name it (not a version id).
                "name": holder_name(svc, a, versions)[0],
            }
            for a in svc.ledger.list(user=mine)
        ]
        free = svc.ledger.free_sizes(svc.inventory_settings.slice_sizes)
        allreduce = [r for r in store.allreduce() if mine is None or r.get("user") in (None, mine)]
        # Reads each running job's metrics file (its end): in a thread.
        jobs = await asyncio.to_thread(svc.jobs.summaries, mine) if svc.jobs is not None else []
        self.set_header("Content-Type", "application/json")
        self.finish(
            _encoded(
                {
                    "now": time.time(),
                    "interval_s": svc.telemetry_settings.sample_interval,
                    "nodes": nodes,
                    "you": {"name": who.name, "admin": who.admin},
                    "inventory": svc.inventory(),
                    "slices": slices,
                    "free_sizes": free,
                    "jobs": jobs,
                    "allreduce": allreduce,
                }
            )
        )

    async def prepare(self):
        await super().prepare()
        if self.request.method == "POST" and self.identity is not None:
            refusal = _push_refusal(self.identity)
            if refusal is not None:
                # A user's 8 MiB (this route's limit, for agents) is read and dropped,
                # not kept in the service's memory until the 403.
                self.refuse_after_body(refusal)

    def post(self):
        """An agent's sample. Only gpulab itself, the agent service and admins may push."""
        refusal = _push_refusal(self.require_identity())
        if refusal is not None:
            raise refusal
        sample = self.json_body()
        problems = validate_sample(sample)
        if problems:
            raise web.HTTPError(400, "bad sample: " + "; ".join(problems))
        self.gpulab.telemetry.add(sample)
        self.write_json({"stored": True}, status=201)


class AllreduceHandler(APIHandler):
    """An all-reduce result from an admin or the service itself.

    Users' results come from their probe jobs (``%gpulab nettest``), which the
    service reads when the job succeeds (:mod:`gpulab.service.telemetry.allreduce`); a number a
    user could simply post would be shown to everyone by ``/metrics``.
    """

    def post(self):
        who = self.require_identity()
        if not (who.internal or who.admin):
            raise web.HTTPError(
                403,
                "all-reduce results are recorded from nettest jobs, not posted: run "
                "%gpulab nettest --nodes 1 (or more) and the service records the job's "
                "result when it succeeds",
            )
        body = self.json_body()
        try:
            result = validate_allreduce({k: v for k, v in body.items() if k != "job_id"})
        except BadResult as e:
            raise web.HTTPError(400, f"bad all-reduce result: {e}") from None
        job_id = body.get("job_id")
        record = {
            "ts": time.time(),
            "user": who.name,
            **result,
            "node": (result["nodes"] or [self.gpulab.inventory_settings.node_name])[0],
            "job_id": job_id[:64] if isinstance(job_id, str) and job_id else None,
        }
        self.gpulab.telemetry.add_allreduce(record)
        self.write_json(record, status=201)


routes = [
    (r"api/v1/telemetry", TelemetryHandler),
    (r"api/v1/telemetry/allreduce", AllreduceHandler),
]
