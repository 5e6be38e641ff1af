"""RDMA ports (InfiniBand, RoCE) from ``/sys/class/infiniband``.

``port_rcv_data`` and ``port_xmit_data`` count 4-byte words (the IB spec's
"octets divided by 4"), so bytes are the counter times four. Rates come from
the previous reading, as for NICs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .sample import SourceMissing
from .sysfs import rates_since, read_int, read_text

WORD_BYTES = 4


class RdmaSampler:
    """Samples every port of every RDMA device under ``sysfs``."""

    def __init__(self, sysfs: str = "/sys", clock: Callable[[], float] = time.monotonic):
        self.root = os.path.join(sysfs, "class", "infiniband")
        self._clock = clock
        self._previous: dict[tuple[str, str], tuple[float, int, int]] = {}

    def sample(self) -> list[dict]:
        try:
            devices = sorted(os.listdir(self.root))
        except FileNotFoundError:
            raise SourceMissing(f"no RDMA devices ({self.root} absent)") from None
        if not devices:
            raise SourceMissing(f"no RDMA devices (none under {self.root})")
        now = self._clock()
        ports = []
        for device in devices:
            ports_dir = os.path.join(self.root, device, "ports")
            try:
                names = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
            except FileNotFoundError:
                continue
            for port in names:
                entry = self._port(device, port, os.path.join(ports_dir, port), now)
                if entry is not None:
                    ports.append(entry)
        self._previous = {
            (p["device"], p["port"]): (now, p["rx_bytes"], p["tx_bytes"]) for p in ports
        }
        return ports

    def _port(self, device: str, port: str, base: str, now: float) -> dict | None:
        counters = os.path.join(base, "counters")
        rx_words = read_int(os.path.join(counters, "port_rcv_data"))
        tx_words = read_int(os.path.join(counters, "port_xmit_data"))
        if rx_words is None or tx_words is None:
            return None
        entry = {
            "device": device,
            "port": port,
            "rx_bytes": rx_words * WORD_BYTES,
            "tx_bytes": tx_words * WORD_BYTES,
            "rx_packets": read_int(os.path.join(counters, "port_rcv_packets")),
            "tx_packets": read_int(os.path.join(counters, "port_xmit_packets")),
            "link_layer": read_text(os.path.join(base, "link_layer")),  # InfiniBand | Ethernet
            "state": read_text(os.path.join(base, "state")),  # e.g. "4: ACTIVE"
            "rate": read_text(os.path.join(base, "rate")),  # e.g. "200 Gb/sec (4X HDR)"
        }
        entry["rx_bytes_per_second"], entry["tx_bytes_per_second"] = rates_since(
            self._previous.get((device, port)), now, entry["rx_bytes"], entry["tx_bytes"]
        )
        return entry
