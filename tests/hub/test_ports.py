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
    low = ports._ephemeral_low()
    with socket.socket() as held:
        held.bind(("127.0.0.1", low - 1))
        held.listen()
        # The random draw offers the held port first: the pick is the next one.
        monkeypatch.setattr(ports.random, "sample", lambda pool, k: [low - 1, low - 2])
        assert ports.free_port() == low - 2
