"""Failed logins count against the client and the name it tries, never the name alone.

NativeAuthenticator counted failures per user name, so anyone could lock the
admin out by typing the admin's name with a wrong password ten times. Here a
failure counts for the pair (source, name) and, with a higher limit, for the
source alone (guessing many names); a browser that has logged in to a name
before has a count of its own for it (:mod:`.login_devices`). So an attacker
waits; the admin, from anywhere else or from a browser she used before, does not.

Who a try comes from (:func:`login_source`), with the answer the service's audit
trail uses (:func:`gpulab.enforcement.peer_account.client_source`):

- through the hub's own proxy (a loopback connection whose socket belongs to
  the hub's own Unix account, as the configurable-http-proxy it starts does):
  the hop the proxy added to ``X-Forwarded-For``, skipping the hops in
  ``c.JupyterHub.trusted_downstream_ips``. A loopback hop (a process of this
  machine: any user's kernel as well as a browser on it) is :data:`THIS_MACHINE`,
  whichever of the 16 million loopback addresses it connected from, so a kernel
  cannot pick a fresh address per try;
- a loopback connection of another account (a user's kernel calling the hub's
  port directly): that account, ``uid <n>``, whatever headers it sends;
- from another host: the peer, or, when the peer is in
  ``c.JupyterHub.trusted_downstream_ips`` (a proxy or load balancer in a pod or
  host of its own), the hop it forwarded for. Anyone else's ``X-Forwarded-For``
  is not believed, nor is anyone's ``X-Real-Ip``.

Memory is bounded: at most ``max_sources`` keys are remembered (the one idle
longest goes first), and a key's count ends with its lock period.
"""

from __future__ import annotations

import collections
import ipaddress
import os
import time
from dataclasses import dataclass

from gpulab.enforcement.peer_account import LOOPBACK, client_source, peer_uid

#: The source of every login that reached the proxy over loopback.
THIS_MACHINE = "this machine"


def login_source(request) -> str:
    """Who a login request comes from (see the module). Reads the kernel's socket
    table for a loopback peer (milliseconds on a busy host): call it in a thread."""
    context = getattr(request.connection, "context", None)
    address = getattr(context, "address", None)
    peer = str(address[0] if isinstance(address, tuple) and address else request.remote_ip)
    platform = None
    if _is_loopback(peer):
        uid = _peer_uid(request, address)
        if uid is not None and uid != os.geteuid():
            return f"uid {uid}"
        platform = True if uid is not None else None  # the hub's account: its proxy
    trusted = [*LOOPBACK, *_networks(getattr(context, "trusted_downstream", None) or ())]
    forwarded = request.headers.get("X-Forwarded-For")
    source = client_source(peer, forwarded, trusted, peer_is_platform=platform)
    return THIS_MACHINE if _is_loopback(source) else source


def throttle_unit(source: str) -> str:
    """What one source's failed logins count against: an IPv6 address's /64 (one
    host or site is given a whole /64: by address, it could try as 2**64 sources),
    else the source as it is (an IPv4 address, ``uid N``, this machine)."""
    try:
        ip = ipaddress.ip_address(source)
    except ValueError:
        return source
    if ip.version == 6 and not ip.ipv4_mapped:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return source


def _networks(addresses) -> list:
    nets = []
    for text in addresses:
        try:
            nets.append(ipaddress.ip_network(str(text), strict=False))
        except ValueError:
            continue  # JupyterHub compares hops with these as text; no address, no match
    return nets


def _is_loopback(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _peer_uid(request, peer) -> int | None:
    """The Unix account owning the other end of a loopback connection (the kernel's
    socket table, :func:`gpulab.enforcement.peer_account.peer_uid`); None if unknown."""
    sock = getattr(getattr(request.connection, "stream", None), "socket", None)
    try:
        local = sock.getsockname() if sock is not None else None
    except OSError:
        return None
    if not local or not isinstance(peer, tuple):
        return None
    try:
        return peer_uid(peer[:2], local[:2])
    except ValueError:
        return None


@dataclass
class _Failures:
    count: int
    last: float


class SourceLockout:
    """Counts failed logins per key (a source and a name, a source, a device) and
    says which keys are locked."""

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
        """How long this key must still wait (0: it may try)."""
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
