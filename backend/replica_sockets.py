"""Where local replicas listen: Unix sockets in a folder only the service's account enters.

A TCP port on 127.0.0.1 is open to every account of the host (to probe the replica,
fill its connection slots, guess at its secret); a Unix socket is reached through the
file system, so its folder's permissions decide who may connect. The service binds
each replica's socket itself and hands the bound socket to the replica (``--listen-fd``,
socket activation as systemd does it), which starts listening once its model is
loaded: until then a connection is refused, as a port nobody listens on is. So the
socket's path lives in a folder of the service's own (root's with per-user
accounts), mode 0700, that the replica's account cannot change either: nobody can
swap the socket for a link that would send the service's calls elsewhere::

    <base>/serving-<tag>/<unit id>-r<N>.sock

``base`` is /run/gpulab for root, else ``gpulab-<uid>`` in ``$XDG_RUNTIME_DIR`` or
the temporary folder; ``tag`` names the deployments folder, so two services on one
host keep apart. It is short whatever the data dir: a socket path holds at most
107 bytes.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import socket
import stat
import tempfile

#: Unix socket paths are at most 108 bytes, the final NUL included.
SOCKET_PATH_MAX = 107
#: Where root keeps them (a tmpfs: gone at reboot, with the replicas).
ROOT_BASE = "/run/gpulab"
#: The longest name a unit and replica number may take in a path (ids are 12 hex digits).
LONGEST_NAME = f"{'f' * 24}-r9999.sock"


def base_folder() -> str:
    if os.geteuid() == 0:
        return ROOT_BASE
    parent = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(parent, f"gpulab-{os.geteuid()}")


class ReplicaSockets:
    """The socket paths of the replicas of every deployment under ``deployments_root``."""

    def __init__(self, deployments_root: str, base: str | None = None):
        tag = hashlib.sha256(os.path.realpath(deployments_root).encode()).hexdigest()[:10]
        self.base = base or base_folder()
        self.folder = os.path.join(self.base, f"serving-{tag}")
        longest = os.path.join(self.folder, LONGEST_NAME)
        if len(longest.encode()) > SOCKET_PATH_MAX:
            raise ValueError(
                f"replicas' sockets under {self.base} would not fit a Unix socket path "
                f"({len(longest.encode())} > {SOCKET_PATH_MAX} bytes); set TMPDIR (or "
                f"XDG_RUNTIME_DIR) to a shorter folder, e.g. /tmp"
            )

    def path(self, unit_id: str, replica: int) -> str:
        return os.path.join(self.folder, f"{unit_id}-r{replica}.sock")

    def bind(self, unit_id: str, replica: int) -> socket.socket:
        """A new socket bound to the replica's path, not yet listening: the replica
        listens on it once it serves (connections before that are refused)."""
        self._prepare()
        path = self.path(unit_id, replica)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the socket of an earlier process of this replica
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
        except OSError:
            sock.close()
            raise
        return sock

    def unlink(self, unit_id: str, replica: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(unit_id, replica))

    def remove(self, unit_id: str) -> None:
        """Every socket file of one unit (its replicas are gone)."""
        for path in glob.glob(os.path.join(glob.escape(self.folder), f"{unit_id}-r*.sock")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):  # the last one: leave no empty folder behind
            os.rmdir(self.folder)

    def _prepare(self) -> None:
        if self.base == ROOT_BASE and os.geteuid() == 0:
            os.makedirs(ROOT_BASE, mode=0o755, exist_ok=True)
        else:
            private_folder(self.base)
        private_folder(self.folder)


def private_folder(path: str) -> None:
    """Make ``path`` a folder of this account's alone, or refuse one that is not (in
    a shared temporary folder anyone could have made it first)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a folder of this account's alone (mode 0700): remove it, "
            f"the gpulab service makes it again"
        )
