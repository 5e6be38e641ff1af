"""A real text corpus that ships with Python: the standard library's docstrings.

One record per public standard-library module with a docstring, and one per public
top-level function or class of it that has its own docstring (``tarfile.open``)::

    {"id": "tarfile", "text": "Read from and write to tar format archives.",
     "metadata": {"module": "tarfile", "kind": "module"}}

``text`` is the docstring's first paragraph (at most ``MAX_CHARS`` characters), its
whitespace collapsed. Records come sorted by id; a text seen before is left out (many
classes share a docstring), so exact search has no ties between records. Vector
search tests and ``benchmarks/vector_search.py`` embed it: real sentences, no download.

The modules are imported in a fresh interpreter (``-I -S``: no site-packages, whose
``.pth`` hooks and monkeypatches — torch replaces ``inspect.getfile`` — would change
the texts), so the corpus is the same whatever the caller imported, and the caller's
process is spared some 180 imports.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import json
import re
import subprocess
import sys
import warnings

#: Longest text kept, in characters (the first paragraph is usually far shorter).
MAX_CHARS = 500
#: At most this many records: the first ones in id order.
MAX_RECORDS = 4000

# Modules that act on import (open a browser, print), need a display, or are the
# standard library's own tests and tools rather than its documented API.
_SKIP = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "test",
    "lib2to3",
    "pydoc_data",
    "ensurepip",
    "venv",
}
_SPACE = re.compile(r"\s+")


def docstrings() -> list[dict]:
    """The corpus: a fresh list of ``{"id", "text", "metadata"}`` records, sorted by id."""
    return [
        {"id": id_, "text": text, "metadata": {"module": module, "kind": kind}}
        for id_, text, module, kind in _records()
    ]


@functools.cache
def _records() -> tuple[tuple[str, str, str, str], ...]:
    done = subprocess.run(
        [sys.executable, "-I", "-S", __file__],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return tuple(tuple(r) for r in json.loads(done.stdout))


def _collect() -> list[tuple[str, str, str, str]]:
    """(id, text, module, kind) of every record, in this interpreter."""
    found = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in _SKIP:
            continue
        module = _quiet_import(name)
        if module is None:
            continue
        text = first_paragraph(module.__doc__)
        if not text:
            continue
        found.append((name, text, name, "module"))
        for attr, obj in _public_members(module):
            # A class's own docstring: inspect.getdoc would inherit its base's.
            doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
            text = first_paragraph(doc)
            if text:
                kind = "class" if inspect.isclass(obj) else "function"
                found.append((f"{name}.{attr}", text, name, kind))
    seen = set()
    unique = []
    for record in sorted(found):
        if record[1] not in seen:
            seen.add(record[1])
            unique.append(record)
    return unique[:MAX_RECORDS]


def first_paragraph(doc: object) -> str:
    """The first paragraph of a docstring, whitespace collapsed, at most ``MAX_CHARS``
    (cut at a word); "" for no docstring."""
    if not isinstance(doc, str):
        return ""
    paragraph = inspect.cleandoc(doc).strip().split("\n\n", 1)[0]
    text = _SPACE.sub(" ", paragraph).strip()
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rsplit(" ", 1)[0]
    return text


def _quiet_import(name: str):
    """The module, or None where it cannot be imported here (another platform's,
    a missing C library); whatever it prints or warns on import is swallowed."""
    sink = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception:  # ImportError, and whatever a module raises on this platform
        return None


def _public_members(module) -> list[tuple[str, object]]:
    """Public top-level functions and classes: those in ``__all__`` where the module
    has one, else those defined in it (not imported from elsewhere)."""
    exported = getattr(module, "__all__", None)
    members = []
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if exported is not None:
            if attr not in exported:
                continue
        elif getattr(obj, "__module__", None) != module.__name__:
            continue
        members.append((attr, obj))
    return members


if __name__ == "__main__":  # the fresh interpreter of _records()
    json.dump(_collect(), sys.stdout)
