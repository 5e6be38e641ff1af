"""How users share the GPUs: limits (quotas), guarantees, priority classes (the
queue's own settings, preemption's grace and fair share, are c.JobQueue's).

The settings live on :class:`SharingSettings` (``c.SharingSettings.<name>``), a
part the service builds from its config; ``c.GpuLabService.<name>``, where they
were, still sets each. Hub groups carry the same values as properties an admin sets
on the hub's admin page; the config wins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from traitlets import Dict, Int, List
from traitlets.config import Configurable

from gpulab.scheduler.priority import PriorityClasses, PriorityError

#: Group properties an admin may set on the hub's admin page.
GROUP_QUOTA_PROPERTY = "gpulab_quota_milli"  # the group's limit
GROUP_LIMIT_PROPERTY = "gpulab_limit_milli"  # the same, by the name the docs use
GROUP_GUARANTEE_PROPERTY = "gpulab_guaranteed_milli"
GROUP_CLASSES_PROPERTY = "gpulab_priority_classes"  # classes the members may use


def _milli(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class SharingSettings(Configurable):
    default_user_quota_milli = Int(
        None,
        allow_none=True,
        help="""Milli-GPU each user may hold at once, unless set per user. None: unlimited.

        c.SharingSettings.default_user_quota_milli = 1000
        """,
    ).tag(config=True)

    user_quota_milli = Dict(
        help="""Per-user quotas in milli-GPU.

        c.SharingSettings.user_quota_milli = {"alice": 4000}
        """,
    ).tag(config=True)

    group_quota_milli = Dict(
        help="""Per-group quotas (limits) in milli-GPU, all members together. A hub
        group's property `gpulab_quota_milli` (or `gpulab_limit_milli`) sets it
        too; this setting wins.

        c.SharingSettings.group_quota_milli = {"students": 2000}
        """,
    ).tag(config=True)

    priority_classes = List(
        Dict(),
        help="""Priority classes, as [{"name", "value", "preemptible", "access"}].
        Higher values come first and may preempt preemptible work of lower ones.
        It must keep `interactive` (servers), `serving` (endpoint replicas) and
        `batch` (the jobs' default). `access: "granted"` classes need an admin
        or a hub group whose property `gpulab_priority_classes` lists them.
        Empty: interactive 1000, serving 500, batch-high 200 (granted), batch 100.

        c.SharingSettings.priority_classes = [
            {"name": "interactive", "value": 1000},
            {"name": "serving", "value": 500},
            {"name": "batch-high", "value": 200, "preemptible": True, "access": "granted"},
            {"name": "batch", "value": 100, "preemptible": True},
            {"name": "scavenger", "value": 50, "preemptible": True},
        ]
        """,
    ).tag(config=True)

    default_user_guaranteed_milli = Int(
        0,
        help="""Milli-GPU each user gets back by preemption when they ask (unless
        set per user). Above it a user borrows idle GPUs, and their preemptible
        jobs there may be preempted by someone within their own guarantee.

        c.SharingSettings.default_user_guaranteed_milli = 500
        """,
    ).tag(config=True)

    user_guaranteed_milli = Dict(
        help="""Per-user guarantees in milli-GPU.

        c.SharingSettings.user_guaranteed_milli = {"alice": 2000}
        """,
    ).tag(config=True)

    group_guaranteed_milli = Dict(
        help="""Per-group guarantees in milli-GPU (all members together). A hub
        group's property `gpulab_guaranteed_milli` sets it too; this setting wins.

        c.SharingSettings.group_guaranteed_milli = {"vision-lab": 4000}
        """,
    ).tag(config=True)

    def make_priorities(self) -> PriorityClasses:
        """The configured classes, or the reason they cannot work."""
        try:
            return PriorityClasses.from_config(self.priority_classes)
        except PriorityError as e:
            raise ValueError(f"c.SharingSettings.priority_classes: {e}") from None


class HubGroups:
    """What hub groups say about sharing: each group's members and, from its
    properties and the config (the config wins), its limit, guarantee and priority
    classes. Read from the hub at each ask; :meth:`refresh` also brings the ledger's
    group quotas up to date. ``group_quota_milli``/``group_guaranteed_milli``: the
    settings of :class:`SharingSettings`."""

    def __init__(self, hub, quotas, group_quota_milli: Mapping, group_guaranteed_milli: Mapping):
        self.hub = hub
        self.quotas = quotas
        self.group_quota_milli = dict(group_quota_milli)
        self.group_guaranteed_milli = dict(group_guaranteed_milli)

    async def refresh(self) -> dict[str, dict]:
        """Per hub group: ``{"members", "limit", "guaranteed", "classes"}``; the
        ledger's group limits and guarantees set from them."""
        out = {}
        for g in await self.hub.groups():
            props = g.get("properties") or {}
            limit = _milli(props.get(GROUP_QUOTA_PROPERTY))
            if limit is None:
                limit = _milli(props.get(GROUP_LIMIT_PROPERTY))
            classes = props.get(GROUP_CLASSES_PROPERTY)
            out[g["name"]] = {
                "members": set(g.get("users") or []),
                "limit": self.group_quota_milli.get(g["name"], limit),
                "guaranteed": self.group_guaranteed_milli.get(
                    g["name"], _milli(props.get(GROUP_GUARANTEE_PROPERTY))
                ),
                "classes": [c for c in classes if isinstance(c, str)]
                if isinstance(classes, list)
                else [],
            }
        self.quotas.group_milli = {
            **{n: s["limit"] for n, s in out.items() if s["limit"] is not None},
            **self.group_quota_milli,
        }
        self.quotas.group_guaranteed = {
            **{n: s["guaranteed"] for n, s in out.items() if s["guaranteed"]},
            **self.group_guaranteed_milli,
        }
        return out

    async def groups_of(self, user: str) -> dict[str, set[str]]:
        """The user's groups that carry a limit or a guarantee, with their members."""
        return groups_by_user(await self.refresh()).get(user, {})

    async def granted_classes(self, user: str) -> set[str]:
        """Priority classes the user's groups grant them."""
        return {
            c for s in (await self.refresh()).values() if user in s["members"] for c in s["classes"]
        }


def groups_by_user(settings: Mapping[str, dict]) -> dict[str, dict[str, set[str]]]:
    """user -> {group: members} for the groups that carry a limit or a guarantee,
    from :meth:`HubGroups.refresh`."""
    out: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for name, s in settings.items():
        if s["limit"] is None and not s["guaranteed"]:
            continue
        for member in s["members"]:
            out[member][name] = s["members"]
    return dict(out)
