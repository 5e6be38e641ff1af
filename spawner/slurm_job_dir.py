"""The folder of a server's Slurm job, in its user's home, made by the user's account.

``~/.gpulab/slurm/<server>`` holds the job's script, the server's environment (its
token among it), the port the server picked and Slurm's log. It lives in the home
because the nodes share it. The hub runs as root, and root making folders and files
in a home its user can change would follow a link the user planted there
(``~/.gpulab`` → ``/etc``: root would empty and chown a folder of ``/etc``). So the
folder and its files are made by the user's own account, in a process of its own
(``python -I -m gpulab.spawner.slurm_job_dir SERVER``), which reads what to write
from its stdin: the environment holds a token, which never goes on a command line.

What root reads back (the port, the log's last lines) is opened without following a
link and without waiting on a FIFO, used only if it is a plain file of the user's,
and capped.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

from gpulab.enforcement.accounts import Account, run_module_as

#: Under the home.
FOLDER = os.path.join(".gpulab", "slurm")


def path_in(home: str, server: str) -> str:
    return os.path.join(home, FOLDER, server)


def make(home: str, server: str, files: dict[str, tuple[str, int]]) -> None:
    """Empty the folder of an earlier start and write ``files`` (name: text, mode) in
    it. Run as the home's owner."""
    path = path_in(home, server)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, mode=0o700)
    os.chmod(path, 0o700)
    for name, (text, mode) in files.items():
        fd = os.open(
            os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
        )
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(os.path.join(path, name), mode)


def make_as(account: Account, server: str, files: dict[str, tuple[str, int]]) -> str:
    """:func:`make` as ``account``; the folder's path, or RuntimeError saying why not."""
    if not os.path.lexists(account.home):  # a site's account whose home was never made
        os.makedirs(account.home, mode=0o700)
        os.chown(account.home, account.uid, account.gid)
    problem = run_module_as(
        account, "gpulab.spawner.slurm_job_dir", server, stdin=json.dumps(files)
    )
    if problem:
        raise RuntimeError(
            f"{account.name} could not write its server's Slurm job folder "
            f"{path_in(account.home, server)}: {problem}"
        )
    return path_in(account.home, server)


def read_users_file(path: str, uid: int, limit: int, tail: bool = False) -> bytes | None:
    """At most ``limit`` bytes of a plain file of ``uid``'s (its last ones with
    ``tail``); None when there is none, or what is there is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return None
        start = max(0, st.st_size - limit) if tail else 0
        return os.pread(fd, limit, start)
    finally:
        os.close(fd)


if __name__ == "__main__":
    make(os.path.expanduser("~"), sys.argv[1], json.load(sys.stdin))
