"""A server's TLS certificate (``internal_ssl``) handed to the account it runs as.

JupyterHub writes each server's key and certificate into its own internal folder,
which only the hub's account reads; a server started as the user's account cannot
open them there. JupyterHub's ``LocalProcessSpawner`` moves them into the user's
home, a folder the user controls: as root, writing and chowning there follows
whatever links the user left in the way. Here they go to a folder of the hub's
(``<data-dir>/tls/servers/<user>/<server>``, root's, 0711), each file created
afresh (``O_EXCL | O_NOFOLLOW``) and given to the account by its descriptor, mode
0400: the account reads its own key, nobody else's account can.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpulab.enforcement.accounts import Account


def _write_for(path: Path, data: bytes, account: Account) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    try:
        os.fchown(fd, account.uid, account.gid)
        os.write(fd, data)
    finally:
        os.close(fd)


def hand_over(paths: dict, account: Account, folder: Path) -> dict:
    """Copies of ``paths`` (``keyfile``, ``certfile``, ``cafile``) in ``folder``, the
    account's to read; the same keys, the new paths."""
    folder.mkdir(parents=True, exist_ok=True)
    # The hub's umask (077) took the traversal bit off the folders just made.
    for level in (folder.parent.parent, folder.parent, folder):
        os.chmod(level, 0o711)
    moved = {}
    for key, source in paths.items():
        target = folder / os.path.basename(source)
        target.unlink(missing_ok=True)  # the folder is the hub's: nobody else put it there
        _write_for(target, Path(source).read_bytes(), account)
        moved[key] = str(target)
    return moved
