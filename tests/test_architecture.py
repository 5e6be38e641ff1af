"""The room map of docs/explanation/architecture.md holds: imports run one way.

Read from the source with ``ast`` (nothing is imported), so a new import that
breaks a rule fails here with the file, the line and the rule it broke. Relative
imports are read as the modules they name. The tables in the page are compared with
the rules below, and each check is itself tested on a tree with the hole planted.
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
    "telemetry": {"cache", "client", "enforcement"},
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
    ("telemetry", "enforcement"): {
        "gpulab.enforcement.account_names",
        "gpulab.enforcement.peer_account",
    },
}
#: service/'s own rooms -> the others it may import. "app" is the composition root
#: (``app.py`` and ``__main__.py``: it builds every room, no room imports it);
#: "shared" is service/'s other top-level modules, what every room shares (who is
#: asking, the hub's API, kept tasks, group settings).
SERVICE_ROOMS = {
    "app": {
        "shared",
        "api",
        "jobs",
        "endpoints",
        "operations",
        "telemetry",
        "hibernation",
        "vectors",
        "experiments",
    },
    "shared": set(),
    "api": {"shared", "jobs", "endpoints", "operations", "telemetry", "hibernation", "vectors"},
    "jobs": {"shared", "telemetry"},
    "endpoints": {"shared", "jobs"},
    "operations": {"shared"},
    "telemetry": {"shared"},
    "hibernation": {"shared"},
    "vectors": {"shared", "endpoints"},
    "experiments": {"shared", "jobs"},
}
#: The composition root's modules, at service/'s top level.
APP_MODULES = {"app", "__main__"}
#: Service rooms allowed into another only through named modules.
SERVICE_NARROW = {
    # Who is asking reads a bounded body the same way the routes do.
    ("shared", "api"): {"gpulab.service.api.request_body"},
}
#: Inside a rank or a model server: never the hub. A model server is a web server
#: (tornado.web); a rank is not.
LIGHT_ROOMS = {
    "training": ("jupyterhub", "tornado.web", "sqlalchemy", "gpulab.hub_ext", "gpulab.service"),
    "serving": ("jupyterhub", "sqlalchemy", "gpulab.hub_ext", "gpulab.service"),
}


def package_of(path: pathlib.Path, root: pathlib.Path) -> list[str]:
    """``gpulab.<room>...``: the package a file's relative imports start from."""
    return ["gpulab", *path.relative_to(root).parent.parts]


def absolute(module: str, level: int, path: pathlib.Path, root: pathlib.Path) -> str:
    """``from ..service import app`` in ``scheduler/policy.py`` is ``gpulab.service``."""
    if not level:
        return module
    base = package_of(path, root)
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports(room: str, root: pathlib.Path = ROOT):
    """(file, line, module, names) for every import in a room's Python files; a
    relative import as the absolute module it names."""
    for path in sorted((root / room).rglob("*.py")):
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name, []
            elif isinstance(node, ast.ImportFrom):
                module = absolute(node.module or "", node.level, path, root)
                yield path, node.lineno, module, [a.name for a in node.names]


def where(path: pathlib.Path, line: int, root: pathlib.Path) -> str:
    return f"{path.relative_to(root)}:{line}"


def within(module: str, package: str) -> bool:
    """``module`` is ``package`` or inside it (``tornado.web.x`` is in ``tornado.web``)."""
    return module == package or module.startswith(package + ".")


# -- the checks, each over a tree (the repository, or one with a hole planted) ------------
def one_way(room: str, root: pathlib.Path = ROOT) -> list[str]:
    broken = []
    for path, line, module, names in imports(room, root):
        # `from gpulab import service` reaches the room it names.
        reached = {module.split(".")[1]} if within(module, "gpulab") and "." in module else set()
        if module == "gpulab":
            reached = set(names)
        for other in reached - {room}:
            if other not in ALLOWED[room]:
                broken.append(
                    f"{where(path, line, root)} imports {module}: {room}/ may import only "
                    f"{sorted(ALLOWED[room]) or 'no other room'}"
                )
    return broken


