"""Quotas in milli-GPU, per user and per group: a limit and a guarantee.

A user's quota (their *limit*) caps the sum of their allocations (servers, jobs
and deployments together). A group's quota caps the sum over all its members. A
request must fit the user's quota and the quota of every group they are in.
``None`` means unlimited.

A *guarantee* is what a user (or a group, all members together) gets back when
they ask for it, as Kueue's nominal quota and KAI's deserved quota: above it a
user *borrows* idle GPUs, and work on borrowed GPUs may be preempted by someone
who is still within their own guarantee (:meth:`Quotas.within_guarantee`,
:meth:`Quotas.borrowing`). Guarantees default to 0: everything is borrowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .slices import label


class QuotaExceeded(Exception):
    """The request would take a user or group past its quota."""


@dataclass
class Quotas:
    default_user_milli: int | None = None
    user_milli: Mapping[str, int] = field(default_factory=dict)
    group_milli: Mapping[str, int] = field(default_factory=dict)
    default_user_guaranteed: int = 0
    user_guaranteed: Mapping[str, int] = field(default_factory=dict)
    group_guaranteed: Mapping[str, int] = field(default_factory=dict)

    def user_guarantee(self, user: str) -> int:
        return self.user_guaranteed.get(user, self.default_user_guaranteed)

    def within_guarantee(
        self,
        user: str,
        request_milli: int,
        usage: Mapping[str, int],
        groups: Mapping[str, set[str]],
    ) -> bool:
        """Would the user, with this request, still hold no more than a guarantee
        (their own, or one of their groups')?"""
        if request_milli and usage.get(user, 0) + request_milli <= self.user_guarantee(user):
            return True
        for group, members in groups.items():
            g = self.group_guaranteed.get(group, 0)
            if g and sum(usage.get(m, 0) for m in members | {user}) + request_milli <= g:
                return True
        return False

    def borrowing(
        self, user: str, usage: Mapping[str, int], groups: Mapping[str, set[str]]
    ) -> bool:
        """Does the user hold more than their guarantee and every group's?"""
        held = usage.get(user, 0)
        if held <= self.user_guarantee(user):
            return False
        for group, members in groups.items():
            g = self.group_guaranteed.get(group, 0)
            if g and sum(usage.get(m, 0) for m in members | {user}) <= g:
                return False
        return True

    def user_limit(self, user: str) -> int | None:
        return self.user_milli.get(user, self.default_user_milli)

    def check(
        self,
        user: str,
        request_milli: int,
        usage: Mapping[str, int],
        groups: Mapping[str, set[str]],
    ) -> None:
        """Raise :class:`QuotaExceeded` if the request does not fit.

        ``usage`` is milli held per user now; ``groups`` maps each of the
        user's groups to its members.
        """
        if request_milli == 0:
            return
        limit = self.user_limit(user)
        used = usage.get(user, 0)
        if limit is not None and used + request_milli > limit:
            raise QuotaExceeded(
                f"over your quota: you hold {label(used)} of your {label(limit)}, and this "
                f"request needs {label(request_milli)} more; stop a server, job or deployment "
                f"or ask an admin to raise your quota"
            )
        for group, members in sorted(groups.items()):
            glimit = self.group_milli.get(group)
            if glimit is None:
                continue
            gused = sum(usage.get(m, 0) for m in members | {user})
            if gused + request_milli > glimit:
                raise QuotaExceeded(
                    f"over the quota of group {group!r}: its members hold {label(gused)} "
                    f"of {label(glimit)}, and this request needs {label(request_milli)} more"
                )

    def remaining(
        self, user: str, usage: Mapping[str, int], groups: Mapping[str, set[str]]
    ) -> int | None:
        """How many milli the user may still take; ``None`` if unlimited."""
        left: list[int] = []
        limit = self.user_limit(user)
        if limit is not None:
            left.append(limit - usage.get(user, 0))
        for group, members in groups.items():
            glimit = self.group_milli.get(group)
            if glimit is not None:
                left.append(glimit - sum(usage.get(m, 0) for m in members | {user}))
        return max(0, min(left)) if left else None
