"""The names a ``%%train_distributed`` cell needs from the notebook, found before submit.

The ranks run the cell in a fresh namespace: a name it reads but never binds must
come from ``--vars`` (or be imported in the cell). Python's own symbol tables say
which names those are, so a cell that reads a notebook variable it did not send
is told at once, in the kernel, rather than by a rank's NameError after the job
has queued and started.
"""

from __future__ import annotations

import builtins
import symtable

_BUILTINS = frozenset(dir(builtins))


def free_names(code: str) -> set[str] | None:
    """Global names ``code`` reads and never binds (assigns, imports, defines);
    None when it is not plain Python (the ranks will say what is wrong with it)."""
    try:
        top = symtable.symtable(code, "<cell>", "exec")
    except (SyntaxError, ValueError):
        return None
    bound, read = set(), set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            name = symbol.get_name()
            at_top = table is top or symbol.is_declared_global()
            if at_top and (symbol.is_assigned() or symbol.is_imported()):
                bound.add(name)
            # A child scope's read of a name it does not bind goes to the cell's globals
            # (is_global); the cell's own reads are at the top.
            if symbol.is_referenced() and (table is top or symbol.is_global()):
                read.add(name)
    # Top-level function and class definitions are assignments in the top table.
    return read - bound - _BUILTINS
