"""Which Unix account holds the other end of a TCP connection on this machine.

The hub's proxy and every user's kernel reach the hub and the service from the
same loopback address, so an address alone cannot say whether a request came
through the proxy (whose ``X-Forwarded-For`` is worth believing) or straight
from a user's kernel (whose header is whatever the user wrote). The kernel
knows: ``/proc/net/tcp`` (and ``tcp6``) lists every socket of this network
namespace with the uid that made it. A connection counts as the platform's own
when the socket at its other end is open (established, held by a process) and
was made by the account this process runs as: the proxy runs as the hub's
account, users' kernels as their own (``gpulab-<name>``, with root).

Without per-user accounts everything runs as one account, and this cannot tell
a kernel from the proxy; gpulab says so at start (single-account mode).

:func:`client_source` answers who a request came from with it: the service's audit
trail and the hub's login throttle (:mod:`gpulab.hub_ext.login_limits`) both ask.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Iterable
from urllib.parse import urlsplit

#: Proxies trusted to append the client's address to X-Forwarded-For by default:
#: this machine (configurable-http-proxy in the embedded hub). A loopback peer is
#: believed only when its socket is the platform's own account's (a user's kernel
#: is on loopback too): see :func:`client_source`.
LOOPBACK = ("127.0.0.0/8", "::1/128")
#: ``st`` of an established connection in /proc/net/tcp.
_ESTABLISHED = "01"
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _address(text: str):
    """``0100007F:1F90`` (or 32 hex digits for IPv6) -> (ip_address, port)."""
    host, _, port = text.partition(":")
    if len(host) == 8:
        packed = struct.pack("<I", int(host, 16))
        ip = ipaddress.ip_address(socket.inet_ntop(socket.AF_INET, packed))
    else:
        words = [int(host[i : i + 8], 16) for i in range(0, 32, 8)]
        ip = ipaddress.ip_address(socket.inet_ntop(socket.AF_INET6, struct.pack("<4I", *words)))
    return _plain(ip), int(port, 16)


def _plain(ip):
    """An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the IPv4 address it is."""
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def peer_uid(peer: tuple[str, int], local: tuple[str, int], tables=_TABLES) -> int | None:
    """The uid of the open socket at ``peer`` connected to ``local`` (both
    ``(address, port)`` as this end sees them), or None when no such socket is
    open here (another machine, another namespace, or already closed)."""
    want = ((_plain(ipaddress.ip_address(peer[0])), peer[1]),)
    want += ((_plain(ipaddress.ip_address(local[0])), local[1]),)
    for table in tables:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    if f":{peer[1]:04X} " not in line or f":{local[1]:04X} " not in line:
                        continue  # most lines: parse only those with both ports
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != _ESTABLISHED or fields[9] == "0":
                        continue  # closing sockets keep no owner (inode 0, uid 0)
                    if (_address(fields[1]), _address(fields[2])) == want:
                        return int(fields[7])
        except (OSError, ValueError):
            continue
    return None


#: ``st`` of a listening socket in /proc/net/tcp.
_LISTEN = "0A"


def listener_uid(port: int, tables=_TABLES) -> int | None:
    """The uid of the socket listening on ``port`` of this machine's loopback (or of
    every address), or None when nothing listens there."""
    hexport = f":{port:04X} "
    for table in tables:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    if hexport not in line:
                        continue
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != _LISTEN:
                        continue
                    ip, at = _address(fields[1])
                    if at == port and (ip.is_loopback or ip.is_unspecified):
                        return int(fields[7])
        except (OSError, ValueError):
            continue
    return None


def foreign_listener(url: str, also: tuple[int, ...] = ()) -> str | None:
    """Why a platform token must not go to ``url``: its port on this machine is
    listened on by another account than this process's (a user's kernel that took the
    port while the hub or the service was down); None when it may (not this machine,
    or the platform's own socket, or nothing to tell). ``also``: other uids that may
    listen (the node agent, run as any account, trusts root's service)."""
    parts = urlsplit(url)
    try:
        ip = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        ip = None
    if parts.hostname != "localhost" and (ip is None or not _plain(ip).is_loopback):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    uid = listener_uid(port)
    if uid is None or uid == os.geteuid() or uid in also:
        return None
    return (
        f"port {port} of this machine is held by uid {uid}, not by gpulab's own account "
        f"(uid {os.geteuid()}): no token is sent there (another account took the port "
        f"while the hub or the service was down?)"
    )


async def refuse_foreign_listener(url: str, what: str) -> None:
    """Raise ConnectionRefusedError (``what``: the reason) before a platform token goes
    to ``url`` when :func:`foreign_listener` objects; the socket table is read in a
    thread (milliseconds on a busy host)."""
    foreign = await asyncio.to_thread(foreign_listener, url)
    if foreign:
        logging.getLogger("gpulab.peer_account").warning("Not calling %s: %s", what, foreign)
        raise ConnectionRefusedError(f"{what}: {foreign}")


def platform_peer(peer: tuple[str, int] | None, local: tuple[str, int] | None) -> bool | None:
    """Whether the other end of this connection is a process of this machine running
    as this process's own account (the hub's proxy, the hub, the service): True;
    another account's (a user's kernel): False; None when it is not a socket of this
    machine (a remote client or proxy), or cannot be told."""
    if not peer or not local:
        return None
    try:
        uid = peer_uid(peer[:2], local[:2])
    except ValueError:
        return None
    return None if uid is None else uid == os.geteuid()


def client_source(
    peer: str,
    forwarded_for: str | None,
    trusted: Iterable = LOOPBACK,
    peer_is_platform: bool | None = None,
) -> str:
    """The client's address: ``peer`` (who connected), or, while that is a trusted
    proxy, the hop it says it got the request from (X-Forwarded-For read from the
    right). The left end is whatever the client wrote, so it counts only when every
    hop after it is a trusted proxy.

    A hop is a trusted proxy when its address is in ``trusted``, but a loopback
    address never is by address alone: every user's kernel connects from loopback
    too. The peer on loopback is trusted only with ``peer_is_platform`` True (its
    socket belongs to the platform's own account, :func:`platform_peer`:
    the hub's proxy), and a loopback hop inside X-Forwarded-For (what the proxy saw:
    a process of this machine, any user's) ends the walk. ``peer_is_platform``
    False (another account's socket on this machine) trusts nothing."""
    nets = [n if not isinstance(n, str) else ipaddress.ip_network(n, strict=False) for n in trusted]

    def is_trusted(addr: str, platform: bool | None) -> bool:
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            return False
        ip = getattr(ip, "ipv4_mapped", None) or ip
        if platform is False or (ip.is_loopback and not platform):
            return False
        return any(ip in n for n in nets if n.version == ip.version)

    current = peer or "unknown"
    trusted_now = is_trusted(current, peer_is_platform)
    hops = [h.strip() for h in (forwarded_for or "").split(",") if h.strip()]
    while hops and trusted_now:
        candidate = hops.pop()
        try:
            ipaddress.ip_address(candidate)
        except ValueError:
            break  # not an address: stop at the last one that was
        current = candidate
        trusted_now = is_trusted(current, None)
    return current[:255]
