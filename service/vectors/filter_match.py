"""A parsed filter (:mod:`.filters`) evaluated over a row's id and metadata, for the
embedded engine, which holds metadata beside its index and pre-filters with it.

Semantics are Milvus's over JSON: a path that is missing, or a value of another type
than the literal, matches no comparison (``!=`` included); ``not`` negates what is
inside it. Numbers compare across int and float, never with booleans. ``like`` is
matched by a regular expression made from a pattern :mod:`.filters` already bounded
(at most one ``%`` before its end, so no backtracking blow-up).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from functools import lru_cache

from .filters import And, Compare, Contains, Expr, Field, In, Like, Not, Or

_MISSING = object()
OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}

#: (row id, metadata) -> whether the row matches.
Predicate = Callable[[str, dict], bool]


def predicate(expr: Expr) -> Predicate:
    """``expr`` as a function of a row, built once per search."""
    if isinstance(expr, And):
        parts = [predicate(e) for e in expr.operands]
        return lambda rid, meta: all(p(rid, meta) for p in parts)
    if isinstance(expr, Or):
        parts = [predicate(e) for e in expr.operands]
        return lambda rid, meta: any(p(rid, meta) for p in parts)
    if isinstance(expr, Not):
        inner = predicate(expr.operand)
        return lambda rid, meta: not inner(rid, meta)
    get = _getter(expr.field)
    if isinstance(expr, Compare):
        op, value = OPS[expr.op], expr.value
        return lambda rid, meta: _compare(get(rid, meta), op, value)
    if isinstance(expr, In):
        values, negated = expr.values, expr.negated
        return lambda rid, meta: negated != any(_same(get(rid, meta), v) for v in values)
    if isinstance(expr, Like):
        regex, negated = _like(expr.pattern), expr.negated

        def like(rid, meta):
            found = get(rid, meta)
            return negated != (isinstance(found, str) and regex.fullmatch(found) is not None)

        return like
    if isinstance(expr, Contains):
        return _contains(expr, get)
    raise TypeError(f"not a filter: {expr!r}")


def _getter(field: Field):
    if field.name == "id":
        return lambda rid, meta: rid
    path = field.path

    def get(rid, meta):
        node = meta
        for step in path:
            if isinstance(step, int):
                if not isinstance(node, list) or not -len(node) <= step < len(node):
                    return _MISSING
            elif not isinstance(node, dict) or step not in node:
                return _MISSING
            node = node[step]
        return node

    return get


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _same(found, value) -> bool:
    return _kind(found) == _kind(value) != "other" and found == value


def _compare(found, op, value) -> bool:
    kind = _kind(found)
    if kind != _kind(value) or kind == "other":
        return False
    if kind == "bool" and op not in (operator.eq, operator.ne):
        return False
    return op(found, value)


def _contains(expr: Contains, get):
    wanted = expr.value if isinstance(expr.value, tuple) else (expr.value,)
    # Keyed by kind as _same compares (1 and 1.0 alike, never True): a row's list is
    # read once, not once a wanted value (1,000 values over a 30,000-item list would
    # be 30 million comparisons a row).
    keys = {(_kind(w), w) for w in wanted if _kind(w) != "other"}
    need_all = expr.function == "json_contains_all"
    if need_all and any(_kind(w) == "other" for w in wanted):
        return lambda rid, meta: False  # a value no item can be: no row has them all

    def contains(rid, meta):
        found = get(rid, meta)
        if not isinstance(found, list):
            return False
        have = {(kind, item) for item in found if (kind := _kind(item)) != "other"}
        return keys <= have if need_all else not keys.isdisjoint(have)

    return contains


@lru_cache(maxsize=256)
def _like(pattern: str) -> re.Pattern:
    """Milvus's ``like``: ``%`` any run of characters, ``_`` one character."""
    parts = []
    for ch in pattern:
        parts.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
    return re.compile("".join(parts), re.DOTALL)
