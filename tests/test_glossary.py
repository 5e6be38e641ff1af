"""The words users read follow ``docs/reference/glossary.md``.

The glossary's "Words we do not use" table lists forms that crept in before
(``rank(s)``, "CPU only", milli-GPU in the kernel's output); this test reads every
string a user can be shown (Python string literals outside docstrings and log
calls, the lab's TypeScript, the example notebooks' code) and names each file and
line that uses one. Log lines are for operators and are left out.
"""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "reference" / "glossary.md"
PYTHON_ROOMS = (
    "backend",
    "client",
    "enforcement",
    "hub_ext",
    "lab",
    "magics",
    "scheduler",
    "service",
    "serving",
    "spawner",
    "telemetry",
    "training",
    "widgets",
)
#: Where milli-GPU must never show: what runs in the user's kernel and the lab.
KERNEL_SIDE = ("client", "magics", "widgets", "lab")
_TS_STRING = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_TS_CODE = re.compile(r"\$\{[^}]*\}")
_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def banned() -> list[tuple[str, re.Pattern, tuple[str, ...] | None]]:
    """``(the form, its pattern, the rooms it is banned in or None for all)`` from the
    glossary's table; the pattern is the table's second column."""
    rows = []
    section = GLOSSARY.read_text().split("## Words we do not use", 1)[1]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[0] in ("not", "") or set(cells[0]) <= {"-", " "}:
            continue
        form, pattern, _say, where = cells[:4]
        rooms = None if where == "everywhere" else KERNEL_SIDE
        rows.append((form, re.compile(pattern.strip("`")), rooms))
    return rows


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                ids.add(id(value))
    return ids


def _logged(tree: ast.AST) -> set[int]:
    """Strings inside ``log.info(...)``-like calls."""
    ids = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _LOG_METHODS
            and "log" in ast.unparse(node.func.value).lower()
        ):
            ids |= {id(n) for n in ast.walk(node)}
    return ids


def python_strings(source: Path | str):
    tree = ast.parse(source.read_text() if isinstance(source, Path) else source)
    skip = _docstrings(tree) | _logged(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def shown_strings():
    """``(room, where, text)`` for every string a user may read."""
    for room in PYTHON_ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            for line, text in python_strings(path):
                yield room, f"{path.relative_to(ROOT)}:{line}", text
    for path in sorted((ROOT / "lab" / "js" / "src").rglob("*.ts*")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for literal in _TS_STRING.findall(line):
                # A template's ${...} parts are code, not words.
                yield "lab", f"{path.relative_to(ROOT)}:{n}", _TS_CODE.sub("", literal)
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or source.lstrip().startswith(("%", "!")):
                continue
            for line, text in python_strings(source):
                yield "notebooks", f"{path.relative_to(ROOT)} cell {i} line {line}", text


def test_the_glossary_lists_the_words_and_the_forms_we_do_not_use():
    text = GLOSSARY.read_text()
    for term in ("slice", "replica", "endpoint", "no GPU", "GPU-hours", "rank", "torchao"):
        assert f"**{term}**" in text, term
    assert len(banned()) >= 3


@pytest.mark.parametrize("form, pattern, rooms", banned(), ids=lambda v: str(v)[:20])
def test_no_user_facing_string_uses_a_form_we_do_not_use(form, pattern, rooms):
    found = [
        f"{where}: {text.strip()[:100]!r}"
        for room, where, text in shown_strings()
        if (rooms is None or room in rooms) and pattern.search(text)
    ]
    assert not found, f"{form} (see docs/reference/glossary.md):\n" + "\n".join(found)
