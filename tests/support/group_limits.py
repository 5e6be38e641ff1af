"""A test's own limits on a shared hub: a hub group of one user whose properties
give the quota or guarantee the test needs (service/sharing.py reads them), instead
of a line about the user in the shared hub's config.

The service keeps the hub's groups for a few seconds and drops them when the hub
tells it (through the audit trail) that a group changed; :func:`limit_user` waits
until the service has been told, and for a quota until it shows it.
"""

from __future__ import annotations

from contextlib import contextmanager

from gpulab.service.sharing import GROUP_GUARANTEE_PROPERTY, GROUP_QUOTA_PROPERTY
from support.wait import wait_until


def group_for(user: str) -> str:
    """The name of the hub group that carries ``user``'s limits."""
    return f"limits-{user}"


def limit_user(
    hub, user: str, *, quota_milli: int | None = None, guaranteed_milli: int | None = None
) -> str:
    """Give ``user`` (already on the hub) a quota (limit) and/or a guarantee in
    milli-GPU, through a hub group of theirs alone; return the group's name. On
    return the gpulab service applies them."""
    props = {}
    if quota_milli is not None:
        props[GROUP_QUOTA_PROPERTY] = quota_milli
    if guaranteed_milli is not None:
        props[GROUP_GUARANTEE_PROPERTY] = guaranteed_milli
    assert props, "limit_user: give a quota_milli or a guaranteed_milli"
    group = group_for(user)
    r = hub.hub_api("POST", f"/groups/{group}", json={"users": [user]})
    assert r.status_code == 201, r.text
    r = hub.hub_api("PUT", f"/groups/{group}/properties", json=props)
    assert r.status_code == 200, r.text
    _wait_told(hub, "group.change", group)
    if quota_milli is not None:
        # The availability route (the spawn form's) shows the user's quota as the
        # service sees it: the group's, once it has read the group again.
        wait_until(
            lambda: (
                hub.gpulab("GET", "/availability", params={"user": user}).json()["quota_milli"]
                == quota_milli
            ),
            f"the service to show {user}'s quota of {quota_milli} milli-GPU",
            60,
            detail=hub.log_tail,
        )
    return group


def unlimit(hub, group: str) -> None:
    """Remove a group :func:`limit_user` made; on return the service has been told."""
    r = hub.hub_api("DELETE", f"/groups/{group}")
    assert r.status_code == 204, r.text
    _wait_told(hub, "group.delete", group)


@contextmanager
def limited_user(
    hub, user: str, *, quota_milli: int | None = None, guaranteed_milli: int | None = None
):
    """:func:`limit_user` for a block (a module's fixture); the group goes at its end,
    so no other module's tests see it."""
    group = limit_user(hub, user, quota_milli=quota_milli, guaranteed_milli=guaranteed_milli)
    try:
        yield group
    finally:
        unlimit(hub, group)


def _wait_told(hub, action: str, group: str) -> None:
    """Wait until the service has recorded the hub's entry for this change: it drops
    the groups it kept before recording it, so its next look at them is fresh."""

    def recorded():
        r = hub.gpulab("GET", "/audit", params={"action": action, "subject": group, "result": "ok"})
        return r.status_code == 200 and r.json()["entries"]

    wait_until(recorded, f"the service to hear of {action} {group}", 60, detail=hub.log_tail)
