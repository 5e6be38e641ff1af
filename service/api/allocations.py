"""REST routes of the service, under ``<hub>/services/gpulab/``.

Shapes are described in :mod:`gpulab.service.api.openapi`; every route identifies the caller
first (:class:`.auth.APIHandler`) and users only ever see their own rows.
"""

from __future__ import annotations

import datetime as dt
import time

from tornado import web

from gpulab.scheduler.budget import BudgetExceeded
from gpulab.scheduler.ledger import OWNER_KINDS, NoCapacity, OwnerConflict
from gpulab.scheduler.quota import QuotaExceeded
from gpulab.scheduler.slices import SliceError, noun, parse_gpu_milli
from gpulab.service.api.gpus import public_cordon
from gpulab.service.api.openapi import openapi_document
from gpulab.service.auth import APIHandler
from gpulab.service.operations.ledger_guard import refuse_live_release


class InventoryHandler(APIHandler):
    def get(self):
        self.require_identity()
        self.write_json(self.gpulab.inventory())


def _string(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > 255 or "\x00" in value:
        raise web.HTTPError(400, f"'{key}' must be a non-empty string of at most 255 characters")
    return value


class ReleaseMixin:
    def force(self) -> bool:
        """``?force=1``: an admin's release stops the owner that still holds the slice."""
        value = self.get_argument("force", "0").lower()
        if value not in ("0", "1", "true", "false"):
            raise web.HTTPError(400, f"force must be 1 or 0, not {value!r}")
        return value in ("1", "true")


class AllocationsHandler(ReleaseMixin, APIHandler):
    audit_actions = {"POST": "allocation.create", "DELETE": "allocation.release"}

    async def get(self):
        user = self.listed_user("allocations")
        self.write_json(
            await self.gpulab.ledger.aio.list(
                user=user,
                owner_kind=self.get_argument("owner_kind", None),
                owner=self.get_argument("owner", None),
            )
        )

    async def post(self):
        """Allocate a slice for an owner. Used by the hub's spawner (and admins)."""
        who = self.require_identity()
        body = self.json_body()
        unknown = set(body) - {"user", "owner_kind", "owner", "gpu_milli"}
        if unknown:
            raise web.HTTPError(
                400, f"unknown {noun(len(unknown), 'field')}: {', '.join(sorted(unknown))}"
            )
        user = _string(body, "user")
        owner_kind = _string(body, "owner_kind")
        owner = _string(body, "owner")
        if owner_kind not in OWNER_KINDS:
            raise web.HTTPError(400, f"owner_kind must be one of {', '.join(OWNER_KINDS)}")
        self.audit_subject, self.audit_user = owner, user
        if not (who.internal or who.admin):
            raise web.HTTPError(
                403,
                "allocations are made by starting a server, submitting a job or "
                "deploying a model, not directly",
            )
        try:
            milli = parse_gpu_milli(
                body.get("gpu_milli"), tuple(self.gpulab.inventory_settings.slice_sizes)
            )
        except SliceError as e:
            raise web.HTTPError(400, str(e)) from None
        if owner_kind == "server":  # jobs and deployments are checked where they are sent
            try:
                await self.gpulab.budgets.refuse_over_budget(user, milli)
            except BudgetExceeded as e:
                raise web.HTTPError(403, str(e)) from None
        groups = await self.gpulab.hub_groups.groups_of(user)
        started = time.perf_counter()
        result = "placed"
        place = self.gpulab.ledger_for(owner_kind)
        try:
            rows = await place.aio.allocate(user, owner_kind, owner, milli, groups)
        except NoCapacity as e:
            claim = await self.gpulab.preemption.make_room_for(user, owner_kind, [(owner, milli)])
            if claim is None:
                # The room may have come meanwhile: a claim for this owner placed (its
                # rows are the owner's now) or a victim gone. Ask once more first.
                try:
                    rows = await place.aio.allocate(user, owner_kind, owner, milli, groups)
                except NoCapacity:
                    result = "no_capacity"
                    raise web.HTTPError(409, str(e)) from None
            else:
                # Preemptible jobs are stopping for this owner: ask again shortly.
                result = "preempting"
                self.write_json(
                    {"state": "freeing", "message": claim.message(), "retry_after": 1},
                    status=202,
                )
                return
        except QuotaExceeded as e:
            result = "over_quota"
            raise web.HTTPError(403, str(e)) from None
        except OwnerConflict as e:
            result = "conflict"
            raise web.HTTPError(409, str(e)) from None
        finally:
            self.gpulab.metrics.observe_placement(result, time.perf_counter() - started)
        if self._placed_now(rows):  # not an owner's retry that got its rows back
            await self.audit(
                "allocation.create", owner, user=user, kind=owner_kind, gpu_milli=milli
            )
        simulated = {g.uuid for g in self.gpulab.gpus if g.simulated}
        self.write_json([{**r, "simulated": r["gpu_uuid"] in simulated} for r in rows], status=201)

    def _placed_now(self, rows: list[dict]) -> bool:
        began = time.time() - self.request.request_time()
        return any(dt.datetime.fromisoformat(r["created"]).timestamp() >= began for r in rows)

    async def delete(self):
        """Release everything one owner holds: ``?owner_kind=server&owner=alice/``."""
        who = self.require_identity()
        owner_kind = self.get_argument("owner_kind")
        owner = self.get_argument("owner")
        held = await self.gpulab.ledger.aio.list(owner_kind=owner_kind, owner=owner)
        if held and not who.can_act_for(held[0]["user"]):
            raise web.HTTPError(404, f"no allocations for {owner_kind} {owner!r}")
        stopped = None
        if held:
            stopped = await refuse_live_release(
                self.gpulab, who, owner_kind, owner, force=self.force()
            )
        released = await self.gpulab.ledger.aio.release(owner_kind, owner) if held else []
        if stopped:  # stopping it may have released its rows already (the spawner)
            released = released or held
        if released or stopped:
            await self.audit(
                "allocation.release", owner, user=held[0]["user"], kind=owner_kind, stopped=stopped
            )
        if owner_kind == "server" and who.internal:  # the hub's spawner: the server stopped
            await self.gpulab.server_stopped(owner)
        self.write_json({"released": released, "stopped": stopped})


class AllocationHandler(ReleaseMixin, APIHandler):
    audit_actions = {"DELETE": "allocation.release"}

    async def _find(self, alloc_id: str) -> dict:
        who = self.require_identity()
        row = await self.gpulab.ledger.aio.get(alloc_id)
        # Another user's allocation answers exactly like a missing one.
        if row is None or not who.can_act_for(row["user"]):
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        return row

    async def get(self, alloc_id):
        self.write_json(await self._find(alloc_id))

    async def delete(self, alloc_id):
        row = await self._find(alloc_id)
        kind, owner = row["owner_kind"], row["owner"]
        held = await self.gpulab.ledger.aio.list(owner_kind=kind, owner=owner)
        stopped = await refuse_live_release(
            self.gpulab, self.identity, kind, owner, force=self.force()
        )
        released = await self.gpulab.ledger.aio.release(kind, owner)
        if stopped:  # stopping it may have released its rows already (the spawner)
            released = released or held
        if released or stopped:
            await self.audit(
                "allocation.release",
                row["owner"],
                user=row["user"],
                kind=row["owner_kind"],
                stopped=stopped,
            )
        self.write_json({"released": released, "stopped": stopped})


class AvailabilityHandler(APIHandler):
    """How many of each slice size the user could get now (drives the spawn form)."""

    async def get(self):
        who = self.require_identity()
        user = self.get_argument("user", who.name)
        if not who.can_act_for(user):
            raise web.HTTPError(403, "you can only ask about your own availability")
        groups = await self.gpulab.hub_groups.groups_of(user)
        # What the spawn form offers: the pool servers start in.
        place = self.gpulab.ledger_for("server")
        sizes = await place.aio.availability(
            user, self.gpulab.inventory_settings.slice_sizes, groups
        )
        usage = (await self.gpulab.ledger.aio.usage()).get(user, 0)
        cordons = await self.gpulab.ledger.aio.run(self.gpulab.ledger.cordons)
        budget = await self.gpulab.budgets.budget_of(user)
        self.write_json(
            {
                "user": user,
                # GPU-hours used and left this period (null where no budget applies)
                "budget": budget if budget["set"] or budget["price_per_gpu_hour"] else None,
                "held_milli": usage,
                "quota_milli": self.gpulab.ledger.quotas.remaining(user, {}, groups),
                "simulated": any(g.simulated for g in self.gpulab.gpus),
                "sizes": [s.to_dict() for s in sizes],
                # GPUs out of service (self-healing or an admin): the sizes leave them out.
                "cordoned": [
                    {"uuid": g.uuid, "index": g.index, "node": g.node, **public_cordon(c)}
                    for g in self.gpulab.gpus
                    if (c := self.gpulab.ledger.cordon_of(g, cordons)) is not None
                ],
            }
        )


class OpenAPIHandler(APIHandler):
    def get(self):
        self.require_identity()
        self.write_json(openapi_document(self.gpulab.prefix))


#: JupyterHub's scope for reading metrics: a token with it (Prometheus') reads every series.
METRICS_SCOPE = "read:metrics"


class MetricsHandler(APIHandler):
    """Prometheus text. Series of one job or endpoint go to admins, the service and
    tokens with ``read:metrics`` (even without the service's access scope, as the
    hub's own ``/hub/metrics``); a user gets the cluster's series and their own.
    Where ``c.TelemetrySettings.authenticate_prometheus`` is off, a call without a
    token gets the cluster's series: users reach this port (their pods call the API
    on it), so every series without a token is only on ``metrics_port``
    (:class:`ScrapeHandler`)."""

    def set_default_headers(self):
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")

    def get(self):
        who = self.identity
        scopes = (self.hub_model or {}).get("scopes") or ()
        if (who is not None and (who.admin or who.internal)) or METRICS_SCOPE in scopes:
            mine = None
        elif who is not None:
            mine = self._ids_of(who.name)
        elif self.gpulab.telemetry_settings.authenticate_prometheus:
            self.require_identity()  # 401, or 403 naming the missing scope
        else:
            mine = frozenset()  # anyone: no one's jobs, endpoints or name
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(self.gpulab.metrics.render(mine, who.name if who is not None else ""))

    def _ids_of(self, user: str) -> frozenset[str]:
        """The ids of the user's jobs and endpoints (the owner labels' values)."""
        ids: set[str] = set()
        if self.gpulab.jobs is not None:
            ids |= {j["id"] for j in self.gpulab.jobs.queue.list(user=user)}
        if self.gpulab.deployments is not None:
            ids |= {d["id"] for d in self.gpulab.deployments.store.list(user=user)}
        return frozenset(ids)


class ScrapeHandler(web.RequestHandler):
    """Every series, without a token: served only on ``c.TelemetrySettings.metrics_port``
    (:meth:`~gpulab.service.app.GpuLabService.make_metrics_app`), a port the network
    lets only the scraper reach."""

    def get(self):
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(self.settings["gpulab"].metrics.render(None, ""))


routes = [
    (r"api/v1/inventory", InventoryHandler),
    (r"api/v1/allocations", AllocationsHandler),
    (r"api/v1/allocations/([^/]+)", AllocationHandler),
    (r"api/v1/availability", AvailabilityHandler),
    (r"api/v1/openapi.json", OpenAPIHandler),
    (r"metrics", MetricsHandler),
]
