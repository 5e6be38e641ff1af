"""Admins' routes for GPUs (``/api/v1/gpus``): cordon one, and uncordon it.

A cordoned GPU takes no new slice (the ledger's placement passes it by); what it
holds stays until its owner moves or stops. The service cordons a GPU itself when
it faults (:mod:`gpulab.service.operations.self_healing`: XID errors, uncorrectable ECC errors,
lost); an
admin cordons one for maintenance and uncordons it once it is fixed::

    POST /api/v1/gpus/GPU-1234.../cordon    {"reason": "RMA: fan failure"}
    POST /api/v1/gpus/GPU-1234.../uncordon

``GET /api/v1/inventory`` shows each GPU's ``cordoned`` ({"reason", "by", "since"},
or null).
"""

from __future__ import annotations

from tornado import web

from gpulab.scheduler.ledger import UnknownGpu
from gpulab.scheduler.slices import noun
from gpulab.service.auth import APIHandler

#: Longest reason kept (it goes to the inventory, the audit trail and job messages).
MAX_REASON = 1000


def public_cordon(cordon: dict | None) -> dict | None:
    """A cordon as the API shows it: {"reason", "by", "since"}, or None."""
    if cordon is None:
        return None
    return {k: cordon[k] for k in ("reason", "by", "since")}


class _GpuHandler(APIHandler):
    def require_admin(self) -> str:
        who = self.require_identity()
        if not (who.admin or who.internal):
            raise web.HTTPError(
                403, "only admins cordon and uncordon GPUs; ask one (GET /inventory shows them)"
            )
        return who.name

    def unknown(self, uuid: str) -> web.HTTPError:
        return web.HTTPError(
            404, f"no GPU {uuid} here; GET /api/v1/inventory lists the GPUs and their UUIDs"
        )


class CordonHandler(_GpuHandler):
    audit_actions = {"POST": "gpu.cordon"}

    async def post(self, uuid):
        admin = self.require_admin()
        body = self.json_body()
        reason = body.get("reason")
        unknown = set(body) - {"reason"}
        if unknown:
            raise web.HTTPError(
                400, f"unknown {noun(len(unknown), 'field')}: {', '.join(sorted(unknown))}"
            )
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            raise web.HTTPError(
                400,
                f"'reason' must say why, in at most {MAX_REASON} characters, "
                f'e.g. {{"reason": "RMA: fan failure"}}',
            )
        ledger = self.gpulab.ledger
        try:
            cordon, made = await ledger.aio.run(ledger.cordon, uuid, reason.strip(), admin)
        except UnknownGpu:
            raise self.unknown(uuid) from None
        if made:
            await self.audit("gpu.cordon", uuid, reason=reason.strip())
        self.write_json({"uuid": uuid, "cordoned": public_cordon(cordon), "changed": made})


class UncordonHandler(_GpuHandler):
    audit_actions = {"POST": "gpu.uncordon"}

    async def post(self, uuid):
        self.require_admin()
        ledger = self.gpulab.ledger
        try:
            was = await ledger.aio.run(ledger.uncordon, uuid)
        except UnknownGpu:
            raise self.unknown(uuid) from None
        if was is not None:
            await self.audit("gpu.uncordon", uuid, reason=was["reason"], cordoned_by=was["by"])
        self.write_json(
            {"uuid": uuid, "cordoned": None, "was": public_cordon(was), "changed": was is not None}
        )


routes = [
    (r"api/v1/gpus/([^/]+)/cordon", CordonHandler),
    (r"api/v1/gpus/([^/]+)/uncordon", UncordonHandler),
]