def narrow(pair: tuple[str, str], root: pathlib.Path = ROOT) -> list[str]:
    room, other = pair
    return [
        f"{where(path, line, root)} imports {module}: {room}/ may import from {other}/ only "
        f"{sorted(NARROW[pair])}"
        for path, line, module, _ in imports(room, root)
        if within(module, f"gpulab.{other}") and module not in NARROW[pair]
    ]


def private_names(root: pathlib.Path = ROOT) -> list[str]:
    broken = []
    for room in ALLOWED:
        for path, line, module, names in imports(room, root):
            if not within(module, "gpulab"):
                continue
            for name in names:
                if name.startswith("_") and not name.startswith("__"):
                    broken.append(f"{where(path, line, root)} imports {name} from {module}")
    return broken


def heavy_imports(room: str, root: pathlib.Path = ROOT) -> list[str]:
    heavy_packages = LIGHT_ROOMS[room]
    return [
        f"{where(p, ln, root)} imports {m}"
        for p, ln, m, names in imports(room, root)
        if any(within(m, heavy) for heavy in heavy_packages)
        # `from tornado import web`
        or any(within(f"{m}.{n}", heavy) for n in names for heavy in heavy_packages)
    ]


def service_room(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root / "service").parts
    if len(parts) > 1:
        return parts[0]
    return "app" if path.stem in APP_MODULES else "shared"


def imported_service_rooms(module: str, names: list[str]) -> set[str]:
    """The service rooms an import reaches (``from gpulab.service.jobs import manager``
    reaches jobs; ``from gpulab.service import auth`` the shared modules,
    ``gpulab.service.app`` the app)."""
    parts = module.split(".")
    if parts[:2] != ["gpulab", "service"]:
        return set()

    def room(name: str) -> str:
        if name in SERVICE_ROOMS and name not in ("app", "shared"):
            return name
        return "app" if name in APP_MODULES else "shared"

    if len(parts) > 2:
        return {room(parts[2])}
    return {room(n) for n in names}


def service_one_way(root: pathlib.Path = ROOT) -> list[str]:
    broken = []
    for path, line, module, names in imports("service", root):
        here = service_room(path, root)
        for there in imported_service_rooms(module, names) - {here}:
            if module in SERVICE_NARROW.get((here, there), ()):
                continue
            if there not in SERVICE_ROOMS[here]:
                broken.append(
                    f"{where(path, line, root)} imports {module}: service/{here} may import "
                    f"only {sorted(SERVICE_ROOMS[here]) or 'none'} of service/'s rooms"
                )
    return broken


def table(doc: str, heading: str) -> dict[str, str]:
    """The rows of the markdown table under ``heading``: first cell -> last cell."""
    section = doc.split(heading, 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0].startswith("`"):
            rows[cells[0].strip("`").rstrip("/")] = cells[-1]
    return rows


def doc_disagreements(doc: str) -> list[str]:
    """Where the page's "may import" columns say other than ALLOWED and SERVICE_ROOMS."""
    broken = []
    rooms = table(doc, "## Rooms")
    if set(rooms) != set(ALLOWED):
        broken.append(f"room table lists {sorted(rooms)}, the rules {sorted(ALLOWED)}")
    for room, cell in rooms.items():
        said = set(re.findall(r"`(\w+)`", cell)) & set(ALLOWED)
        if room in ALLOWED and said != ALLOWED[room]:
            broken.append(
                f"{room}/: the page says {sorted(said)}, the rules {sorted(ALLOWED[room])}"
            )
    service = table(doc, "## The rooms of `service/`")
    for name, cell in service.items():
        room = name.removeprefix("service/")
        said = set(re.findall(r"`(\w+)/`", cell))
        if "the shared modules" in cell:
            said.add("shared")
        want = SERVICE_ROOMS.get(room)
        if want is None:
            broken.append(f"service/{room}/ is in the page but not in SERVICE_ROOMS")
        elif said != want:
            broken.append(
                f"service/{room}/: the page says {sorted(said)}, the rules {sorted(want)}"
            )
    return broken


