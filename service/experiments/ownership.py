"""Whose an experiment or a run is: the owner tag, the names, and what the proxy rewrites.

An experiment belongs to the user who created it: the proxy sets its ``gpulab.owner``
tag on create (a user's own value for that tag is dropped) and refuses to change it
later. Its name is the owner's namespace plus what they asked for (``alice/demo`` for
``demo``), so two users' ``demo`` never collide and a name says whose it is. A run
belongs to its experiment's owner; an experiment never moves, so both answers are
kept once read. MLflow's shared ``Default`` experiment (id 0) belongs to no one: a run
a user starts there lands in their own ``<user>/Default`` instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

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


def owner_filter(user: str, user_filter: str = "") -> str:
    """An ``experiments/search`` filter that keeps only ``user``'s experiments. MLflow's
    filters join clauses with AND only (no OR, no parentheses), so nothing the user
    adds can widen it."""
    ours = f"tags.`{OWNER_TAG}` = '{user}'"
    return f"{ours} AND {user_filter}" if user_filter.strip() else ours


def owner_of(experiment: dict) -> str:
    """The owner tag of an experiment as MLflow returns it ('' when it has none)."""
    for tag in experiment.get("tags") or []:
        if tag.get("key") == OWNER_TAG:
            return str(tag.get("value") or "")
    return ""


def with_owner_tag(tags: list | None, user: str) -> list[dict]:
    """A create request's tags with the owner tag set to ``user`` (a user's own dropped)."""
    kept = [t for t in tags or [] if isinstance(t, dict) and t.get("key") != OWNER_TAG]
    return [*kept, {"key": OWNER_TAG, "value": user}]


def _keep(cache: OrderedDict, key: str, value: str) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEPT:
        cache.popitem(last=False)


class Owners:
    """Looks owners up through MLflow (``backend``) and keeps the answers."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._experiment_owner: OrderedDict[str, str] = OrderedDict()
        self._run_experiment: OrderedDict[str, str] = OrderedDict()

    async def of_experiment(self, experiment_id: str) -> str:
        """The owner of an experiment ('' for one no one owns); NotFound if none."""
        if experiment_id in self._experiment_owner:
            return self._experiment_owner[experiment_id]
        status, found = await self.backend(
            "GET", "experiments/get", {"experiment_id": [experiment_id]}, None
        )
        if status != 200 or "experiment" not in found:
            raise NotFound(experiment_id)
        owner = owner_of(found["experiment"])
        _keep(self._experiment_owner, experiment_id, owner)
        return owner

    async def experiment_of_run(self, run_id: str) -> str:
        if run_id in self._run_experiment:
            return self._run_experiment[run_id]
        status, found = await self.backend("GET", "runs/get", {"run_id": [run_id]}, None)
        if status != 200 or "run" not in found:
            raise NotFound(run_id)
        experiment_id = str(found["run"]["info"]["experiment_id"])
        _keep(self._run_experiment, run_id, experiment_id)
        return experiment_id

    async def check_experiments(self, user: str, experiment_ids) -> None:
        for experiment_id in experiment_ids:
            if await self.of_experiment(experiment_id) != user:
                raise NotFound(experiment_id)

    async def check_runs(self, user: str, run_ids) -> None:
        for run_id in run_ids:
            await self.check_experiments(user, [await self.experiment_of_run(run_id)])

    async def default_experiment(self, user: str) -> str:
        """The id of ``<user>/Default``, created (owned by ``user``) the first time."""
        name = namespaced(user, DEFAULT_NAME)
        status, found = await self.backend(
            "GET", "experiments/get-by-name", {"experiment_name": [name]}, None
        )
        if status == 200 and "experiment" in found:
            if owner_of(found["experiment"]) != user:
                raise NotFound(name)
            return str(found["experiment"]["experiment_id"])
        status, made = await self.backend(
            "POST", "experiments/create", None, {"name": name, "tags": with_owner_tag([], user)}
        )
        if status == 200:
            return str(made["experiment_id"])
        # Made meanwhile by another request of the same user: read it again.
        status, found = await self.backend(
            "GET", "experiments/get-by-name", {"experiment_name": [name]}, None
        )
        if status != 200 or owner_of(found.get("experiment") or {}) != user:
            raise NotFound(name)
        return str(found["experiment"]["experiment_id"])
