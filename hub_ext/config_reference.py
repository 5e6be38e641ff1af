"""gpulab's settings, read from the traits themselves: ``gpulab up --help-all`` and
``docs/reference/config.md``.

Regenerate the reference after adding or changing a setting::

    python -m gpulab.hub_ext.config_reference > docs/reference/config.md

A *gpulab setting* is a ``config=True`` trait that a gpulab class defines, or one
that a gpulab class inherits from JupyterHub, KubeSpawner or NativeAuthenticator
and gives a default of its own (``@default``). Every other inherited trait
(``Spawner.http_timeout``...) is left to its project's own documentation.

The classes are found in the source (any class of the rooms below with a
``config=True`` trait), so a new one shows here without being listed; a mixin
whose traits reach users through a subclass (``GpuLabServiceMixin``,
``SharingSettings``, the spawners' base ``FractionalHostSpawner``) shows under that
subclass.

The JupyterLab server extension's classes (``lab/``) are settings of each user's
server (jupyter_server's configuration), not of the hub's file: they come last,
each section saying where its settings go.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import sys
import textwrap
from dataclasses import dataclass, field

from traitlets.config import Configurable

#: Rooms whose classes configure the platform (the others run in users' kernels).
ROOMS = ("service", "spawner", "enforcement", "backend", "hub_ext", "scheduler", "telemetry", "db")
#: Rooms whose classes configure each user's JupyterLab server (jupyter_server), not the hub.
SERVER_ROOMS = ("lab",)
#: The order classes are shown in; others follow, by name.
FIRST = (
    "GpuLabService",
    "FractionalLocalSpawner",
    "FractionalKubeSpawner",
    "UserAccounts",
    "AccountLimits",
    "GpuLabNativeAuthenticator",
)
REGENERATE = "python -m gpulab.hub_ext.config_reference > docs/reference/config.md"


@dataclass
class Setting:
    name: str
    kind: str  # the trait's type: Unicode, Int...
    help: str  # dedented
    default: str  # Python: the value, or the expression (or function) that computes it
    computed: bool = False  # at start (env, the machine, the instance), not a constant
    choices: str = ""  # Enum's values
    inherited_from: str = ""  # "Spawner" when gpulab only sets the default
    defined_on: str = ""  # a gpulab base class that defines it ("FractionalHostSpawner")


@dataclass
class Section:
    cls: type
    description: str
    settings: list[Setting] = field(default_factory=list)
    missing: str = ""  # why the class could not be imported (an optional extra)

    @property
    def name(self) -> str:
        return self.cls if isinstance(self.cls, str) else self.cls.__name__

    @property
    def in_server(self) -> bool:
        """A setting of each user's JupyterLab server (``SERVER_ROOMS``), not the hub's."""
        module = "" if isinstance(self.cls, str) else self.cls.__module__
        return module.partition(".")[2].partition(".")[0] in SERVER_ROOMS

    def where(self) -> str:
        """For a server's section: where its settings go (the hub's file does not reach it)."""
        if not self.in_server:
            return ""
        first = self.settings[0] if self.settings else None
        example = f"--{self.name}.{first.name}={first.default}" if first else ""
        return (
            "Settings of each user's JupyterLab server (the server extension `gpulab.lab`), "
            "not of gpulab_config.py: set them in `jupyter_server_config.py` where the "
            "servers run (e.g. `<venv>/etc/jupyter/`), or on every server's command line "
            f'through the hub: `c.Spawner.args = ["{example}"]`.'
        )


def _is_gpulab(obj) -> bool:
    return (getattr(obj, "__module__", "") or "").startswith("gpulab.")


def _has_config_trait(node: ast.ClassDef) -> bool:
    """Does the class body assign a trait with ``.tag(config=True)`` or ``config=True``?"""
    for stmt in node.body:
        if not isinstance(stmt, ast.Assign):
            continue
        for call in ast.walk(stmt.value):
            if isinstance(call, ast.Call) and any(
                kw.arg == "config" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                for kw in call.keywords
            ):
                return True
    return False


def discover() -> list[tuple[str, str]]:
    """``(module, class name)`` of every class in ``ROOMS`` and ``SERVER_ROOMS`` with a
    ``config=True`` trait, and the classes of ``FIRST``."""
    classes: list[tuple[str, ast.ClassDef]] = []
    for room in ROOMS + SERVER_ROOMS:
        spec = importlib.util.find_spec(f"gpulab.{room}")
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            for dirpath, dirnames, filenames in os.walk(folder):
                # Packages only: lab/js (TypeScript, node_modules) holds no settings.
                dirnames[:] = sorted(
                    d for d in dirnames if os.path.exists(os.path.join(dirpath, d, "__init__.py"))
                )
                for name in sorted(filenames):
                    if not name.endswith(".py"):
                        continue
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, folder)[:-3].replace(os.sep, ".")
                    module = f"gpulab.{room}" + ("" if rel == "__init__" else f".{rel}")
                    module = module.removesuffix(".__init__")
                    with open(path, encoding="utf-8") as f:
                        tree = ast.parse(f.read(), path)
                    classes += [
                        (module, node) for node in tree.body if isinstance(node, ast.ClassDef)
                    ]
    # The classes users name (FIRST) show even when their settings are all inherited
    # (FractionalLocalSpawner's come from FractionalHostSpawner).
    return [(m, node.name) for m, node in classes if _has_config_trait(node) or node.name in FIRST]


def _default_of(cls: type, name: str, trait) -> tuple[str, bool]:
    """The default as gpulab sets it: ``(python, computed)``; a constant, else what computes it."""
    generator = cls._all_trait_default_generators.get(name)
    func = getattr(generator, "func", None)
    if func is None:
        try:
            return trait.default_value_repr(), False
        except AssertionError:  # traitlets' Type with no class to name (allow_none)
            return repr(trait.default_value), False
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(func)))
        body = [
            s
            for s in tree.body[0].body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        ]
    except (OSError, TypeError, SyntaxError):
        body = []
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        expr = body[0].value
        try:
            return repr(ast.literal_eval(expr)), False
        except ValueError:
            return ast.unparse(expr), True
    return f"{func.__qualname__}(self)", True


def own_settings(cls: type) -> list[Setting]:
    """The class's gpulab settings (see the module): defined or given a default by gpulab."""
    out = []
    for name, trait in sorted(cls.class_traits(config=True).items()):
        definer = trait.this_class
        generator = cls._all_trait_default_generators.get(name)
        default_by_gpulab = _is_gpulab(getattr(generator, "this_class", None))
        if not (_is_gpulab(definer) or default_by_gpulab):
            continue
        kind = type(trait).__name__
        choices = trait.info() if "Enum" in kind else ""
        default, computed = _default_of(cls, name, trait)
        out.append(
            Setting(
                name=name,
                kind=kind,
                help=inspect.cleandoc(trait.help or ""),
                default=default,
                computed=computed,
                choices=choices,
                inherited_from="" if _is_gpulab(definer) else definer.__name__,
                # Said where the help's example names the base class, not this one.
                defined_on=definer.__name__
                if _is_gpulab(definer)
                and definer is not cls
                and f"c.{definer.__name__}." in (trait.help or "")
                else "",
            )
        )
    return out