# -- the repository -------------------------------------------------------------------------
def test_every_room_is_on_the_map():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ALLOWED), (
        "a room was added or removed: add it to docs/explanation/architecture.md and ALLOWED"
    )


def test_the_page_says_what_the_rules_enforce():
    broken = doc_disagreements(DOC.read_text())
    assert not broken, f"{DOC.name} and this test disagree:\n" + "\n".join(broken)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_imports_run_one_way(room):
    broken = one_way(room)
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("pair", sorted(NARROW))
def test_narrow_doors_stay_narrow(pair):
    broken = narrow(pair)
    assert not broken, "\n".join(broken)


def test_no_private_names_across_modules():
    broken = private_names()
    assert not broken, "give these a public name:\n" + "\n".join(broken)


@pytest.mark.parametrize("room", sorted(LIGHT_ROOMS))
def test_ranks_and_model_servers_never_import_the_hub(room):
    broken = heavy_imports(room)
    assert not broken, "\n".join(broken)


def test_every_service_room_is_on_the_map():
    rooms = {p.parent.name for p in (ROOT / "service").glob("*/__init__.py")}
    assert rooms == set(SERVICE_ROOMS) - {"app", "shared"}, (
        "a room of service/ was added or removed: add it to SERVICE_ROOMS and to the "
        f"service table in {DOC.name}"
    )
    for room in rooms:
        init = ROOT / "service" / room / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} says what it holds"


def test_service_rooms_import_one_way():
    broken = service_one_way()
    assert not broken, "\n".join(broken)


