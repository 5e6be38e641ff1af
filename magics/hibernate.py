"""Hibernation inside the user's kernel: save this kernel's variables, bring them back.

The server's gpulab extension (:mod:`gpulab.lab.hibernate`) asks each kernel to run
:func:`save_kernel` when the service hibernates the server; the state goes to the
user's own files, as the user, and is read only by the user's own kernels
(:mod:`.namespace_state` says how). When the server starts again, a kernel started
for a notebook that was hibernated restores it as gpulab's magics load
(:func:`restore_on_start`) and prints one line on the notebook's first cell: what
came back, what did not and why, and how long it took.

``%gpulab hibernate`` asks the service to hibernate this server; ``%gpulab wake``
restores by hand (``--list`` lists the hibernated kernels, ``NAME`` picks one;
none: the most recent not yet restored).
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from dataclasses import dataclass

from gpulab.client.hibernations import state_folder

_LAST: dict[str, str] = {}
#: The names an earlier hibernation of this kernel's notebook held that did not come
#: back, and why: a later hibernation counts them (still not back) unless the user
#: made them again, so each wake line counts against what the user had at first.
_NOT_BACK: dict[str, str] = {}


# -- saving (run by the server extension in each kernel) --------------------------------
def save_kernel(path: str, cap: int) -> None:
    """Save this kernel's user variables to ``path``; the report for :func:`last_save`.
    Raises (StateTooLarge, OSError) so the hibernation fails and the server runs on."""
    from IPython import get_ipython

    from .namespace_state import save_namespace, user_variables

    variables = user_variables(get_ipython())
    still_gone = [(n, why) for n, why in _NOT_BACK.items() if n not in variables]
    report = save_namespace(variables, path, max_bytes=cap, not_back=still_gone)
    total = len(variables) + len(still_gone)
    _LAST["save"] = json.dumps({**report.to_json(), "variables": total})


def last_save() -> str:
    """The report of the last :func:`save_kernel`, as JSON text (read once)."""
    return _LAST.pop("save")


# -- what was saved -------------------------------------------------------------------------
@dataclass
class SavedKernel:
    hibernation: str  # its id
    created: str  # ISO 8601 UTC
    name: str  # the notebook's path in the server, or "kernel-<id>"
    notebook: str  # $JPY_SESSION_NAME of the kernel that saved it
    path: str  # the state file
    variables: int
    bytes: int

    @property
    def woken(self) -> bool:
        return os.path.exists(self.path + ".woken")

    @property
    def when(self) -> str:
        return self.created[11:16] + " UTC"


def saved_kernels(folder: str | None = None) -> list[SavedKernel]:
    """Every kernel of every hibernation kept, newest first."""
    base = folder or state_folder()
    out = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for hid in names:
        try:
            with open(os.path.join(base, hid, "manifest.json")) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            continue
        for k in manifest.get("kernels") or []:
            out.append(
                SavedKernel(
                    hibernation=manifest.get("id", hid),
                    created=manifest.get("created", ""),
                    name=k.get("name", ""),
                    notebook=k.get("notebook", ""),
                    path=os.path.join(base, hid, k.get("file", "")),
                    variables=int(k.get("variables") or 0),
                    bytes=int(k.get("bytes") or 0),
                )
            )
    out.sort(key=lambda k: (k.created, k.hibernation), reverse=True)
    return out


# -- waking --------------------------------------------------------------------------------
def wake(shell, kernel: SavedKernel) -> str:
    """Restore ``kernel``'s variables into ``shell``; its one line. Tells the service
    (best effort: the variables are back either way)."""
    from .namespace_state import load_namespace

    report = load_namespace(kernel.path, shell.user_ns)
    keep_visible(shell, report.restored)
    _NOT_BACK.clear()
    _NOT_BACK.update(report.failed)
    fd = os.open(kernel.path + ".woken", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({**report.to_json(), "at": time.time()}, f)
    wake_json = report.to_json()
    said = {k: wake_json[k] for k in ("restored", "failed", "seconds", "device")}
    tell_service(kernel.hibernation, {"name": kernel.name, **said})
    return f"Woken from hibernation ({kernel.when}): {report.line(kernel.name)}"


def keep_visible(shell, names: list[str]) -> None:
    """Make restored variables ordinary user variables.

    A kernel restores as gpulab's magics load, and IPython then hides every name the
    namespace holds at that moment (``hide_initial_ns``: ``user_ns_hidden``), so
    ``%who`` would not list them and the next hibernation would not save them. They
    are taken out of the hidden names now and again before the next execution of
    any kind (a cell, or the silent one a hibernation runs)."""
    values = {n: shell.user_ns[n] for n in names if n in shell.user_ns}

    def unhide(*_):
        hidden = shell.user_ns_hidden
        for name, value in values.items():
            if name in hidden and hidden[name] is value:
                del hidden[name]

    def once(*_):
        shell.events.unregister("pre_execute", once)
        unhide()

    unhide()
    shell.events.register("pre_execute", once)


def tell_service(hibernation_id: str, report: dict) -> threading.Thread | None:
    """Report a wake to the service in the background: a kernel starting must not wait
    for it (the service may be restarting); outside gpulab there is no one to tell."""
    if not os.environ.get("GPULAB_API_URL"):
        return None

    def send():
        try:
            from gpulab.client import Client

            Client(timeout=10).report_wake(hibernation_id, report)
        except Exception:  # the variables are back either way
            pass

    thread = threading.Thread(target=send, name="gpulab-wake-report", daemon=True)
    thread.start()
    return thread


def restore_on_start(shell, env: dict[str, str] | None = None) -> str | None:
    """In a kernel just started for a notebook that was hibernated and not restored
    yet: restore it now, and print its line on the first cell run. The line, or None."""
    env = os.environ if env is None else env
    notebook = env.get("JPY_SESSION_NAME")
    if not notebook:
        return None
    try:
        pending = [k for k in saved_kernels() if k.notebook == notebook and not k.woken]
        if not pending:
            return None
        line = wake(shell, pending[0])
    except Exception as e:  # a kernel must start whatever the state holds
        line = f"Could not wake this notebook's hibernated variables: {type(e).__name__}: {e}"
    say_once(shell, line)
    return line


def say_once(shell, line: str) -> None:
    """Print ``line`` at the start of the next cell the user runs."""

    def show(*_):
        shell.events.unregister("pre_run_cell", show)
        print(line)

    shell.events.register("pre_run_cell", show)


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def status_row(env: dict[str, str]):
    """``%gpulab``'s line about this server's last hibernation (None: never, or not
    a server gpulab started)."""
    if not env.get("GPULAB_API_URL"):
        return None
    from gpulab.client import Client

    from .alerts import STATUS_TIMEOUT_S
    from .rich import Row

    try:
        rows = Client(timeout=STATUS_TIMEOUT_S).hibernations(
            server=env.get("JUPYTERHUB_SERVER_NAME", "")
        )
    except Exception:  # the pools' line already says when the service does not answer
        return None
    if not rows:
        return None
    return Row.of("Hibernation", status_words(rows[0], saved_kernels()))


def status_words(row: dict, kernels: list[SavedKernel]) -> str:
    """The server's latest hibernation as ``%gpulab`` says it. The kernel asking runs
    in this server, so a row still ``hibernated`` (a notebook has not woken, or a
    wake was not reported) means the server started again: said so, with what still
    waits in this user's files."""
    if row["state"] != "hibernated":
        return row["summary"]
    when = f"{row['finished'][11:16]} UTC" if row.get("finished") else "earlier"
    waiting = [k.name for k in kernels if k.hibernation == row["id"] and not k.woken]
    if not waiting:
        return f"hibernated at {when}, running again: every notebook's variables are back"
    shown = ", ".join(waiting[:3]) + (f" and {len(waiting) - 3} more" if len(waiting) > 3 else "")
    return (
        f"hibernated at {when}, running again; not woken yet: {shown} "
        "(open it, or %gpulab wake NAME)"
    )


