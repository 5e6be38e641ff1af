"""What the gpulab page shows, as plain rows: GPUs, allocations by name, jobs, endpoints.

People read the fraction (``1/4 GPU``, :func:`gpulab.scheduler.slices.label`) and
names ("alice's server", a job's name, ``resnet v2``); ledger owners like
``1962d0a37c77/0`` and milli-GPU stay in the API. Times are relative ("3 min ago")
with the full ISO time beside them for a ``title`` attribute.
"""

from __future__ import annotations

import asyncio
import datetime as dt

from gpulab.scheduler.slices import label

#: Jobs listed on the page: the latest ones (the API has them all).
JOBS_SHOWN = 50


def ago(iso: str | None, now: dt.datetime | None = None) -> dict:
    """``{"text": "3 min ago", "iso": "2026-12-01T12:00:00+00:00"}`` (empty text: never)."""
    if not iso:
        return {"text": "", "iso": ""}
    when = dt.datetime.fromisoformat(iso)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    s = max(0, int((now - when).total_seconds()))
    if s < 45:
        text = "just now"
    elif s < 3600:
        text = f"{max(1, round(s / 60))} min ago"
    elif s < 86400:
        text = f"{s // 3600} h ago"
    else:
        days = s // 86400
        text = f"{days} day{'s' if days > 1 else ''} ago"
    return {"text": text, "iso": when.isoformat()}


def gib(mib: int) -> str:
    return f"{mib / 1024:.3g} GiB"


def gpu_rows(inventory: dict) -> list[dict]:
    return [
        {
            "node": n["name"],
            "index": g["index"],
            "model": g["model"],
            "uuid": g["uuid"],
            "memory": gib(g["memory_mib"]),
            "allocated": label(g["allocated_milli"]) if g["allocated_milli"] else "free",
            "simulated": g["simulated"],
            "cordoned": (g.get("cordoned") or {}).get("reason", ""),
        }
        for n in inventory["nodes"]
        for g in n["gpus"]
    ]


def server_name(owner: str) -> str:
    """``alice/`` -> ``alice's server``; ``alice/gpu`` -> ``alice's server "gpu"``."""
    user, _, name = owner.partition("/")
    return f"{user}'s server" + (f' "{name}"' if name else "")


def version_names(service, user: str | None) -> dict[str, tuple[dict, dict]]:
    """Ledger owner prefix (a version's id) -> (deployment, version row)."""
    if service.deployments is None:
        return {}
    store = service.deployments.store
    out = {}
    for dep in store.list(user=user):
        for v in store.versions(dep["id"]):
            out[v["id"]] = (dep, v)
    return out


def holder_name(service, a: dict, versions: dict[str, tuple[dict, dict]]) -> tuple[str, str]:
    """What holds the slice ``a``, as its owner reads it (``job train (rank 1)``,
    ``sentiment version 1 (replica 1)``), and the page anchor of that thing."""
    head, _, part = a["owner"].rpartition("/")
    if a["owner_kind"] == "server":
        return server_name(a["owner"]), ""
    if a["owner_kind"] == "job":
        job = service.jobs.queue.get(head) if service.jobs is not None else None
        return f"job {(job['name'] or head) if job else head} (rank {part})", f"job-{head}"
    if head in versions:
        dep, v = versions[head]
        return f"{dep['name']} version {v['version']} (replica {part})", f"endpoint-{dep['id']}"
    return f"deployment {a['owner']}", ""


def allocation_rows(service, allocations: list[dict], user: str | None, now=None) -> list[dict]:
    versions = version_names(service, user)
    rows = []
    for a in allocations:
        name, anchor = holder_name(service, a, versions)
        rows.append(
            {
                "user": a["user"],
                "kind": a["owner_kind"],
                "name": name,
                "anchor": anchor,
                "node": a["node"],
                "gpu": a["gpu_index"],
                "size": label(a["milli"]),
                "memory": gib(a["memory_mib"]),
                "since": ago(a["created"], now),
            }
        )
    return rows


def job_rows(service, user: str | None, now=None) -> list[dict]:
    if service.jobs is None:
        return []
    newest = service.jobs.queue.newest(user, JOBS_SHOWN)  # a user may have thousands
    return [
        {
            "id": j["id"],
            "name": j["name"] or j["id"],
            "user": j["user"],
            "state": j["state"],
            "size": label(j["gpu_milli"]),
            "ranks": j["nodes"] * j["nproc_per_node"],
            "submitted": ago(j["submitted"], now),
        }
        for j in newest
    ]


async def endpoint_rows(service, who, user: str | None, hub_url: str) -> tuple[list, list]:
    """The endpoints of ``user`` (None: everyone's), with whom each is shared; and
    other users' endpoints shared with ``who`` (by name or by one of their groups;
    none for admins, who see all in the first).

    The rows are read in a thread; each endpoint's view on the event loop, whose
    state it reads and updates (its replicas, traffic and token counts)."""
    manager = service.deployments
    if manager is None:
        return [], []
    mine = await asyncio.to_thread(manager.store.list, user=user)
    others = [] if who.admin else await asyncio.to_thread(manager.store.list)
    shared = [d for d in others if d["user"] != who.name and manager.calls.can_use(who, d)]
    return (
        [_endpoint_row(manager, dep, hub_url) for dep in mine],
        [_endpoint_row(manager, dep, hub_url) for dep in shared],
    )


def _endpoint_row(manager, dep: dict, hub_url: str) -> dict:
    view = manager.view(dep)
    return {
        "id": dep["id"],
        "name": dep["name"],
        "user": dep["user"],
        "state": view["state"],
        "url": hub_url.rstrip("/") + view["path"],
        "replicas_ready": view["replicas_ready"],
        "replicas": view["replicas"],
        "versions": ", ".join(str(v["version"]) for v in view["versions"]),
        "share_users": ", ".join(dep["share_users"]),
        "share_groups": ", ".join(dep["share_groups"]),
    }
