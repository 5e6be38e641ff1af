"""Settings that moved off ``GpuLabService`` to the part that reads them.

Each part's settings are traits of its own Configurable (``c.Thresholds.*``,
``c.JobQueue.*``...), built by the service with ``parent=self`` from the same config
file. A site's file that still says ``c.GpuLabService.<name>`` keeps working: the
value is carried to the new place as the config is loaded, with one warning line
that names it (``c.GpuLabService.max_job_ranks is now c.JobQueue.max_job_ranks``).
Where both are set, the new name wins.

The trait names are unchanged, so the map is read off the classes themselves: a
setting added to one of them is never mistaken for a setting of the service.
"""

from __future__ import annotations

import logging

from traitlets.config import Config

log = logging.getLogger("gpulab.service")

#: Old names that stay supported without a warning: DESIGN.md names them as
#: contracts (``c.GpuLabService.job_stall_seconds``).
KEPT_NAMES = frozenset({"job_stall_seconds"})

#: Settings that moved under another name: old name -> (class, new name). The node
#: selector was a second name for the inventory's own setting.
RENAMED = {"kubernetes_node_selector": ("KubernetesInventory", "label_selector")}


def moved_map(classes) -> dict[str, str]:
    """Setting name -> the class that now holds it, for every ``config=True`` trait
    each of ``classes`` defines."""
    moved: dict[str, str] = {}
    for cls in classes:
        for name in cls.class_own_traits(config=True):
            if name in moved:
                raise ValueError(f"{name} is a setting of both {moved[name]} and {cls.__name__}")
            moved[name] = cls.__name__
    return moved


def carry_moved(
    cfg: Config,
    moved: dict[str, str],
    section: str = "GpuLabService",
    renamed: dict[str, tuple[str, str]] = RENAMED,
) -> None:
    """Move ``cfg[section][name]`` to ``cfg[<new class>][name]`` for every moved name,
    and to ``cfg[<class>][<new name>]`` for every renamed one (in place; a value
    already set in the new place is kept), warning once each."""
    if section not in cfg:
        return
    old = cfg[section]
    places = {**{n: (c, n) for n, c in moved.items()}, **renamed}
    for name in [n for n in old if n in places]:
        value = old.pop(name)
        new, new_name = places[name]
        there = f"c.{new}.{new_name}"
        if new_name not in cfg[new]:
            cfg[new][new_name] = value
            line = f"c.{section}.{name} is now {there}"
        else:
            line = f"c.{section}.{name} is now {there}; {there} wins"
        if name in KEPT_NAMES:
            log.info("%s (both names stay supported)", line)
        else:
            log.warning(line)
