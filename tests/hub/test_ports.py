"""`gpulab up` picks its internal ports where no outgoing connection or bind to port 0
can take them before the hub's processes listen."""

import socket

from gpulab.hub_ext import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    low = ports._ephemeral_low()
    picked = {ports.free_port() for _ in range(20)}
    assert all(low - ports.SPAN <= p < low for p in picked), picked
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # nothing holds it


def test_a_port_someone_listens_on_is_skipped(monkeypatch):
    # Other tests' processes hold ports in the same range meanwhile: the ports are
    # chosen free now, and the pick must be the first of them still free.
    low = ports._ephemeral_low()
    candidates = [
        p for p in range(low - 1, low - ports.SPAN, -1) if ports._bindable("127.0.0.1", p)
    ]
    with socket.socket() as held:
        held.bind(("127.0.0.1", candidates[0]))
        held.listen()
        offered = candidates[:20]
        # The random draw offers the held port first.
        monkeypatch.setattr(ports.random, "sample", lambda pool, k: offered)
        picked = ports.free_port()
    assert picked != offered[0]
    assert picked in offered[1:], picked
