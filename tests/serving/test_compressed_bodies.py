"""A compressed request body is unpacked only up to the model server's body limit: a
small gzip of zeros that unpacks to gigabytes is a 413, not a replica killed for memory.

The model server runs in this process (its application on a free port); an aiohttp
client sends the bodies as they are, compressed.
"""

from __future__ import annotations

import gzip
import json
import zlib

import aiohttp
import numpy as np
import pytest
import torch
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpulab.serving.export import export_model, load_model
from gpulab.serving.server import ModelServer

LIMIT = 1 << 20  # the server's body limit here: 1 MiB


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_model):
    path = str(tmp_path_factory.mktemp("tiny"))
    export_model(tiny_model, torch.randn(4, 16), path, name="tiny")
    return path


@pytest.fixture
async def url(tiny_dir):
    server = ModelServer(load_model(tiny_dir), max_latency_ms=0, max_body_bytes=LIMIT)
    sockets = bind_sockets(0, "127.0.0.1")
    http = HTTPServer(server.app(), max_body_size=LIMIT)
    http.add_sockets(sockets)
    server.start()
    try:
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}/v2/models/tiny/infer"
    finally:
        http.stop()
        await server.stop()
        await http.close_all_connections()


def infer_body(rows: int = 1) -> bytes:
    data = [0.5] * (16 * rows)
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, 16], "data": data}]}
    return json.dumps(doc).encode()


async def post(url: str, body: bytes, encoding: str) -> tuple[int, dict]:
    sent = {"data": body, "headers": {"Content-Encoding": encoding}}
    async with aiohttp.ClientSession() as session, session.post(url, **sent) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.parametrize(
    "encoding, pack", [("gzip", gzip.compress), ("deflate", zlib.compress)], ids=["gzip", "deflate"]
)
async def test_a_body_that_unpacks_past_the_limit_is_a_413_that_says_it(url, encoding, pack):
    bomb = pack(b"\0" * (16 * LIMIT))  # 16 MiB unpacked, a few KiB sent
    assert len(bomb) < LIMIT
    status, doc = await post(url, bomb, encoding)
    assert status == 413
    assert f"the {encoding} body unpacks to more than 1 MiB" in doc["error"]
    assert "--max-body-mib" in doc["error"]
    # The server carries on: a compressed call within the limit is answered.
    status, doc = await post(url, pack(infer_body()), encoding)
    assert status == 200, doc
    assert np.array(doc["outputs"][0]["data"]).shape == (4,)


async def test_gzip_members_and_padding_unpack_as_before(url):
    """gzip.decompress read every member of a body and skipped zero padding: still so."""
    body = infer_body(rows=2)
    half = len(body) // 2
    sent = gzip.compress(body[:half]) + gzip.compress(body[half:]) + b"\0" * 8
    status, doc = await post(url, sent, "gzip")
    assert status == 200, doc
    assert doc["outputs"][0]["shape"] == [2, 4]
    status, doc = await post(url, gzip.compress(body)[:-5], "gzip")  # cut short
    assert status == 400 and "not valid gzip" in doc["error"]
