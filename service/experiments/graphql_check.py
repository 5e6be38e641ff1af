"""What a GraphQL request of MLflow's UI reaches: the experiments and runs it names.

MLflow's UI reads a run's page through ``/graphql`` (``query GetRun($data:
MlflowGetRunInput!) { mlflowGetRun(input: $data) { ... } }``). Each root field of
MLflow's schema takes one ``input`` that names its experiments or runs; a query whose
every root field is one of those below, with the ids given, is checked as the REST
routes are. Anything else (a mutation, a field of the model registry, introspection,
a fragment at the root) is refused.
"""

from __future__ import annotations

from graphql import FieldNode, GraphQLError, OperationDefinitionNode, OperationType, parse
from graphql.utilities import value_from_ast_untyped

#: Root field -> (what it names, the input's keys that name it).
ROOTS = {
    "mlflowGetExperiment": ("experiments", ("experimentId",)),
    "mlflowSearchRuns": ("experiments", ("experimentIds",)),
    "mlflowSearchDatasets": ("experiments", ("experimentIds",)),
    "mlflowGetRun": ("runs", ("runId", "runUuid")),
    "mlflowListArtifacts": ("runs", ("runId", "runUuid")),
    "mlflowGetMetricHistoryBulkInterval": ("runs", ("runIds",)),
}


#: The largest query checked, in characters and in tokens. The UI's queries are a few
#: hundred tokens; parsing runs on the proxy's event loop (880 KB took 2.2 s there).
MAX_QUERY_CHARS = 64 << 10
MAX_QUERY_TOKENS = 2000


class Unchecked(ValueError):
    """A query the proxy cannot check (the message says why)."""


def _ids(value) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value if v not in (None, "")]
    return [str(value)] if value not in (None, "") else []


def _operation(document, name: str | None) -> OperationDefinitionNode:
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if name:
        operations = [o for o in operations if o.name and o.name.value == name]
    if len(operations) != 1:
        raise Unchecked("send one GraphQL operation (or name it with operationName)")
    return operations[0]


def targets(body: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(experiment ids, run ids)`` a GraphQL request body reaches; Unchecked if the
    proxy cannot tell."""
    query = body.get("query")
    if not isinstance(query, str):
        raise Unchecked("a GraphQL request needs its query")
    if len(query) > MAX_QUERY_CHARS:
        raise Unchecked(f"a GraphQL query here is at most {MAX_QUERY_CHARS // 1024} KiB")
    try:
        document = parse(query, max_tokens=MAX_QUERY_TOKENS)
    except GraphQLError as e:
        raise Unchecked(f"the GraphQL query does not parse: {e.message}") from None
    operation = _operation(document, body.get("operationName"))
    if operation.operation != OperationType.QUERY:
        raise Unchecked("only GraphQL queries are offered through gpulab")
    variables = body.get("variables") or {}
    if not isinstance(variables, dict):
        raise Unchecked("GraphQL variables must be an object")
    experiments: list[str] = []
    runs: list[str] = []
    for selection in operation.selection_set.selections:
        if not isinstance(selection, FieldNode):
            raise Unchecked("no fragments at the root of a GraphQL query here")
        name = selection.name.value
        if name == "__typename":
            continue
        if name not in ROOTS:
            raise Unchecked(f"{name} is not offered through gpulab")
        kind, keys = ROOTS[name]
        given = {a.name.value: a.value for a in selection.arguments or []}
        if set(given) != {"input"}:
            raise Unchecked(f"{name} takes its ids in 'input'")
        value = value_from_ast_untyped(given["input"], variables)
        if not isinstance(value, dict):
            raise Unchecked(f"{name}: 'input' must be an object")
        ids = [i for key in keys for i in _ids(value.get(key))]
        if not ids:
            raise Unchecked(f"{name} must name its {kind} ({' or '.join(keys)})")
        (experiments if kind == "experiments" else runs).extend(ids)
    if not experiments and not runs:
        raise Unchecked("the GraphQL query names no experiment or run")
    return tuple(dict.fromkeys(experiments)), tuple(dict.fromkeys(runs))
