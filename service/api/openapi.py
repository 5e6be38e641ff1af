"""The OpenAPI 3 description of the service's routes, kept as data.

``openapi.json`` beside this module is the document; tests/service/test_openapi.py
checks that it names every route and method the service serves, and no other.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources


@functools.cache
def _document() -> dict:
    return json.loads(resources.files(__package__).joinpath("openapi.json").read_text())


def openapi_document(prefix: str) -> dict:
    """The document, with the service's URL prefix as its server."""
    doc = copy.deepcopy(_document())
    doc["servers"] = [{"url": prefix.rstrip("/")}]
    return doc
