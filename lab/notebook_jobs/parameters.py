"""A notebook job's parameters, injected as papermill injects them.

A cell tagged ``injected-parameters`` goes right after the cell tagged
``parameters`` (or first, if none is tagged), replacing one injected before, so
the notebook's own defaults are set first and the job's values win. Jupyter
Scheduler sends every value as text; as papermill's ``-p`` does, a value that
reads as a Python literal (``3``, ``0.5``, ``True``, ``[1, 2]``) is that literal,
anything else a string.
"""

from __future__ import annotations

import ast
import keyword

from nbformat import NotebookNode, v4

INJECTED_TAG = "injected-parameters"
PARAMETERS_TAG = "parameters"


class ParameterError(ValueError):
    """A parameter name that cannot be a Python variable."""


def literal(value) -> str:
    """The Python source a parameter's value is injected as."""
    if not isinstance(value, str):
        return repr(value)
    try:
        ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return repr(value)
    return value.strip()


def _index(nb: NotebookNode, tag: str) -> int:
    for i, cell in enumerate(nb.cells):
        if tag in cell.get("metadata", {}).get("tags", []):
            return i
    return -1


def inject(nb: NotebookNode, parameters: dict | None) -> NotebookNode:
    """``nb`` with ``parameters`` set in an injected cell (unchanged if there are none)."""
    if not parameters:
        return nb
    lines = ["# Parameters"]
    for name, value in parameters.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ParameterError(
                f"parameter {name!r} is not a Python variable name; use letters, digits "
                f"and '_' (not starting with a digit)"
            )
        lines.append(f"{name} = {literal(value)}")
    cell = v4.new_code_cell(source="\n".join(lines))
    cell.metadata["tags"] = [INJECTED_TAG]
    injected = _index(nb, INJECTED_TAG)
    if injected >= 0:
        nb.cells[injected] = cell
    else:
        nb.cells.insert(_index(nb, PARAMETERS_TAG) + 1, cell)
    return nb
