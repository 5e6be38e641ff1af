"""The database password is never sent in the clear: a server that asks for it so
(a user's process that took a restarting PostgreSQL's port on this machine) is
refused before the password leaves."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
import sqlalchemy.exc

from gpulab.db.engine import make_engine


def test_a_server_asking_for_the_cleartext_password_gets_nothing():
    got: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def pretend():
        # Each connection: read the startup message, ask for a cleartext password
        # (AuthenticationCleartextPassword), keep what comes back.
        listener.settimeout(10)
        for _ in range(4):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    first = conn.recv(65536)
                    got.append(first)
                    if first[4:8] in (struct.pack("!i", 80877103), struct.pack("!i", 80877104)):
                        conn.sendall(b"N")  # no TLS, no GSS: the startup message next
                        got.append(conn.recv(65536))
                    conn.sendall(b"R" + struct.pack("!ii", 8, 3))
                    got.append(conn.recv(65536))
                except OSError:
                    pass

    thread = threading.Thread(target=pretend, daemon=True)
    thread.start()
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError) as refused:
            make_engine(f"postgresql://gpulab:s3cret-password@127.0.0.1:{port}/gpulab")
        assert "password" in str(refused.value)
    finally:
        listener.close()
        thread.join(5)
    assert got, "the client never connected"
    assert not any(b"s3cret-password" in g for g in got)