# -- the checks themselves: each hole, planted, is found ---------------------------------------
def plant(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_relative_import_into_a_forbidden_room_is_found(tmp_path):
    root = plant(tmp_path, {"scheduler/policy.py": "from ..service import app\n"})
    assert one_way("scheduler", root) == [
        "scheduler/policy.py:1 imports gpulab.service: scheduler/ may import only ['db']"
    ]
    root = plant(tmp_path / "deep", {"scheduler/deep/x.py": "from ...backend.local import run\n"})
    assert one_way("scheduler", root) == [
        "scheduler/deep/x.py:1 imports gpulab.backend.local: scheduler/ may import only ['db']"
    ]
    # Inside a room, relative imports stay in it.
    fine = plant(tmp_path / "ok", {"scheduler/a.py": "from . import b\nfrom .b import c\n"})
    assert one_way("scheduler", fine) == []


def test_a_service_room_importing_the_app_is_found(tmp_path):
    root = plant(
        tmp_path,
        {
            "service/jobs/manager.py": "from ..app import GpuLabService\n",
            "service/endpoints/x.py": "from gpulab.service import app, auth\n",
            "service/operations/y.py": "from gpulab.service.auth import who\n",
        },
    )
    broken = service_one_way(root)
    assert len(broken) == 2, broken
    assert broken[0].startswith("service/endpoints/x.py:1 imports gpulab.service")
    assert broken[1].startswith("service/jobs/manager.py:1 imports gpulab.service.app")


def test_tornado_web_in_a_rank_is_found(tmp_path):
    root = plant(
        tmp_path,
        {
            "training/a.py": "import tornado.web\n",
            "training/b.py": "from tornado import web\n",
            "training/c.py": "from tornado.web import RequestHandler\n",
            "training/d.py": "import tornado.ioloop\n",
        },
    )
    assert [b.split(":")[0] for b in heavy_imports("training", root)] == [
        "training/a.py",
        "training/b.py",
        "training/c.py",
    ]
    plant(tmp_path, {"serving/e.py": "from jupyterhub.services.auth import HubAuth\n"})
    assert heavy_imports("serving", tmp_path) == ["serving/e.py:1 imports jupyterhub.services.auth"]


def test_a_page_that_disagrees_with_the_rules_is_found():
    doc = DOC.read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `scheduler/` |"))
    planted = doc.replace(row, row.rsplit("|", 2)[0] + "| `db`, `backend` |")
    assert doc_disagreements(planted) == [
        "scheduler/: the page says ['backend', 'db'], the rules ['db']"
    ]
    row = next(line for line in doc.splitlines() if line.startswith("| `service/jobs/` |"))
    planted = doc.replace(row, row.rsplit("|", 2)[0] + "| the shared modules |")
    assert doc_disagreements(planted) == [
        "service/jobs/: the page says ['shared'], the rules ['shared', 'telemetry']"
    ]


#: A lookup on the app, or a test of a backend's concrete class, on one line.
APP_LOOKUPS = re.compile(r"getattr\(service\b|isinstance\([^)]*LocalBackend")


def parts_holding_the_app(root: pathlib.Path = ROOT) -> list[str]:
    """A ``partial`` that binds anything of the app (``service``), however its call
    is wrapped over lines (read from the syntax tree), and the one-line lookups of
    :data:`APP_LOOKUPS`."""
    broken = []
    for path in sorted((root / "service").rglob("*.py")):
        rel = path.relative_to(root)
        source = path.read_text()
        for n, line in enumerate(source.splitlines(), 1):
            if APP_LOOKUPS.search(line):
                broken.append(f"{rel}:{n}: {line.strip()}")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            bound = [*node.args, *(k.value for k in node.keywords)]
            if name == "partial" and any(
                isinstance(n, ast.Name) and n.id == "service"
                for arg in bound
                for n in ast.walk(arg)
            ):
                broken.append(f"{rel}:{node.lineno}: partial of the app")
    return broken


def test_no_manager_holds_the_app():
    """Collaborators are passed by name: no partial of the app, no optional lookups on
    it, no test of a backend's concrete class (backends declare what they can)."""
    broken = parts_holding_the_app()
    assert not broken, "\n".join(broken)


def test_a_partial_of_the_app_over_lines_is_found(tmp_path):
    root = plant(
        tmp_path,
        {
            "service/endpoints/manager.py": (
                "import functools\n"
                "meter = Meter(\n"
                "    save=functools.partial(\n"
                "        service.db_threads.run, store.record\n"
                "    ),\n"
                ")\n"
                "ok = functools.partial(store.record, 1)\n"
                "jobs = getattr(service, 'jobs', None)\n"
            ),
        },
    )
    assert parts_holding_the_app(root) == [
        "service/endpoints/manager.py:8: jobs = getattr(service, 'jobs', None)",
        "service/endpoints/manager.py:3: partial of the app",
    ]


#: Links the app still sets on a part after building it, each with why it is left
#: (none now: the fine-tuning routes add themselves to the gateway as they are built).
LINKS_LEFT: set[str] = set()
ATTACH = re.compile(r"attach(_\w+)?")


def links_after_construction(root: pathlib.Path) -> list[str]:
    """Parts linked after they were built, in ``root``'s service/: an ``attach*``
    method (the part is handed another later), ``x.attr = self`` (a part handing
    itself back to one it holds), or the app setting an attribute on a part it built
    (``self.part.attr = ...`` in app.py). Collaborators are passed by name when each
    part is built, in one direction; a hook a part registers on another when it is
    built (``preemption.on_placed["job"] = ...``) is the one way back."""
    broken = []
    for path in sorted((root / "service").rglob("*.py")):
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if ATTACH.fullmatch(node.name):
                    broken.append(f"{rel}:{node.lineno} defines {node.name}()")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if ATTACH.fullmatch(node.func.attr):
                    broken.append(f"{rel}:{node.lineno} calls {ast.unparse(node.func)}()")
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if not isinstance(target, ast.Attribute):
                        continue
                    owner = target.value
                    if (
                        isinstance(owner, ast.Name)
                        and owner.id != "self"
                        and isinstance(node.value, ast.Name)
                        and node.value.id == "self"
                    ):
                        broken.append(f"{rel}:{node.lineno} hands itself back: {ast.unparse(node)}")
                    elif (
                        rel.as_posix() == "service/app.py"
                        and isinstance(owner, ast.Attribute)
                        and f"{rel.as_posix()}: {ast.unparse(target)}" not in LINKS_LEFT
                    ):
                        broken.append(
                            f"{rel}:{node.lineno} sets {ast.unparse(target)} on a part it built"
                        )
    return sorted(broken, key=lambda line: (line.split(":")[0], int(line.split(":")[1].split()[0])))


def test_no_part_is_linked_after_it_is_built():
    broken = links_after_construction(ROOT)
    assert not broken, "pass these by name when the part is built:\n" + "\n".join(broken)


def test_a_link_after_construction_is_found(tmp_path):
    root = plant(
        tmp_path,
        {
            "service/jobs/preemption.py": (
                "class Preemption:\n    def attach(self, jobs):\n        self.jobs = jobs\n"
            ),
            "service/jobs/manager.py": (
                "class JobManager:\n"
                "    def __init__(self, preemption):\n"
                "        preemption.jobs = self\n"
                '        preemption.on_placed["job"] = self.placed\n'
            ),
            "service/app.py": (
                "class App:\n"
                "    def init(self):\n"
                "        self.preemption.attach_servers(self.hibernations)\n"
                "        self.preemption.hibernations = self.hibernations\n"
                "        self.jobs = JobManager(preemption=self.preemption)\n"
            ),
        },
    )
    assert links_after_construction(root) == [
        "service/app.py:3 calls self.preemption.attach_servers()",
        "service/app.py:4 sets self.preemption.hibernations on a part it built",
        "service/jobs/manager.py:3 hands itself back: preemption.jobs = self",
        "service/jobs/preemption.py:2 defines attach()",
    ]


#: The managers built of parts: each part is given what it calls, so none imports its
#: manager back (a part that needed the manager would be handed it after it was built).
MANAGERS = ("gpulab.service.jobs.manager", "gpulab.service.endpoints.manager")


def parts_importing_their_manager(root: pathlib.Path = ROOT) -> list[str]:
    """Modules a manager imports (its parts, in its own folder) that import it back."""
    found: dict[str, list[tuple[pathlib.Path, int, str]]] = {}
    for path, line, module, names in imports("service", root):
        name = "gpulab." + ".".join(path.relative_to(root).with_suffix("").parts)
        for target in [module] + [f"{module}.{n}" for n in names]:
            found.setdefault(name, []).append((path, line, target))
    broken = []
    for manager in MANAGERS:
        folder = manager.rsplit(".", 1)[0]
        parts = {t for _, _, t in found.get(manager, ()) if t.rsplit(".", 1)[0] == folder}
        for part in sorted(parts - {manager}):
            for path, line, target in found.get(part, ()):
                if target == manager:
                    broken.append(f"{where(path, line, root)}: a part of {manager} imports it")
    return broken


def test_no_part_imports_its_manager():
    broken = parts_importing_their_manager()
    assert not broken, "give the part what it calls instead:\n" + "\n".join(broken)


def test_a_part_importing_its_manager_is_found(tmp_path):
    root = plant(
        tmp_path,
        {
            "service/jobs/manager.py": "from .poller import JobPoller\nfrom . import stops\n",
            "service/jobs/poller.py": "from gpulab.service.jobs.manager import JobManager\n",
            "service/jobs/stops.py": "from . import manager\n",
            # A client of the manager in its folder is not one of its parts.
            "service/jobs/schedules.py": "from .manager import JobManager\n",
        },
    )
    assert parts_importing_their_manager(root) == [
        "service/jobs/poller.py:1: a part of gpulab.service.jobs.manager imports it",
        "service/jobs/stops.py:1: a part of gpulab.service.jobs.manager imports it",
    ]
