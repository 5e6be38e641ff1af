"""The suite's own harness: an in-process server accepts even when its socket's number
is one an earlier test left registered with the session's event loop (the cause of a
POST that CI saw time out after 120 s, with no task of the service handling it)."""

from __future__ import annotations

import asyncio
import socket

import requests
from support.service import listen
from tornado import web


class Hello(web.RequestHandler):
    def get(self):
        self.write("hello")


async def test_a_server_accepts_on_a_number_an_earlier_socket_left_registered():
    loop = asyncio.get_running_loop()
    old = socket.socket()
    number = old.fileno()
    loop.add_reader(number, lambda: None)
    old.close()  # closed without remove_reader: the loop still holds the number
    server, port = listen(web.Application([("/", Hello)]))
    try:
        # The listening socket took the freed number (the lowest free one).
        assert number in {s.fileno() for s in server._sockets.values()}
        r = await asyncio.to_thread(requests.get, f"http://127.0.0.1:{port}/", timeout=10)
        assert r.text == "hello"
    finally:
        server.stop()
