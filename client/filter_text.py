"""Filters written in gpulab's grammar (the how-to's Filters) from Python values, for
the framework adapters: ``condition("lang", "==", "en")`` is ``metadata["lang"] == "en"``.
Standard library only; the service parses and bounds what it receives."""

from __future__ import annotations

import math

#: Comparisons the grammar takes.
COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")


def literal(value) -> str:
    """A string, number or bool as the grammar writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"filter: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        out = []
        for ch in value:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ch in "\n\r\t":
                out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
            elif ord(ch) < 0x20:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    raise ValueError(
        f"filter: a value must be a string, number or bool, not {type(value).__name__}"
    )


def field(key: str) -> str:
    """``metadata["key"]`` (``a.b`` is not a path: one key, as it was stored)."""
    return f"metadata[{literal(str(key))}]"


def listing(values) -> str:
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ValueError(f"filter: in/not in takes a list of values, not {values!r}")
    return "[" + ", ".join(literal(v) for v in values) + "]"


def both(*expressions: str) -> str:
    """The expressions that are not empty, all of which must hold."""
    given = [e for e in expressions if e]
    return " and ".join(f"({e})" for e in given) if len(given) > 1 else "".join(given)