def _description(cls: type) -> str:
    # An Application's plain ``description`` string, else the class docstring.
    desc = next(
        (
            k.__dict__["description"]
            for k in cls.__mro__
            if isinstance(k.__dict__.get("description"), str) and _is_gpulab(k)
        ),
        "",
    )
    return inspect.cleandoc(desc or cls.__doc__ or "")


def sections() -> list[Section]:
    """Every gpulab class with settings, in ``FIRST`` order, then by name; the servers'
    (``SERVER_ROOMS``) last."""
    classes: dict[str, type | Section] = {}
    for module, name in discover():
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as e:  # an optional extra (kubespawner) not installed
            classes[name] = Section(name, "", missing=f"{module}: {e}")
            continue
        if isinstance(cls, type) and issubclass(cls, Configurable):
            classes[name] = cls
    real = [c for c in classes.values() if isinstance(c, type)]
    # A mixin's or a shared base's traits show under the classes users configure
    # (FractionalHostSpawner's under the local and the Slurm spawner). A class users
    # configure themselves (FIRST) keeps its section when another extends it; the
    # extension then lists only what it adds.
    shown = [
        c
        for c in real
        if c.__name__ in FIRST or not any(o is not c and issubclass(o, c) for o in real)
    ]

    def added(c: type) -> list[Setting]:
        parents = [p for p in shown if p is not c and issubclass(c, p)]
        theirs = {n for p in parents for n in p.class_traits(config=True)}
        return [s for s in own_settings(c) if s.name not in theirs]

    out = [Section(c, _description(c), added(c)) for c in shown]
    out += [s for s in classes.values() if isinstance(s, Section)]
    out = [s for s in out if s.settings or s.missing]

    def order(s: Section):
        return (s.in_server, FIRST.index(s.name) if s.name in FIRST else len(FIRST), s.name)

    return sorted(out, key=order)


def paragraphs(text: str) -> list[tuple[bool, list[str]]]:
    """``(is_code, lines)`` per paragraph: examples (``c.X.y = ...``, indented) are code."""
    out = []
    for para in text.split("\n\n"):
        lines = [line.rstrip() for line in para.strip("\n").split("\n")]
        if not any(lines):
            continue
        code = all(line.startswith(("c.", " ")) for line in lines if line)
        out.append((code, lines))
    return out


def _commented(text: str, first: str = "## ", rest: str = "#  ") -> list[str]:
    """A help text as comment lines: prose wrapped at 78 columns, examples as they are."""
    body: list[str] = []
    for code, lines in paragraphs(text):
        if body:
            body.append("")
        body += lines if code else textwrap.wrap(" ".join(lines), 78)
    return [(first if i == 0 else rest) + line if line else "#" for i, line in enumerate(body)]


