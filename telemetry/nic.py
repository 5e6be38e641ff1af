"""Network interfaces from ``/sys/class/net/*/statistics``.

The kernel's counters are cumulative since the interface appeared; the sampler
also keeps the previous reading per interface to report rates, which is what a
dashboard draws. Readings come from the sysfs of the network namespace the
process runs in (inside a pod: the pod's interfaces).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .sample import SourceMissing
from .sysfs import rates_since, read_int, read_text

COUNTERS = (
    "rx_bytes",
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
)


class NicSampler:
    """Samples every interface (except ``lo`` unless asked) under ``sysfs``."""

    def __init__(
        self,
        sysfs: str = "/sys",
        include_loopback: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.root = os.path.join(sysfs, "class", "net")
        self.include_loopback = include_loopback
        self._clock = clock
        self._previous: dict[str, tuple[float, int, int]] = {}

    def sample(self) -> list[dict]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            raise SourceMissing(f"no network interfaces ({self.root} absent)") from None
        now = self._clock()
        nics = []
        for name in names:
            if name == "lo" and not self.include_loopback:
                continue
            nic = self._interface(name, now)
            if nic is not None:
                nics.append(nic)
        self._previous = {n["device"]: (now, n["rx_bytes"], n["tx_bytes"]) for n in nics}
        return nics

    def _interface(self, name: str, now: float) -> dict | None:
        base = os.path.join(self.root, name)
        counters = {c: read_int(os.path.join(base, "statistics", c)) for c in COUNTERS}
        if counters["rx_bytes"] is None or counters["tx_bytes"] is None:
            return None  # vanished between listing and reading
        speed = read_int(os.path.join(base, "speed"))
        nic = {
            "device": name,
            **counters,
            "operstate": read_text(os.path.join(base, "operstate")),
            "mtu": read_int(os.path.join(base, "mtu")),
            "speed_mbps": speed if speed and speed > 0 else None,
            # Physical NICs have a backing device; veth, bridges, tunnels don't.
            "virtual": not os.path.exists(os.path.join(base, "device")),
        }
        nic["rx_bytes_per_second"], nic["tx_bytes_per_second"] = rates_since(
            self._previous.get(name), now, nic["rx_bytes"], nic["tx_bytes"]
        )
        return nic
