"""Priority classes: who comes first, and whose work may be taken back.

Each class has a name, a value (higher comes first) and whether work of that
class is preemptible by default. The default order follows shared GPU platforms
(KAI-Scheduler, Kueue): people at a notebook first, then endpoints, then batch
work that fills every gap and yields when asked::

    interactive 1000   servers          never preempted
    serving      500   endpoint replicas never preempted
    batch-high   200   jobs             granted by admins or a group property
    batch        100   jobs (default)   preemptible

A site changes the list with ``c.SharingSettings.priority_classes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Which class each kind of work gets unless it asks for another (jobs only may).
KIND_CLASS = {"server": "interactive", "deployment": "serving", "job": "batch"}


class PriorityError(ValueError):
    """A class name or setting that does not exist or is not allowed; says which."""


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool = False
    #: ``"everyone"`` may ask for it; ``"granted"`` needs an admin or a group
    #: whose property ``gpulab_priority_classes`` lists it.
    access: str = "everyone"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": self.value,
            "preemptible": self.preemptible,
            "access": self.access,
        }


DEFAULT_CLASSES = (
    PriorityClass("interactive", 1000, preemptible=False),
    PriorityClass("serving", 500, preemptible=False),
    PriorityClass("batch-high", 200, preemptible=True, access="granted"),
    PriorityClass("batch", 100, preemptible=True),
)


class PriorityClasses:
    """The configured classes, highest first."""

    def __init__(self, classes: Iterable[PriorityClass] = DEFAULT_CLASSES):
        self.classes = sorted(classes, key=lambda c: -c.value)
        self.by_name = {c.name: c for c in self.classes}
        if len(self.by_name) != len(self.classes):
            raise PriorityError("priority class names must be unique")
        for kind, name in KIND_CLASS.items():
            if name not in self.by_name:
                raise PriorityError(
                    f"priority classes must include {name!r} (the class of every {kind})"
                )

    @classmethod
    def from_config(cls, items: Iterable[Mapping] | None) -> PriorityClasses:
        """From ``[{"name", "value", "preemptible", "access"}]``; empty means the defaults."""
        if not items:
            return cls()
        out = []
        for item in items:
            try:
                name, value = str(item["name"]), item["value"]
            except (KeyError, TypeError):
                raise PriorityError(
                    f"each priority class needs a name and a value, got {item!r}"
                ) from None
            if not isinstance(value, int) or isinstance(value, bool):
                raise PriorityError(f"priority class {name!r}: value must be an integer")
            access = item.get("access", "everyone")
            if access not in ("everyone", "granted"):
                raise PriorityError(
                    f"priority class {name!r}: access must be 'everyone' or 'granted'"
                )
            out.append(PriorityClass(name, value, bool(item.get("preemptible", False)), access))
        return cls(out)

    def get(self, name: str) -> PriorityClass:
        try:
            return self.by_name[name]
        except KeyError:
            raise PriorityError(
                f"unknown priority class {name!r}; use one of: {', '.join(self.by_name)}"
            ) from None

    def of_kind(self, kind: str) -> PriorityClass:
        return self.by_name[KIND_CLASS[kind]]

    def value(self, name: str | None, kind: str = "job") -> int:
        """The value of class ``name`` (or of the kind's class); unknown names count
        as the kind's class, so a class removed from the config demotes nothing."""
        c = self.by_name.get(name or "") or self.of_kind(kind)
        return c.value

    def for_job(self, name: str, admin: bool, granted: Iterable[str]) -> PriorityClass:
        """The class a job may run in, or :class:`PriorityError` saying why not."""
        c = self.get(name or KIND_CLASS["job"])
        if c.value > self.of_kind("job").value and c.name in (
            KIND_CLASS["server"],
            KIND_CLASS["deployment"],
        ):
            raise PriorityError(
                f"priority class {c.name!r} is for "
                f"{'servers' if c.name == KIND_CLASS['server'] else 'endpoints'}; "
                f"jobs use one of: {', '.join(self.job_classes())}"
            )
        if c.access == "granted" and not admin and c.name not in set(granted):
            raise PriorityError(
                f"priority class {c.name!r} is granted by admins (or a group's "
                f"gpulab_priority_classes property); submit without --priority-class "
                f"to run as {KIND_CLASS['job']!r}"
            )
        return c

    def job_classes(self) -> list[str]:
        reserved = {KIND_CLASS["server"], KIND_CLASS["deployment"]}
        return [c.name for c in self.classes if c.name not in reserved]