def _summary(setting: Setting) -> str:
    """An inherited setting's help: its first paragraph (its project documents the rest)."""
    first = paragraphs(setting.help)
    return "\n".join(first[0][1]) if first else ""


def as_config_file(secs: list[Section] | None = None) -> str:
    """``gpulab up --help-all``: every setting as a commented gpulab_config.py."""
    secs = sections() if secs is None else secs
    lines = [
        "# gpulab's settings, for <data-dir>/gpulab_config.py (read by the hub and the",
        "# gpulab service). JupyterHub's own settings: jupyterhub --help-all. The last",
        "# sections are the users' JupyterLab servers' settings; each says where they go.",
        "",
    ]
    for s in secs:
        lines += ["#" + "-" * 78, f"# {s.name}", "#" + "-" * 78]
        if s.missing:
            lines += [
                f"# not installed here ({s.missing}); pip install 'gpulab[kubernetes]' adds it",
                "",
            ]
            continue
        if s.description:
            lines += _commented(s.description, "# ", "# ") + [""]
        if s.where():
            lines += _commented(s.where(), "# ", "# ") + [""]
        for t in s.settings:
            text = _summary(t) if t.inherited_from else t.help
            if text:
                lines += _commented(text)
            if t.inherited_from:
                lines.append(f"#  ({t.inherited_from}'s setting; gpulab sets its default)")
            if t.choices:
                lines.append(f"#  Choices: {t.choices}")
            default = f"computed at start: {t.default}" if t.computed else t.default
            lines += [
                f"#  Default: {default}",
                f"# c.{s.name}.{t.name} = " + ("..." if t.computed else t.default),
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def _markdown_help(text: str) -> list[str]:
    """Paragraphs as text; examples as Python blocks."""
    out: list[str] = []
    for code, lines in paragraphs(text):
        out += ["```python", *lines, "```", ""] if code else [*lines, ""]
    return out


def moved_settings() -> dict[tuple[str, str], str]:
    """(class, setting) -> its former name on ``GpuLabService``, which still sets it
    (``gpulab.service.moved_settings``)."""
    from gpulab.service.app import MOVED_SETTINGS
    from gpulab.service.moved_settings import RENAMED

    formerly = {(cls, name): name for name, cls in MOVED_SETTINGS.items()}
    formerly.update({place: old for old, place in RENAMED.items()})
    return formerly


def as_markdown(secs: list[Section] | None = None) -> str:
    """``docs/reference/config.md``."""
    secs = sections() if secs is None else secs
    moved = moved_settings()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from the traits; do not edit. Regenerate with:",
        f"     {REGENERATE} -->",
        "",
        "Every gpulab setting, for `<data-dir>/gpulab_config.py` (read by the hub and",
        "the gpulab service; on Kubernetes the chart's `/etc/gpulab/gpulab_config.py`).",
        "`gpulab up --help-all` prints the same. Settings that gpulab's classes inherit",
        "from JupyterHub, KubeSpawner or NativeAuthenticator are listed only where gpulab",
        "gives them a default of its own; the rest are in those projects' documentation.",
        "The last sections are settings of each user's JupyterLab server (jupyter_server's",
        "configuration); each says where they go.",
        "",
    ]
    lines += [f"- [`{s.name}`](#{s.name.lower()})" for s in secs] + [""]
    for s in secs:
        lines += [f"## {s.name}", ""]
        if s.missing:
            lines += [f"Not installed where this was generated ({s.missing}).", ""]
            continue
        cls = s.cls
        lines += [f"`{cls.__module__}.{cls.__name__}`", ""]
        if s.description:
            lines += [s.description, ""]
        if s.where():
            lines += [s.where(), ""]
        for t in s.settings:
            lines += [f"### `c.{s.name}.{t.name}`", ""]
            meta = (
                f"{t.kind}, default "
                + ("computed at start: " if t.computed else "")
                + f"`{t.default}`"
            )
            if t.choices:
                meta += f"; {t.choices}"
            if t.inherited_from:
                meta += f" (a {t.inherited_from} setting; gpulab sets its default)"
            if (s.name, t.name) in moved:
                old = moved[s.name, t.name]
                meta += f"; formerly `c.GpuLabService.{old}`, which still sets it"
            if t.defined_on:
                # Examples may name the base: both reach this class.
                meta += (
                    f"; defined on `{t.defined_on}`: `c.{t.defined_on}.{t.name}` sets it "
                    f"for every spawner built on it, `c.{s.name}.{t.name}` for this one"
                )
            lines += [meta, ""] + _markdown_help(_summary(t) if t.inherited_from else t.help)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--markdown"], ["--config"]):
        print(
            "usage: python -m gpulab.hub_ext.config_reference [--markdown | --config]\n"
            f"  {REGENERATE}",
            file=sys.stderr,
        )
        return 2
    secs = sections()
    sys.stdout.write(as_config_file(secs) if argv == ["--config"] else as_markdown(secs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
