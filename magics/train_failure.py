"""A failed ``%%train_distributed`` job, told in a few lines: the root cause once.

The job's ``error`` (``{"rank", "type", "message", "traceback"}``, chosen by the
service) names the rank and its exception; the rank's traceback runs through
torchrun and gpulab's runner before it reaches the user's code. Here we keep the
user's own frames (the cell's lines, their own modules), add a hint for the
common mistakes (a notebook name not sent with ``--vars``, a package missing
where the ranks run, a slice out of GPU memory) and say where the full logs are.

:class:`TrainingJobFailed` renders as those lines (IPython honours
``_render_traceback_``), not as a traceback through this package.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import types

from gpulab.client.units import gpu_label

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.*)$')
_NAME = re.compile(r"name '(?P<name>[A-Za-z_][A-Za-z0-9_]*)' is not defined")
_MODULE = re.compile(r"No module named '(?P<module>[^']+)'")
#: The file the ranks run the cell from (``<job dir>/cell.py``).
CELL_FILE = "cell.py"
#: The line of the cell ``%train_distributed SCRIPT.py`` ships that runs the script:
#: gpulab's, not the user's (:mod:`.train_script`).
SCRIPT_CALL = "globals().update(_gpulab_run_script("
#: Lines of the rank's stderr a failure shows (argparse's usage and its error).
STDERR_LINES = 6
RED, BOLD, RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


def _internal_roots() -> tuple[str, ...]:
    """Where Python, installed packages and gpulab's rank code live: not the user's."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for room in ("gpulab.training", "gpulab.serving"):
        try:
            spec = importlib.util.find_spec(room)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots.add(os.path.join(location, ""))
    return tuple(r for r in roots if r)


def user_frames(traceback: str) -> list[tuple[str, int, str, str]]:
    """``(file, line, function, source)`` of the frames in ``traceback`` that are the
    user's: the cell and files outside Python, site-packages and gpulab.

    Chained exceptions ("During handling...") are read from the last one only.
    """
    last = traceback.rsplit("Traceback (most recent call last):", 1)[-1]
    lines = last.splitlines()
    internal = _internal_roots()
    frames = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        path = m.group("file")
        source = (
            lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith("    ") else ""
        )
        if os.path.basename(path) == CELL_FILE:
            if source.startswith(SCRIPT_CALL):
                continue
            frames.append(("cell", int(m.group("line")), m.group("func"), source))
        elif not (
            path.startswith("<")
            or "site-packages" in path
            or "dist-packages" in path
            or path.startswith(internal)
        ):
            frames.append((path, int(m.group("line")), m.group("func"), source))
    return frames


def names_hint(names: list[str], sent_vars: list[str], namespace: dict) -> str | None:
    """What to do about cell names that only the notebook defines: import a module
    in the cell, send a value with ``--vars``; None for names the notebook lacks too."""
    modules = [
        n for n in names if n not in sent_vars and isinstance(namespace.get(n), types.ModuleType)
    ]
    if modules:
        imports = []
        for name in modules:
            module = namespace[name].__name__
            imports.append(f"import {module}" + (f" as {name}" if name != module else ""))
        said = _listed(modules)
        return (
            f"{said} {'is' if len(modules) == 1 else 'are'} imported in this notebook, "
            f"not in the cell: add `{'; '.join(imports)}` to the cell"
        )
    unsent = [n for n in names if n in namespace and n not in sent_vars]
    if unsent:
        flag = ",".join([*sent_vars, *unsent])
        return (
            f"{_listed(unsent)} {'is' if len(unsent) == 1 else 'are'} defined in this "
            f"notebook but {'was' if len(unsent) == 1 else 'were'} not sent to the job: "
            f"add `--vars {flag}`"
        )
    return None


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def hint(error: dict, sent_vars: list[str], namespace: dict, gpu_milli: int = 0) -> str | None:
    """One sentence for a mistake we recognise in the rank's error, else None."""
    kind, message = error.get("type") or "", error.get("message") or ""
    if kind == "NameError" and (m := _NAME.search(message)):
        return names_hint([m.group("name")], sent_vars, namespace)
    if kind == "ModuleNotFoundError" and (m := _MODULE.search(message)):
        top = m.group("module").split(".")[0]
        beside = _local_module(top)
        if beside:
            return (
                f"`{top}` is {beside} in this notebook's folder, not an installed package: "
                f"run the script with `%train_distributed [flags] SCRIPT.py` (its folder and "
                f"the notebook's are on the ranks' path), or import it from a script there"
            )
        here = importlib.util.find_spec(top) is not None
        return (
            f"the ranks cannot import `{top}`: it is "
            + ("installed in this notebook's environment but " if here else "")
            + "not installed where the job runs; ask your admin to add it to the job "
            "environment (or pick an --image that has it)"
        )
    if kind == "OutOfMemoryError" or "CUDA out of memory" in message:
        size = f" of {gpu_label(gpu_milli)}" if gpu_milli else ""
        return (
            f"the rank ran out of GPU memory: its slice{size} is a memory limit; use a "
            f"smaller batch, --amp bf16, or ask for more with --gpu"
        )
    return None


