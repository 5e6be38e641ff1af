"""Which part of MLflow's REST API a request reaches, and what must be checked for it.

The proxy lets a user's request through only when it can tell whose experiment or run
the request touches; everything else in MLflow's (large, growing) surface is refused,
so a route added by a later MLflow is closed until someone adds it here. Pure: the
request's method, path (below the service's prefix), query arguments and JSON body in,
a :class:`Check` out.

The routes, as MLflow 3's client and UI call them (``api/2.0/mlflow/...`` for the
client, the same handlers under ``ajax-api/2.0/mlflow/...`` for the UI):

- experiments: create, search, get, get-by-name, update, delete, restore, tags;
- runs: create, search, get, update, delete, restore, log-*, tags;
- metrics' history, artifact listings and files (``mlflow-artifacts`` under
  ``<experiment id>/<run id>/...``, MLflow's layout when it serves artifacts);
- the UI's page, its static files, ``health``, ``version`` and ``server-info``;
- the UI's GraphQL queries of runs and experiments (:mod:`.graphql_check`), and the
  model versions of one run.

Where an id is read from is where MLflow reads it (``_get_request_message`` in
``mlflow/server/handlers.py``): a GET's query (its body is never passed on), any other
method's JSON body (MLflow ignores the query then). The UI's ``get-artifact`` and
``upload-artifact`` read the query whatever the method: every id there is checked. The
proxy refuses a JSON body with a key that is not snake_case (:mod:`.proxy`): MLflow
also takes a field's camelCase name (``runId`` for ``run_id``), which no check here
reads.

Not offered (refused, with the reason): the model registry, logged models (but for
searching them in one's own experiments), traces,
datasets, prompts, scorers, webhooks, the AI gateway, workspaces and GraphQL. An admin's
request goes through unchecked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .graphql_check import Unchecked, targets

#: The owner tag the proxy sets on every experiment it creates (users cannot set it).
OWNER_TAG = "gpulab.owner"

API_ROOTS = ("api/2.0/mlflow/", "ajax-api/2.0/mlflow/")
ARTIFACT_ROOTS = ("api/2.0/mlflow-artifacts/artifacts", "ajax-api/2.0/mlflow-artifacts/artifacts")

#: Pages and facts that hold no one's data.
OPEN = frozenset(
    {
        "",
        "health",
        "version",
        "api/3.0/mlflow/server-info",
        "ajax-api/3.0/mlflow/server-info",
    }
)

#: Routes whose target is one experiment (``experiment_id``).
ONE_EXPERIMENT = frozenset(
    {
        "experiments/get",
        "experiments/delete",
        "experiments/restore",
        "experiments/update",
        "experiments/set-experiment-tag",
        "experiments/delete-experiment-tag",
    }
)
#: Routes whose target is one run (``run_id``, or the older ``run_uuid``).
ONE_RUN = frozenset(
    {
        "runs/get",
        "runs/update",
        "runs/delete",
        "runs/restore",
        "runs/log-metric",
        "runs/log-parameter",
        "runs/log-batch",
        "runs/log-model",
        "runs/log-inputs",
        "runs/set-tag",
        "runs/delete-tag",
        "metrics/get-history",
        "artifacts/list",
    }
)
#: Routes over several experiments (``experiment_ids``).
SOME_EXPERIMENTS = frozenset(
    # logged-models/search: the client looks a run's models up before it downloads
    # the run's artifacts (and the UI lists them); only searching them is offered.
    {"runs/search", "experiments/search-datasets", "logged-models/search"}
)
#: Routes over several runs (``run_ids``, or ``run_id`` repeated).
SOME_RUNS = frozenset({"metrics/get-history-bulk", "metrics/get-history-bulk-interval"})
#: The UI's routes at the root of the prefix that take a run (``run_uuid``/``run_id``).
ROOT_RUN_ROUTES = frozenset({"get-artifact", "ajax-api/2.0/mlflow/upload-artifact"})

#: ``model-versions/search`` as the UI's run page asks it: the versions of one run.
ONE_RUN_VERSIONS = re.compile(r"^\s*run_id\s*=\s*'([0-9a-fA-F]{1,64})'\s*$")

NOT_OFFERED = (
    "this part of MLflow (the model registry, logged models, traces, datasets, prompts, "
    "scorers, webhooks, the gateway, GraphQL) is not offered through gpulab; experiments, "
    "runs, metrics and artifacts are"
)


@dataclass(frozen=True)
class Check:
    """What the proxy must verify before passing a request on.

    ``kind``: ``open`` (nothing), ``refuse`` (never, ``why``), ``create_experiment``,
    ``search_experiments``, ``experiment_name`` (``name``), ``create_run``
    (``experiments[0]``, may be empty: the user's default), ``experiments``, ``runs``,
    ``artifact`` (``experiments[0]``, from the artifact's path), ``graphql`` (both
    ``experiments`` and ``runs``).
    """

    kind: str
    experiments: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    name: str = ""
    why: str = ""
    route: str = ""
    extra: dict = field(default_factory=dict, compare=False)


def _one(args: dict, body: dict, *names: str) -> str:
    for name in names:
        value = body.get(name)
        if value is None:
            values = args.get(name) or []
            value = values[0] if values else None
        if value not in (None, ""):
            return str(value)
    return ""


def _many(args: dict, body: dict, *names: str) -> tuple[str, ...]:
    found: list[str] = []
    for name in names:
        value = body.get(name)
        if isinstance(value, list):
            found += [str(v) for v in value]
        elif value not in (None, ""):
            found.append(str(value))
        found += [str(v) for v in args.get(name) or []]
    return tuple(dict.fromkeys(found))


def what_mlflow_reads(method: str, args: dict, body: dict) -> tuple[dict, dict]:
    """``(args, body)`` as far as MLflow's API handlers read them: the query of a GET
    (or HEAD), the JSON body of anything else; the other one empty."""
    return (args, {}) if method in ("GET", "HEAD") else ({}, body)


def _named(method: str, args: dict, body: dict, *names: str) -> tuple[str, ...]:
    """Every id under ``names`` in the query and the body, or none at all when MLflow
    reads none there (its handler would act on none of those checked): the ids MLflow
    acts on are always among those checked, and are there."""
    if not _many(*what_mlflow_reads(method, args, body), *names):
        return ()
    return _many(args, body, *names)


def artifact_experiment(path: str) -> str:
    """The experiment an artifact path of MLflow's layout belongs to (``"3"`` of
    ``3/<run id>/artifacts/model.pt``), or ``""`` when it names none."""
    head = path.strip("/").split("/", 1)[0]
    return head if head.isdigit() else ""


def classify(method: str, path: str, args: dict[str, list[str]], body: dict) -> Check:
    """The check for ``method path`` (``path`` below the prefix, no leading slash)."""
    path = path.strip("/")
    if path in OPEN or path.startswith("static-files/"):
        return Check("open", route=path)
    for root in ARTIFACT_ROOTS:
        if path == root or path.startswith(root + "/"):
            if len(args.get("path") or []) > 1:
                return Check("refuse", why="name one artifact path", route=root)
            rel = path[len(root) :].strip("/") or _one(args, body, "path")
            exp = artifact_experiment(rel)
            if not exp:
                return Check("refuse", why="name an artifact as <experiment id>/<run id>/...")
            return Check("artifact", experiments=(exp,), route=root)
    if path == "graphql":
        if method != "POST":
            return Check("refuse", why="send GraphQL queries with POST", route=path)
        try:
            experiments, runs = targets(body)
        except Unchecked as e:
            return Check("refuse", why=f"{e}; {NOT_OFFERED}", route=path)
        return Check("graphql", experiments=experiments, runs=runs, route=path)
    if path in ROOT_RUN_ROUTES:
        # Every id under either name is checked: MLflow's handlers differ in which
        # they read first (get-artifact: run_id, then run_uuid).
        runs = _many(args, body, "run_uuid", "run_id")
        if not runs:
            return Check("refuse", why=f"{path} needs run_uuid", route=path)
        return Check("runs", runs=runs, route=path)
    route = next((path[len(r) :] for r in API_ROOTS if path.startswith(r)), None)
    if route is None:
        return Check("refuse", why=NOT_OFFERED, route=path)
    if route == "experiments/create" and method == "POST":
        return Check("create_experiment", route=route)
    if route == "experiments/search":
        return Check("search_experiments", route=route)
    if route == "experiments/get-by-name":
        name = _one(*what_mlflow_reads(method, args, body), "experiment_name")
        if not name:
            return Check("refuse", why="experiments/get-by-name needs experiment_name")
        return Check("experiment_name", name=name, route=route)
    if route == "runs/create" and method == "POST":
        exps = _many(args, body, "experiment_id")
        if len(exps) > 1:
            return Check("refuse", why="runs/create takes one experiment_id", route=route)
        return Check("create_run", experiments=exps, route=route)
    # The ids MLflow acts on (a GET's query, another method's body) must be there, and
    # every id of the request is checked: a POST's query is not what MLflow reads.
    if route in ONE_EXPERIMENT:
        exps = _named(method, args, body, "experiment_id")
        if not exps:
            return Check("refuse", why=f"{route} needs experiment_id", route=route)
        return Check("experiments", experiments=exps, route=route)
    if route in SOME_EXPERIMENTS:
        exps = _named(method, args, body, "experiment_ids")
        if not exps:
            return Check("refuse", why=f"{route} needs experiment_ids", route=route)
        return Check("experiments", experiments=exps, route=route)
    if route in ONE_RUN:
        if body.get("models"):
            # log-inputs' ``models`` links logged models (anyone's id) to the run, as
            # runs/outputs does: logged models are not offered.
            return Check("refuse", why=f"linking logged models: {NOT_OFFERED}", route=route)
        runs = _named(method, args, body, "run_id", "run_uuid")
        if not runs:
            return Check("refuse", why=f"{route} needs run_id", route=route)
        return Check("runs", runs=runs, route=route)
    if route == "model-versions/search" and method == "GET":
        found = ONE_RUN_VERSIONS.match(_one(*what_mlflow_reads(method, args, body), "filter"))
        if found:
            return Check("runs", runs=(found.group(1),), route=route)
    if route in SOME_RUNS:
        runs = _named(method, args, body, "run_ids", "run_id")
        if not runs:
            return Check("refuse", why=f"{route} needs run_ids", route=route)
        return Check("runs", runs=runs, route=route)
    return Check("refuse", why=NOT_OFFERED, route=route)
