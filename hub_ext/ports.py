"""Free ports for the hub's own processes, picked below the kernel's ephemeral range.

A port found by binding port 0 comes from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the range every outgoing connection and
every other bind to port 0 on the machine draws from. ``gpulab up`` picks the hub's,
the proxy API's and the service's ports before JupyterHub starts, and the service binds
its port seconds later: on a busy machine a connection or a training rank took it
meanwhile and the service failed with "Address already in use" (at every restart, as
the ports are kept). A port below that range is taken only by a program that asks for
it by number, and one that is bound already is skipped.
"""

from __future__ import annotations

import random
import socket

#: How far below the ephemeral range ports are picked.
SPAN = 10_000
#: Where the ephemeral range starts when the kernel does not say (Linux's default).
EPHEMERAL_LOW = 32768


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port on ``host`` that nothing holds now, below the ephemeral range when one
    there is free (else one the kernel picks)."""
    low = _ephemeral_low()
    first = max(1024, low - SPAN)
    if low > first:
        for port in random.sample(range(first, low), min(tries, low - first)):
            if _bindable(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