def _local_module(name: str, folder: str | None = None) -> str | None:
    """``name.py`` or ``name/`` when the notebook's folder holds that module, else None."""
    folder = folder or os.getcwd()
    if os.path.isfile(os.path.join(folder, f"{name}.py")):
        return f"{name}.py"
    if os.path.isdir(os.path.join(folder, name)):
        return f"the folder {name}/"
    return None


def logs_hint(job_id: str) -> str:
    return f"full logs: print(Client().job_logs({job_id!r}))  (from gpulab.client import Client)"


def failure_lines(job: dict, hint_text: str | None) -> list[str]:
    """The few lines a failed (or cancelled) job shows: what, where, why, and the logs."""
    error = job.get("error") or {}
    lines = []
    if error.get("type"):
        head = (
            f"TrainingJobFailed: job {job['id']} {job['state']}: rank {error.get('rank')} "
            f"raised {error['type']}: {error.get('message')}"
        )
        lines.append(f"{RED}{BOLD}{head}{RESET}")
        frames = user_frames(error.get("traceback") or "")
        for path, line, func, source in frames[-6:]:
            # The ranks run the cell without its %%train_distributed line: +1 is
            # the line as the notebook numbers it.
            where = (
                f"cell, line {line + 1}" if path == "cell" else f"{path}, line {line}, in {func}"
            )
            lines.append(f"  {where}")
            if source:
                lines.append(f"    {source}")
        # What the rank said before it exited (argparse's usage and error, a script's
        # own message before sys.exit(1)): an exit code alone says nothing.
        said = [ln for ln in (error.get("stderr") or "").splitlines() if ln.strip()]
        if said and (error["type"] == "SystemExit" or not error.get("message")):
            lines.append(f"rank {error.get('rank')} wrote to stderr:")
            lines += [f"  {ln}" for ln in said[-STDERR_LINES:]]
    else:
        head = f"TrainingJobFailed: job {job['id']} {job['state']}: {job.get('message')}"
        lines.append(f"{RED}{BOLD}{head}{RESET}")
    if hint_text:
        lines.append(f"hint: {hint_text}")
    lines.append(logs_hint(job["id"]))
    return lines


class TrainingJobFailed(RuntimeError):
    """The job failed; the message names the rank and its root cause.

    IPython shows :meth:`_render_traceback_` instead of a traceback through
    gpulab's magics: the cause, the user's frames, a hint, where the logs are.
    """

    def __init__(self, job: dict, lines: list[str]):
        self.job = job
        self.lines = lines
        super().__init__(re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(lines)))

    def _render_traceback_(self) -> list[str]:
        return list(self.lines)
