"""The folder of the vector engine's socket, and the one a killed service left.

A Unix socket's path has at most 107 bytes and a data dir's may be longer, so the
socket lives in a folder of its own in the temporary folder
(``/tmp/gpulab-vectors-<random>``, mode 0700). A service that stops removes it; one
killed (``kill -9``, the OOM killer) cannot, so the data dir names it
(``<data-dir>/vector-engine.socket-dir``) and the next service on that data dir
removes it before it makes its own. The folder is made when the engine first starts, not
when the service is built: a service built and never started leaves nothing in /tmp.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path

PREFIX = "gpulab-vectors-"
#: In the data dir: the path of the socket's folder of the service that runs now.
NAMED_IN = "vector-engine.socket-dir"


def choose(data_dir: str) -> str:
    """The path of a new socket folder (made later by :func:`make`); the one a killed
    service named in ``data_dir`` is removed now."""
    remove_left(data_dir)
    return os.path.join(tempfile.gettempdir(), PREFIX + secrets.token_hex(8))


def make(data_dir: str, path: str) -> None:
    """Make the folder chosen (mode 0700) and name it in ``data_dir``. Its name is
    random and told to no one before: one that exists was not made for us."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        raise RuntimeError(
            f"the vector engine's socket folder {path} exists already: it was not made by "
            "this service; remove it (or restart the service, which picks another name)"
        ) from None
    Path(data_dir, NAMED_IN).write_text(path)


def remove(data_dir: str, path: str) -> None:
    """The service's own folder, at its stop."""
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(data_dir, NAMED_IN))


def remove_left(data_dir: str) -> None:
    """Remove the folder named in ``data_dir`` when it is one of ours: a real folder of
    that prefix right in the temporary folder (the name file is the service's own, but
    nothing else is removed on its word)."""
    named = Path(data_dir, NAMED_IN)
    try:
        path = Path(named.read_text().strip())
    except OSError:
        return
    ours = (
        path.is_absolute()
        and path.parent == Path(tempfile.gettempdir())
        and path.name.startswith(PREFIX)
        and not path.is_symlink()
        and path.is_dir()
    )
    if ours:
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        named.unlink()
