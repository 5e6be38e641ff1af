"""A search server that searches nothing: the floor of any REST search path here.

    python benchmarks/_search_floor.py ANSWERS

ANSWERS holds one line per query, ``<request body, base64>\\t<response body>``. The
server prints its port, then answers each ``POST`` whose body is one of those with its
response at once (HTTP/1.1, the connection kept alive); any other body gets a 404. It
reads no more of a request than its ``Content-Length``: the queries/s that
vector_search.py's clients reach here is what the clients, the loopback and the least
a server can do cost per call on this machine, before any search. Its
``client-floor`` row runs it in a process of its own, so that it does not share the
clients' CPU time.
"""

from __future__ import annotations

import asyncio
import base64
import sys


def response(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


NOT_FOUND = response("404 Not Found", b'{"detail": "not one of the answered queries"}')


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class Connection(asyncio.Protocol):
    """One client's kept-alive connection: its requests answered in order."""

    def __init__(self, answers: dict[bytes, bytes]):
        self.answers = answers
        self.buf = b""

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (head_end := self.buf.find(b"\r\n\r\n")) >= 0:
            end = head_end + 4 + content_length(self.buf[:head_end])
            if len(self.buf) < end:
                return  # the body is still on its way
            body, self.buf = self.buf[head_end + 4 : end], self.buf[end:]
            self.transport.write(self.answers.get(body, NOT_FOUND))


def read_answers(path: str) -> dict[bytes, bytes]:
    answers = {}
    with open(path, "rb") as f:
        for line in f:
            body, _, answer = line.rstrip(b"\n").partition(b"\t")
            answers[base64.b64decode(body)] = response("200 OK", answer)
    return answers


async def serve(path: str) -> None:
    answers = read_answers(path)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(answers), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
