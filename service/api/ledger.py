"""``GET /api/v1/ledger``: live owners that lost their slice (users: their own)."""

from __future__ import annotations

from gpulab.service.auth import APIHandler
from gpulab.service.operations.lost_slices import LostSlices


class LedgerHandler(APIHandler):
    def get(self):
        user = self.listed_user("ledger findings")
        check: LostSlices = self.gpulab.lost_slices
        self.write_json(
            {
                "checked": check.checked,
                "lost": [x for x in check.lost if user is None or x["user"] == user],
            }
        )


routes = [(r"api/v1/ledger", LedgerHandler)]
