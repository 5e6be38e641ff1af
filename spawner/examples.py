"""The example notebooks in every new user's home: a copy to edit, the originals to read.

On a user's first start, ``~/examples/`` gets a copy of each example notebook
(theirs to change) and ``~/examples/originals``, a link to the copies gpulab
installed (``<prefix>/share/gpulab/examples``, or a checkout's ``notebooks/``; owned
by root, read-only to users): a user who breaks their copy opens the original
again. Once given, they are not given again (``~/.gpulab/examples-given``), so a
user who deletes or renames them keeps it that way.

The copying runs as the user's own account, in a process of its own
(``python -I -m gpulab.spawner.examples SOURCE HOME``): their home is theirs, and a
link they planted there cannot make the hub's root account write elsewhere.
"""

from __future__ import annotations

import os
import shutil
import sys

from gpulab.enforcement.accounts import run_module_as

#: What a user's home gets, relative to it.
FOLDER = "examples"
ORIGINALS = "originals"
MARKER = os.path.join(".gpulab", "examples-given")


def shipped_examples() -> str:
    """Where a wheel's install put the example notebooks (``pyproject.toml``'s data
    files); an editable install (``make up``) writes no data files: its checkout's own."""
    installed = os.path.join(sys.prefix, "share", "gpulab", "examples")
    if os.path.isdir(installed):
        return installed
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


def give_examples(source: str, home: str) -> None:
    """Copy ``source``'s notebooks into ``home/examples`` (run as the home's owner),
    unless they were given before."""
    marker = os.path.join(home, MARKER)
    if os.path.exists(marker) or not os.path.isdir(source):
        return
    folder = os.path.join(home, FOLDER)
    os.makedirs(folder, exist_ok=True)
    for name in sorted(os.listdir(source)):
        target = os.path.join(folder, name)
        if name.endswith(".ipynb") and not os.path.lexists(target):
            shutil.copyfile(os.path.join(source, name), target)
            os.chmod(target, 0o644)
    link = os.path.join(folder, ORIGINALS)
    if not os.path.lexists(link):
        os.symlink(source, link)
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w") as f:
        f.write(f"{source}\n")


def give_examples_as(account, source: str) -> str | None:
    """:func:`give_examples` as ``account``; None on success, else why not (the
    server starts anyway: a missing example is not worth refusing a server for)."""
    return run_module_as(account, "gpulab.spawner.examples", source, account.home)


if __name__ == "__main__":
    give_examples(sys.argv[1], sys.argv[2])
