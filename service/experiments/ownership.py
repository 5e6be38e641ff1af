"""Whose an experiment or a run is: the owner tag, the names, and what the proxy rewrites.

An experiment belongs to the user who created it: the proxy sets its ``gpulab.owner``
tag on create (a user's own value for that tag is dropped) and refuses to change it
later. Its name is the owner's namespace plus what they asked for (``alice/demo`` for
``demo``), so two users' ``demo`` never collide and a name says whose it is. A run
belongs to its experiment's owner; an experiment never moves, so both answers are
kept once read, with the experiment's creation time. A hub user's name can be given
again (a user deleted, a new one made with the same name): an experiment is the
caller's only if it was also created no earlier than the caller's hub user
(``since``, ms since the epoch; None: no such limit), so the new user of a name never
reaches what the old one left. MLflow's shared ``Default`` experiment (id 0) belongs to
no one: a run a user starts there lands in their own ``<user>/Default`` instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from .surface import OWNER_TAG

#: MLflow's own default experiment, shared by everyone on a plain server.
DEFAULT_EXPERIMENT_ID = "0"
DEFAULT_NAME = "Default"
#: Owners and runs' experiments kept in memory (they never change).
KEPT = 100_000

#: ``(method, route, args, body) -> (status, json)`` against MLflow itself.
Backend = Callable[[str, str, dict | None, dict | None], Awaitable[tuple[int, dict]]]


class NotFound(Exception):
    """No such experiment or run, or one the caller may not see (told apart from
    nothing: another user's id looks like a missing one)."""


def namespaced(user: str, name: str) -> str:
    """``demo`` -> ``alice/demo``; a name already in the user's namespace stays."""
    prefix = f"{user}/"
    return name if name.startswith(prefix) else prefix + name


def owner_filter(user: str, user_filter: str = "", since: int | None = None) -> str:
    """An ``experiments/search`` filter that keeps only ``user``'s experiments (made no
    earlier than ``since``). MLflow's filters join clauses with AND only (no OR, no
    parentheses), so nothing the user adds can widen it."""
    ours = f"tags.`{OWNER_TAG}` = '{user}'"
    if since is not None:
        ours += f" AND attribute.creation_time >= {int(since)}"
    return f"{ours} AND {user_filter}" if user_filter.strip() else ours


def owner_of(experiment: dict) -> str:
    """The owner tag of an experiment as MLflow returns it ('' when it has none)."""
    for tag in experiment.get("tags") or []:
        if tag.get("key") == OWNER_TAG:
            return str(tag.get("value") or "")
    return ""


def created_ms(experiment: dict) -> int:
    """An experiment's creation time as MLflow returns it (ms; 0 when it has none)."""
    try:
        return int(experiment.get("creation_time") or 0)
    except (TypeError, ValueError):
        return 0


def belongs(owner: str, created: int, user: str, since: int | None) -> bool:
    """Whether an experiment of ``owner`` made at ``created`` (ms) is ``user``'s, whose
    hub user was made at ``since`` (ms; None: whenever)."""
    return owner == user and (since is None or created >= since)


def is_theirs(experiment: dict, user: str, since: int | None = None) -> bool:
    """Whether an experiment as MLflow returns it is ``user``'s."""
    return belongs(owner_of(experiment), created_ms(experiment), user, since)


def with_owner_tag(tags: list | None, user: str) -> list[dict]:
    """A create request's tags with the owner tag set to ``user`` (a user's own dropped)."""
    kept = [t for t in tags or [] if isinstance(t, dict) and t.get("key") != OWNER_TAG]
    return [*kept, {"key": OWNER_TAG, "value": user}]


def _keep(cache: OrderedDict, key: str, value) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEPT:
        cache.popitem(last=False)


class Owners:
    """Looks owners up through MLflow (``backend``) and keeps the answers."""

    def __init__(self, backend: Backend):
        self.backend = backend
        #: experiment id -> (owner, creation time in ms)
        self._experiment_owner: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._run_experiment: OrderedDict[str, str] = OrderedDict()

    async def of_experiment(self, experiment_id: str) -> tuple[str, int]:
        """The owner of an experiment ('' for one no one owns) and its creation time
        (ms); NotFound if none."""
        if experiment_id in self._experiment_owner:
            return self._experiment_owner[experiment_id]
        status, found = await self.backend(
            "GET", "experiments/get", {"experiment_id": [experiment_id]}, None
        )
        if status != 200 or "experiment" not in found:
            raise NotFound(experiment_id)
        answer = (owner_of(found["experiment"]), created_ms(found["experiment"]))
        _keep(self._experiment_owner, experiment_id, answer)
        return answer

    async def experiment_of_run(self, run_id: str) -> str:
        if run_id in self._run_experiment:
            return self._run_experiment[run_id]
        status, found = await self.backend("GET", "runs/get", {"run_id": [run_id]}, None)
        if status != 200 or "run" not in found:
            raise NotFound(run_id)
        experiment_id = str(found["run"]["info"]["experiment_id"])
        _keep(self._run_experiment, run_id, experiment_id)
        return experiment_id

    async def check_experiments(self, user: str, experiment_ids, since: int | None = None):
        for experiment_id in experiment_ids:
            if not belongs(*await self.of_experiment(experiment_id), user, since):
                raise NotFound(experiment_id)

    async def check_runs(self, user: str, run_ids, since: int | None = None) -> None:
        for run_id in run_ids:
            await self.check_experiments(user, [await self.experiment_of_run(run_id)], since)

    async def set_aside(self, user: str, name: str, since: int | None) -> bool:
        """Make way for ``user``'s new experiment ``name`` (namespaced): one of that name
        left by an earlier hub user of the same name (its owner tag ``user``, made
        before ``since``) is renamed ``<name> (before <date>)``. False if one is left
        and could not be renamed; True otherwise."""
        if since is None:
            return True
        status, found = await self.backend(
            "GET", "experiments/get-by-name", {"experiment_name": [name]}, None
        )
        old = found.get("experiment") if status == 200 else None
        if not old or owner_of(old) != user or created_ms(old) >= since:
            return True  # none, or the caller's own (MLflow says it exists), or not a user's
        day = datetime.fromtimestamp(since / 1000, UTC).date().isoformat()
        status, _ = await self.backend(
            "POST",
            "experiments/update",
            None,
            {"experiment_id": str(old["experiment_id"]), "new_name": f"{name} (before {day})"},
        )
        return status == 200

    async def default_experiment(self, user: str, since: int | None = None) -> str:
        """The id of ``<user>/Default``, created (owned by ``user``) the first time."""
        name = namespaced(user, DEFAULT_NAME)
        status, found = await self.backend(
            "GET", "experiments/get-by-name", {"experiment_name": [name]}, None
        )
        if status == 200 and "experiment" in found:
            if is_theirs(found["experiment"], user, since):
                return str(found["experiment"]["experiment_id"])
            if not await self.set_aside(user, name, since):
                raise NotFound(name)
        status, made = await self.backend(
            "POST", "experiments/create", None, {"name": name, "tags": with_owner_tag([], user)}
        )
        if status == 200:
            return str(made["experiment_id"])
        # Made meanwhile by another request of the same user: read it again.
        status, found = await self.backend(
            "GET", "experiments/get-by-name", {"experiment_name": [name]}, None
        )
        if status != 200 or not is_theirs(found.get("experiment") or {}, user, since):
            raise NotFound(name)
        return str(found["experiment"]["experiment_id"])
