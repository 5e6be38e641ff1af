"""Run an existing script in a rank as ``torchrun SCRIPT.py ARGS...`` would.

``%train_distributed [flags] SCRIPT.py [ARGS...]`` ships a two-line cell that
calls :func:`run_script`; the rank (already the job owner's account) then sets up
what a script run by hand expects, and nothing of gpulab's job folder shows:

- ``sys.argv`` is ``[SCRIPT.py, *ARGS]`` (argparse works);
- ``sys.path[0]`` is the script's folder (a helper module beside it imports), then
  ``PYTHONPATH``: the notebook's folder and the job's ``--env PYTHONPATH=...``
  (also in ``os.environ``, for the processes the script starts);
- the working folder is one the user owns: the notebook's folder when the rank may
  write there, else a folder for this job in the user's home. The rank's first log
  line says which.

The script's globals come back, so ``--out NAME`` returns a variable it defined.
"""

from __future__ import annotations

import os
import runpy
import sys

from . import env

#: The per-job working folders when the notebook's folder is not the user's to write.
JOBS_FOLDER = "gpulab-jobs"


def working_folder(notebook_dir: str, job_id: str) -> tuple[str, str]:
    """``(folder, why)``: the notebook's folder if this account may write there,
    else ``~/gpulab-jobs/<job id>`` (made)."""
    if notebook_dir and os.path.isdir(notebook_dir) and os.access(notebook_dir, os.W_OK | os.X_OK):
        return notebook_dir, "the notebook's folder"
    folder = os.path.join(os.path.expanduser("~"), JOBS_FOLDER, job_id or "job")
    os.makedirs(folder, exist_ok=True)
    why = "a folder for this job in your home"
    if notebook_dir:
        why += f"; the notebook's folder {notebook_dir} is not writable here"
    return folder, why


def search_path(script: str, pythonpath: list[str]) -> list[str]:
    """``sys.path`` as ``python SCRIPT.py`` builds it: the script's folder, then
    ``PYTHONPATH``, then the interpreter's own (the runner's folder left out)."""
    ours = {os.getcwd(), ""}
    rest = [p for p in sys.path[1:] if p not in ours] if sys.path else []
    extra = [p for p in pythonpath if p and p not in rest]
    return [os.path.dirname(os.path.abspath(script)), *extra, *rest]


def run_script(
    script: str, args: list[str], notebook_dir: str = "", pythonpath: list[str] | None = None
) -> dict:
    """Run ``script`` as ``__main__`` with ``args``; its globals."""
    pythonpath = [os.path.join(notebook_dir, p) for p in (pythonpath or [])]
    folder, why = working_folder(notebook_dir, env.get(env.JOB_ID))
    print(f"gpulab: running {script} in {folder} ({why})", flush=True)
    os.chdir(folder)
    sys.path[:] = search_path(script, pythonpath)
    joined = os.pathsep.join(p for p in pythonpath if p)
    if joined:
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = joined + (os.pathsep + before if before else "")
    sys.argv[:] = [script, *args]
    return runpy.run_path(script, run_name="__main__")