# -- the magic's verbs -----------------------------------------------------------------------
WAKE_USAGE = "usage: %gpulab wake [--list | NAME]"


def hibernate_command(rest: str) -> None:
    """``%gpulab hibernate``: ask the service to hibernate this server."""
    if rest.strip():
        print("usage: %gpulab hibernate  (this server; no arguments)")
        return
    from gpulab.client import Client
    from gpulab.client.errors import GpuLabError

    try:
        row = Client().hibernate(server=os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
    except GpuLabError as e:
        print(f"Could not hibernate: {e}")
        return
    print(
        f"Hibernating this server ({row['id']}): each kernel saves its variables to "
        "~/.gpulab/hibernate, then the server stops and gives its GPU back. "
        "Start it again to wake them."
    )


def wake_command(shell, rest: str) -> None:
    """``%gpulab wake [--list | NAME]``."""
    try:
        args = shlex.split(rest)
    except ValueError:
        args = [rest]
    kernels = saved_kernels()
    if args == ["--list"]:
        if not kernels:
            print("No hibernated kernels in ~/.gpulab/hibernate.")
            return
        from gpulab.training.sizes import size_words

        rows = [
            [
                k.name,
                k.created.replace("T", " ").rstrip("Z") + " UTC",
                str(k.variables),
                size_words(k.bytes),
                "restored" if k.woken else "waiting",
            ]
            for k in kernels
        ]
        print(text_table(["NAME", "HIBERNATED", "VARIABLES", "SIZE", "STATE"], rows))
        return
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(WAKE_USAGE)
        return
    if args:
        name = args[0]
        chosen = [k for k in kernels if name in (k.name, os.path.basename(k.name))]
        if not chosen:
            names = ", ".join(sorted({k.name for k in kernels})) or "none"
            print(f"No hibernated kernel named {name!r}; there are: {names}. {WAKE_USAGE}")
            return
    else:
        chosen = [k for k in kernels if not k.woken]
        if not chosen:
            print("Nothing to wake: every hibernated kernel was restored (%gpulab wake --list).")
            return
    print(wake(shell, chosen[0]))
