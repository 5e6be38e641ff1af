"""Live owners that lost their slice, found and named.

:class:`LostSlices` runs with the reconcile loop: a running server, running job or
deployment whose slice rows are gone (released by an admin, or lost to a bug) is
logged and listed at ``GET /api/v1/ledger`` (users: their own; admins: all) and
counted in ``gpulab_ledger_lost_owners``. An owner counts as lost only when two
passes in a row find it so: the moment between placing a new owner and recording it
is not a loss. (Refusing a release behind a live owner's back is
:mod:`gpulab.service.operations.ledger_guard`.)
"""

from __future__ import annotations

import datetime as dt
import logging

from prometheus_client.core import GaugeMetricFamily

from gpulab.scheduler.ledger import OWNER_KINDS
from gpulab.scheduler.slices import SliceError, noun, parse_gpu_milli

log = logging.getLogger("gpulab.service")

#: A server's slice size in its spawner's profile name (``gpu-250``).
PROFILE_PREFIX = "gpu-"


def _server_milli(model: dict) -> int:
    options = model.get("user_options") or {}
    value = options.get("gpu_milli")
    profile = options.get("profile")
    if value is None and isinstance(profile, str) and profile.startswith(PROFILE_PREFIX):
        value = profile[len(PROFILE_PREFIX) :]
    try:
        return parse_gpu_milli(value if value is not None else 0)
    except SliceError:
        return 0


def unheld(held: set, kind: str, unit_id: str, members: int) -> list[int]:
    """The members (ranks, replicas) of ``unit_id`` whose slice row is not ``held``."""
    return [m for m in range(members) if (kind, f"{unit_id}/{m}") not in held]


def finding(kind: str, unit: dict, missing: list[int], what: str) -> dict:
    """A job's or deployment's members that lost their slice, as listed and logged."""
    return {
        "owner_kind": kind,
        "owner": unit["id"],
        "user": unit["user"],
        "milli": unit["gpu_milli"] * len(missing),
        "message": f"{what} {'holds' if len(missing) == 1 else 'hold'} no slice",
    }


def _numbered(word: str, members: list[int]) -> str:
    """``rank 1``, ``ranks 1, 3``."""
    return f"{noun(len(members), word)} {', '.join(map(str, members))}"


class LostSlices:
    """Live owners that hold no slice, as of the last reconcile pass."""

    def __init__(self, *, hub, ledger, jobs, deployments):
        self.hub = hub
        self.ledger = ledger
        self.jobs = jobs
        self.deployments = deployments
        self.checked: str | None = None
        self.lost: list[dict] = []
        self._suspects: dict[tuple[str, str], dict] = {}

    async def check(self) -> list[dict]:
        servers = await self.hub.active_server_models()
        # After the hub's answer: a server that stopped meanwhile has no row, but
        # it is no longer in the next pass's answer either.
        held = {(a["owner_kind"], a["owner"]) for a in await self.ledger.aio.list()}
        found = {}
        for owner, model in servers.items():
            milli = _server_milli(model)
            if (
                milli
                and model.get("ready")
                and not model.get("pending")
                and ("server", owner) not in held
            ):
                found[("server", owner)] = {
                    "owner_kind": "server",
                    "owner": owner,
                    "user": owner.split("/")[0],
                    "milli": milli,
                    "message": f"server {owner} is running with {milli} "
                    f"milli-GPU but holds no slice",
                }
        for job in self.jobs.queue.list(states=("running",)):
            ranks = job["nodes"] * job["nproc_per_node"] if job["gpu_milli"] else 0
            missing = unheld(held, "job", job["id"], ranks)
            if missing:
                what = f"job {job['id']} is running but {_numbered('rank', missing)}"
                found[("job", job["id"])] = finding("job", job, missing, what)
        for dep in self.deployments.store.list():
            placed = dep["gpu_milli"] and dep["state"] != "failed"
            missing = unheld(held, "deployment", dep["id"], dep["replicas"] if placed else 0)
            if missing:
                what = (
                    f"deployment {dep['user']}/{dep['name']} is {dep['state']} but "
                    f"{_numbered('replica', missing)}"
                )
                found[("deployment", dep["id"])] = finding("deployment", dep, missing, what)
        confirmed = [v for k, v in found.items() if k in self._suspects]
        known = {(x["owner_kind"], x["owner"]) for x in self.lost}
        for item in confirmed:
            if (item["owner_kind"], item["owner"]) not in known:
                log.warning(
                    "Ledger: %s; its GPU may be given to someone else. Stop and "
                    "start it again to place it anew.",
                    item["message"],
                )
        self._suspects = found
        self.lost = confirmed
        self.checked = dt.datetime.now(dt.UTC).isoformat()
        return confirmed

    def collect(self):
        gauge = GaugeMetricFamily(
            "gpulab_ledger_lost_owners",
            "Live servers, jobs and deployments that hold no slice.",
            labels=["owner_kind"],
        )
        for kind in OWNER_KINDS:
            gauge.add_metric([kind], sum(x["owner_kind"] == kind for x in self.lost))
        yield gauge
