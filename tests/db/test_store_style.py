"""db/ has one style: a table's queries are methods of a store given the engine
(``DeploymentStore(engine)``, on :class:`gpulab.db.store.Store`), never free functions
that take the engine. A module-level function of db/ that takes an engine or a
connection is a query outside a store, and this test names it."""

from __future__ import annotations

import ast
import pathlib

DB = pathlib.Path(__file__).resolve().parents[2] / "db"

#: What may take the engine at module level, and why.
OUTSIDE_STORES = {
    # Making and migrating the engine, and the writer's transaction every store uses.
    "engine.py: make_engine",
    "engine.py: writer",
    "engine.py: lock_for_write",
    "migrate.py: alembic_config",
    "migrate.py: current",
    "migrate.py: upgrade",
}


def queries_outside_stores(folder: pathlib.Path) -> list[str]:
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            params = [a.arg for a in node.args.args]
            if params and params[0] in ("engine", "conn", "connection"):
                found.append(f"{path.name}: {node.name}")
    return found


def test_every_query_is_a_method_of_a_store():
    outside = set(queries_outside_stores(DB)) - OUTSIDE_STORES
    assert not outside, "make these methods of the module's store:\n" + "\n".join(sorted(outside))


def test_a_free_query_is_found(tmp_path):
    (tmp_path / "things.py").write_text(
        "def get_thing(engine, thing_id):\n    pass\n\n"
        "def thing_json(row):\n    pass\n\n"
        "class ThingStore:\n    def get(self, thing_id):\n        pass\n"
    )
    assert queries_outside_stores(tmp_path) == ["things.py: get_thing"]
