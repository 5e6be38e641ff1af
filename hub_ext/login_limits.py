"""Failed logins lock the address they come from, not the account they name.

NativeAuthenticator counted failures per user name, so anyone could lock the
admin out by typing the admin's name with a wrong password ten times. Here the
count belongs to the client's address: the attacker's address waits, the admin
logging in from anywhere else does not.

Who a try comes from (:func:`login_source`):

- through the hub's own proxy (a loopback connection whose socket belongs to
  the hub's own Unix account, as the configurable-http-proxy it starts does):
  the last hop the proxy added to ``X-Forwarded-For``, skipping the hops in
  ``c.JupyterHub.trusted_downstream_ips``;
- a loopback connection of another account (a user's kernel calling the hub's
  port directly): that account, ``uid <n>``, whatever headers it sends, so it
  can neither pick a fresh address per try nor lock out someone else's;
- from another host (a proxy in a pod of its own): the ``X-Forwarded-For`` hop
  as above, else the peer.

Unlike Tornado's ``request.remote_ip``, a client's ``X-Real-Ip`` is never
believed.

Memory is bounded: at most ``max_sources`` addresses are remembered (the one
idle longest goes first), and an address's count ends with its lock period.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import time
from dataclasses import dataclass


def login_source(request) -> str:
    """Who a login request comes from (see the module). Reads the kernel's socket
    table for a loopback peer (milliseconds on a busy host): call it in a thread."""
    context = getattr(request.connection, "context", None)
    address = getattr(context, "address", None)
    peer = str(address[0] if isinstance(address, tuple) and address else request.remote_ip)
    if _is_loopback(peer):
        uid = _peer_uid(request, address)
        if uid is not None and uid != os.geteuid():
            return f"uid {uid}"
    forwarded = request.headers.get("X-Forwarded-For")
    if not forwarded:
        return peer
    trusted = getattr(context, "trusted_downstream", None) or set()
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    for hop in reversed(hops):
        if hop not in trusted:
            return hop if _is_ip(hop) else peer
    return peer


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_loopback(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _peer_uid(request, peer) -> int | None:
    """The Unix account owning the other end of a loopback connection, from the
    kernel's socket table (``/proc/net/tcp``: each socket's uid); None if unknown."""
    sock = getattr(getattr(request.connection, "stream", None), "socket", None)
    try:
        ours = sock.getsockname() if sock is not None else None
    except OSError:
        return None
    if not ours or not isinstance(peer, tuple):
        return None
    for table, wide in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        want = (_proc_address(peer, wide), _proc_address(ours, wide))
        if None in want:
            continue
        try:
            with open(table) as f:
                text = f.read()
        except OSError:
            continue
        # Find the one line by its two addresses, then read its uid column.
        at = text.find(f" {want[0]} {want[1]} ")
        if at >= 0:
            fields = text[at : text.find("\n", at)].split()
            # local rem st tx:rx tr:when retrnsmt uid ...
            return int(fields[6]) if len(fields) > 6 else None
    return None


def _proc_address(address, wide: bool) -> str | None:
    """``(ip, port)`` as /proc/net/tcp (4 bytes) or tcp6 (16 bytes) writes it:
    32-bit words in host order (little-endian here), then the port."""
    try:
        ip = ipaddress.ip_address(address[0])
    except ValueError:
        return None
    if wide and ip.version == 4:
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    elif not wide and ip.version == 6:
        if ip.ipv4_mapped is None:
            return None
        ip = ip.ipv4_mapped
    raw = ip.packed
    words = "".join(raw[i : i + 4][::-1].hex().upper() for i in range(0, len(raw), 4))
    return f"{words}:{address[1]:04X}"


@dataclass
class _Failures:
    count: int
    last: float


class SourceLockout:
    """Counts failed logins per source address and says which are locked."""

    def __init__(
        self, allowed_failures: int, lock_seconds: float, max_sources: int = 10000, clock=None
    ):
        self.allowed_failures = allowed_failures
        self.lock_seconds = lock_seconds
        self.max_sources = max_sources
        #: Seconds, monotonic; a test may set its own.
        self.clock = clock or time.monotonic
        self._failures: collections.OrderedDict[str, _Failures] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def seconds_locked(self, source: str) -> float:
        """How long this source must still wait (0: it may try)."""
        entry = self._current(source)
        if entry is None or not self.allowed_failures or entry.count < self.allowed_failures:
            return 0.0
        return max(entry.last + self.lock_seconds - self.clock(), 0.0)

    def failed(self, source: str) -> None:
        now = self.clock()
        entry = self._current(source)
        if entry is None:
            entry = self._failures[source] = _Failures(0, now)
        entry.count += 1
        entry.last = now
        self._failures.move_to_end(source)
        # Oldest failure first: drop what has expired, then what is over the bound.
        while self._failures:
            oldest = next(iter(self._failures.values()))
            if len(self._failures) <= self.max_sources and now - oldest.last < self.lock_seconds:
                break
            self._failures.popitem(last=False)

    def _current(self, source: str) -> _Failures | None:
        """The source's count, or None once its last failure is a lock period old.
        (A success does not clear it: logging in to one's own account between
        guesses must not reset the count for guessing another's.)"""
        entry = self._failures.get(source)
        if entry is not None and self.clock() - entry.last >= self.lock_seconds:
            del self._failures[source]
            return None
        return entry
