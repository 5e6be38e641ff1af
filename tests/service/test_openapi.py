"""The OpenAPI document (service/openapi.json) names what the service serves.

Every route module's handlers are read for the HTTP methods they define; the
document must list each route with exactly those methods, and nothing else, so
a new route without its description (or a described route that is gone) fails.
"""

from __future__ import annotations

import json
import re

from tornado import web

from gpulab.service.api.openapi import openapi_document
from gpulab.service.app import ROUTE_MODULES

METHODS = ("get", "post", "put", "patch", "delete")


def served() -> dict[str, set[str]]:
    """Path template (``/api/v1/jobs/{}``) -> methods its handler defines."""
    found = {}
    for module in ROUTE_MODULES:
        for pattern, handler in module.routes:
            template = "/" + re.sub(r"\([^)]*\)", "{}", pattern)
            found[template] = {
                m for m in METHODS if getattr(handler, m) is not getattr(web.RequestHandler, m)
            }
    return found


def described(doc: dict) -> dict[str, set[str]]:
    return {
        re.sub(r"\{[^}]*\}", "{}", path): {m for m in ops if m in METHODS}
        for path, ops in doc["paths"].items()
    }


def test_every_served_route_and_method_is_described_and_nothing_else():
    doc = described(openapi_document("/services/gpulab/"))
    routes = served()
    # The inference proxy serves a whole subtree (``.../{}`` ends in ``(.*)``);
    # the document describes its OIP v2 routes below that prefix.
    prefixes = {t[:-3] for t in routes if t.endswith("/{}") and "endpoints" in t}
    missing, extra = [], []
    for template, methods in routes.items():
        if template[:-3] in prefixes:
            below = [p for p in doc if p.startswith(template[:-3] + "/")]
            if not below:
                missing.append(f"{template}: nothing described below it")
            continue
        if template not in doc:
            missing.append(f"{template} {sorted(methods)}")
        elif doc[template] != methods:
            missing.append(
                f"{template}: serves {sorted(methods)}, described {sorted(doc[template])}"
            )
    for template, methods in doc.items():
        if template not in routes and not any(template.startswith(p + "/") for p in prefixes):
            extra.append(f"{template} {sorted(methods)}")
    assert not missing, "add to service/openapi.json:\n" + "\n".join(missing)
    assert not extra, "described but not served:\n" + "\n".join(extra)


def test_the_document_is_valid_openapi_and_names_its_server():
    doc = openapi_document("/services/gpulab/")
    assert doc["openapi"].startswith("3.")
    assert doc["servers"] == [{"url": "/services/gpulab"}]
    # Every $ref points at something the document defines.
    text = json.dumps(doc)
    for kind in ("schemas", "responses"):
        refs = set(re.findall(rf'"#/components/{kind}/([^"]+)"', text))
        assert refs <= set(doc["components"][kind]), refs - set(doc["components"][kind])
    # Every operation says what errors look like.
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method in METHODS:
                assert "responses" in op, f"{method.upper()} {path} has no responses"
