"""A notebook job inside its rank: run the notebook, send back the executed notebook
and the files it wrote.

The job's cell (written by ``gpulab.lab.notebook_jobs.execution``) calls
:func:`run_in_rank` with what the user's server shipped as a job variable (the
notebook with its parameters injected, the files of its folder); the result is the
job's ``--out`` value. The kernel runs on the rank's slice (it
inherits ``CUDA_VISIBLE_DEVICES``), in a temporary folder of the rank's own where
the notebook's folder was unpacked. A failed cell still sends back the notebook (the
error is in its outputs, as in Jupyter) and then fails the job with the cell's
error, which becomes the job's message.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile

#: Files the kernel wrote, sent back; past these, a file is named in ``skipped``.
MAX_FILE_BYTES = 256 << 20
MAX_TOTAL_BYTES = 1 << 30
#: The executed notebook sent back: past it the largest cells' outputs are cut (a cell
#: printing for hours made gigabytes the user's server then read whole).
MAX_NOTEBOOK_BYTES = 256 << 20
#: The kernel's start on a loaded node can be slow; a cell has no limit of its own.
KERNEL_START_S = 300


class NotebookCellError(RuntimeError):
    """A cell of the notebook raised; the message names the cell and the error."""


def _kernel_name(wanted: str | None) -> str:
    """The notebook's kernel where the rank has it, else this Python's (``python3``):
    a server's own kernelspec (its magics, its account's paths) is not the rank's."""
    from jupyter_client.kernelspec import KernelSpecManager

    try:
        found = KernelSpecManager().find_kernel_specs()
    except Exception:  # noqa: BLE001 - no kernelspec folder: the native kernel
        found = {}
    return wanted if wanted and wanted in found else "python3"


def _snapshot(folder: str) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            st = os.stat(path)
            out[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return out


def _written(folder: str, before: dict, skip: str) -> tuple[dict[str, bytes], list[str]]:
    """Files new or changed since ``before`` (the input notebook aside)."""
    files, skipped, total = {}, [], 0
    for rel, stamp in sorted(_snapshot(folder).items()):
        if rel == skip or before.get(rel) == stamp:
            continue
        size = stamp[0]
        if size > MAX_FILE_BYTES or total + size > MAX_TOTAL_BYTES:
            skipped.append(rel)
            continue
        with open(os.path.join(folder, rel), "rb") as f:
            files[rel] = f.read()
        total += size
    return files, skipped


def _cell_error(nb, err) -> str:
    """``cell N: Type: message`` of the first cell with an error output."""
    for i, cell in enumerate(nb.cells, 1):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {i}: {out.get('ename')}: {out.get('evalue')}"
    return str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__


_SCRATCH = re.compile(r"gpulab-notebook-(\d+)@(.+)-\w+")


def _scratch_prefix() -> str:
    # Its rank's pid and host: a /tmp shared by several nodes holds others' ranks too.
    return f"gpulab-notebook-{os.getpid()}@{socket.gethostname()}-"


def sweep_leftovers(tmp: str | None = None) -> list[str]:
    """Remove this account's scratch folders of notebook ranks that are gone (a rank
    killed with SIGKILL, by a cancel or the OOM killer, runs no ``finally``); the
    folder's name carries its rank's pid. Returns what it removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        m = _SCRATCH.fullmatch(entry.name)
        try:
            if not m or m[2] != socket.gethostname() or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue  # another account's: not ours to judge
            os.kill(int(m[1]), 0)
            continue  # its rank still runs (or the pid is reused: keep it, to be safe)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        except OSError:
            continue
    return removed


def run_in_rank(job_input: dict) -> dict:
    """Run the notebook in ``job_input`` (``notebook``: its JSON text, ``filename``,
    ``files``: {relative path: bytes} of its folder) in a folder of the rank's own.

    Returns ``{"notebook": executed JSON text, "files": {path: bytes} written,
    "skipped": [paths too large], "error": None}``. On a failed cell it saves that
    (with ``error``) as the job's ``--out`` and raises :class:`NotebookCellError`.
    """
    # The job's folder is the service's (the rank writes only its logs, checkpoints
    # and out there): the notebook runs in a folder of the rank's own, and so do the
    # kernel's connection files and IPython's profile.
    sweep_leftovers()
    scratch = tempfile.mkdtemp(prefix=_scratch_prefix())
    try:
        result = _execute(scratch, job_input)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if result["error"] is None:
        return result
    # The runner keeps --out only when the cell succeeds: keep it first, then fail.
    from . import env
    from .runner import save_out

    out = env.get(env.OUT)
    if out:
        save_out(os.environ[env.JOB_DIR], out, {out: result}, env.rank())
    raise NotebookCellError(result["error"])


def _execute(scratch: str, job_input: dict) -> dict:
    """The notebook run in ``scratch``: what :func:`run_in_rank` returns."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    for var, sub in (
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
        ("MPLCONFIGDIR", "matplotlib"),
    ):
        os.environ.setdefault(var, os.path.join(scratch, sub))
    work = os.path.join(scratch, "notebook")
    os.makedirs(work)
    for rel, data in (job_input.get("files") or {}).items():
        path = os.path.abspath(os.path.join(work, rel))
        if not path.startswith(work + os.sep):
            continue  # a path that climbs out of the folder is not the notebook's
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    filename = os.path.basename(job_input.get("filename") or "notebook.ipynb")
    nb = nbformat.reads(job_input["notebook"], as_version=4)
    with open(os.path.join(work, filename), "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    before = _snapshot(work)
    kernel = _kernel_name(nb.metadata.get("kernelspec", {}).get("name"))
    client = NotebookClient(
        nb,
        kernel_name=kernel,
        startup_timeout=KERNEL_START_S,
        timeout=None,
        resources={"metadata": {"path": work}},
    )
    error = None
    try:
        client.execute()
    except CellExecutionError as e:
        error = _cell_error(nb, e)
    files, skipped = _written(work, before, filename)
    text, cut = within_limit(nb, MAX_NOTEBOOK_BYTES)
    if cut:
        skipped.append(f"the outputs of {cut} cell{'s' if cut > 1 else ''} of {filename}")
    return {
        "notebook": text,
        "files": files,
        "skipped": skipped,
        "error": error,
    }


def within_limit(nb, limit: int) -> tuple[str, int]:
    """The notebook as text within ``limit`` bytes (the largest cells' outputs replaced
    by a line that says so), and how many cells' outputs were cut."""
    import json

    import nbformat

    text = nbformat.writes(nb)
    if len(text.encode()) <= limit:
        return text, 0
    cells = [c for c in nb.cells if c.get("outputs")]
    cells.sort(key=lambda c: len(json.dumps(c.outputs)), reverse=True)
    cut = 0
    for cell in cells:
        mib = len(json.dumps(cell.outputs)) / 2**20
        cell.outputs = [
            nbformat.v4.new_output(
                "stream", name="stderr", text=f"[gpulab] output cut: {mib:.0f} MiB, too large\n"
            )
        ]
        cut += 1
        text = nbformat.writes(nb)  # the largest first: a few cuts at most, as a rule
        if len(text.encode()) <= limit:
            break
    return text, cut
