"""Every client call the docs show exists: ``Client().jobs()`` in the JupyterLab how-to
named no method (the method is ``list_jobs``), and a reader who copies it gets an
AttributeError instead of their jobs."""

from __future__ import annotations

import re
from pathlib import Path

from gpulab.client import Client
from gpulab.client.base import AsyncClient

ROOT = Path(__file__).resolve().parents[2]
#: ``Client().list_jobs(``, ``gl.usage(``: the docs' two ways of naming the client.
CALL = re.compile(r"\b(?:Client\([^()]*\)|gl)\.([A-Za-z_][A-Za-z0-9_]*)\(")


def doc_calls() -> dict[str, list[str]]:
    """Method name -> the documents that call it."""
    found: dict[str, list[str]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in CALL.findall(path.read_text()):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_client_method_the_docs_call_exists():
    calls = doc_calls()
    assert len(calls) >= 5, calls  # the scan sees the docs' calls
    missing = {
        name: docs
        for name, docs in calls.items()
        if not (hasattr(AsyncClient, name) or hasattr(Client, name))
    }
    assert not missing, f"the docs call client methods that do not exist: {missing}"
