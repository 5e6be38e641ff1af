"""The room map of docs/explanation/architecture.md holds: imports run one way.

Read from the source with ``ast`` (nothing is imported), so a new import that
breaks a rule fails here with the file, the line and the rule it broke.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "explanation" / "architecture.md"

#: room -> the other gpulab rooms it may import (the table in architecture.md).
ALLOWED = {
    "db": set(),
    "scheduler": {"db"},
    "enforcement": {"scheduler"},
    "backend": {"scheduler", "enforcement", "training", "client"},
    "service": {"db", "scheduler", "enforcement", "backend", "telemetry", "training", "client"},
    "spawner": {"scheduler", "enforcement", "backend", "client"},
    "hub_ext": {"spawner", "scheduler", "telemetry", "enforcement", "service", "backend"},
    "training": set(),
    "serving": set(),
    "telemetry": {"cache", "client"},
    "cache": {"training"},
    "client": set(),
    "widgets": {"client"},
    "magics": {"client", "widgets", "serving", "training"},
    "lab": {"client"},
}
#: Rooms allowed into another only through a few named modules: (room, other) -> modules.
NARROW = {
    ("spawner", "backend"): {"gpulab.backend.slurm_site", "gpulab.backend.slurm_inventory"},
    # Which CAs to trust (GPULAB_CA_FILE), the same way wherever gpulab calls over https.
    ("spawner", "client"): {"gpulab.client.tls"},
    ("service", "client"): {"gpulab.client.tls"},
    ("backend", "client"): {"gpulab.client.tls"},
    ("telemetry", "client"): {"gpulab.client.tls"},
}
#: service/'s own rooms -> the others it may import ("app": service/'s top-level
#: modules, the app and what every room shares: auth, the hub's API, kept tasks).
SERVICE_ROOMS = {
    "app": {"api", "jobs", "endpoints", "operations", "telemetry", "hibernation", "vectors"},
    "api": {"app", "jobs", "endpoints", "operations", "telemetry", "hibernation", "vectors"},
    "jobs": {"app", "telemetry"},
    "endpoints": {"app", "jobs"},
    "operations": {"app"},
    "telemetry": {"app"},
    "hibernation": {"app"},
    "vectors": {"app", "endpoints"},
}
#: Inside a rank or a model server: never the hub.
LIGHT_ROOMS = ("training", "serving")


def imports(room: str):
    """(file, line, module, names) for every import in a room's Python files."""
    for path in sorted((ROOT / room).rglob("*.py")):
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name, []
            elif isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                yield path, node.lineno, module, [a.name for a in node.names]


def where(path: pathlib.Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_every_room_is_on_the_map():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ALLOWED), (
        "a room was added or removed: add it to docs/explanation/architecture.md and ALLOWED"
    )
    doc = DOC.read_text()
    for room in ALLOWED:
        assert f"| `{room}/` |" in doc, f"{room}/ is missing from the room table in {DOC.name}"


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_run_one_way(room):
    broken = []
    for path, line, module, _ in imports(room):
        m = re.match(r"gpulab\.(\w+)", module)
        if m and m.group(1) != room and m.group(1) not in ALLOWED[room]:
            broken.append(
                f"{where(path, line)} imports {module}: {room}/ may import only "
                f"{sorted(ALLOWED[room]) or 'no other room'}"
            )
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("pair", sorted(NARROW))
def test_narrow_doors_stay_narrow(pair):
    room, other = pair
    broken = [
        f"{where(path, line)} imports {module}: {room}/ may import from {other}/ only "
        f"{sorted(NARROW[pair])}"
        for path, line, module, _ in imports(room)
        if module.startswith(f"gpulab.{other}") and module not in NARROW[pair]
    ]
    assert not broken, "\n".join(broken)


def test_no_private_names_across_modules():
    broken = []
    for room in ALLOWED:
        for path, line, module, names in imports(room):
            if not (module.startswith(".") or module.startswith("gpulab")):
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    broken.append(f"{where(path, line)} imports {name} from {module}")
    assert not broken, "give these a public name:\n" + "\n".join(broken)


@pytest.mark.parametrize("room", LIGHT_ROOMS)
def test_ranks_and_model_servers_never_import_the_hub(room):
    heavy = [
        f"{where(p, ln)} imports {m}"
        for p, ln, m, _ in imports(room)
        if m.split(".")[0] in ("jupyterhub", "tornado.web", "sqlalchemy")
        or m.startswith("gpulab.hub_ext")
        or m.startswith("gpulab.service")
    ]
    assert not heavy, "\n".join(heavy)


def service_room(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT / "service").parts
    return parts[0] if len(parts) > 1 else "app"


def imported_service_rooms(module: str, names: list[str]) -> set[str]:
    """The service rooms an import reaches (``from gpulab.service.jobs import manager``
    reaches jobs; ``from gpulab.service import auth`` the app)."""
    parts = module.split(".")
    if parts[:2] != ["gpulab", "service"]:
        return set()
    if len(parts) > 2:
        return {parts[2] if parts[2] in SERVICE_ROOMS else "app"}
    return {n if n in SERVICE_ROOMS else "app" for n in names}


def test_every_service_room_is_on_the_map():
    rooms = {p.parent.name for p in (ROOT / "service").glob("*/__init__.py")}
    assert rooms == set(SERVICE_ROOMS) - {"app"}, (
        "a room of service/ was added or removed: add it to SERVICE_ROOMS and to the "
        f"service table in {DOC.name}"
    )
    doc = DOC.read_text()
    for room in rooms:
        assert f"| `service/{room}/` |" in doc, f"service/{room}/ is missing from {DOC.name}"
        init = ROOT / "service" / room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says what it holds"


def test_service_rooms_import_one_way():
    broken = []
    for path, line, module, names in imports("service"):
        here = service_room(path)
        for there in imported_service_rooms(module, names) - {here}:
            if there not in SERVICE_ROOMS[here]:
                broken.append(
                    f"{where(path, line)} imports {module}: service/{here}/ may import "
                    f"only {sorted(SERVICE_ROOMS[here])} of service/'s rooms"
                )
    assert not broken, "\n".join(broken)
