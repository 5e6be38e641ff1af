"""The model server as a real process on an exported all-MiniLM-L6-v2, called by a real
OIP v2 client (tritonclient.http) with BYTES text: embeddings back, batched."""

import json
import re

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from support.model_server import ServerProcess, binary_texts

from gpulab.serving.export import load_model

TIMEOUT = 120  # seconds; a bound on every call, never a wait
TEXTS = ["open a compressed tar file", "parse JSON text", "a cat sat on the mat"]


@pytest.fixture(scope="module")
def reference(minilm_dir):
    (out,) = load_model(minilm_dir)(np.array(TEXTS, dtype=object))
    return out


@pytest.fixture(scope="module")
def server(minilm_dir):
    """One server for the module: batches of up to 8 rows, a request waits up to
    200 ms for company (wide, so concurrent requests meet on a busy machine)."""
    proc = ServerProcess(
        minilm_dir, "--max-batch-size", "8", "--max-latency-ms", "200", "--max-queue", "64"
    )
    try:
        proc.wait_listening()
        yield proc
    finally:
        proc.stop()


def client(url, concurrency=1):
    return triton.InferenceServerClient(
        url, concurrency=concurrency, connection_timeout=TIMEOUT, network_timeout=TIMEOUT
    )


def text_input(texts, binary):
    inp = triton.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    return inp


def metric(url, name, labels):
    text = requests.get(f"http://{url}/metrics", timeout=TIMEOUT).text
    total = 0.0
    for found, value in re.findall(re.escape(name) + r"\{([^}]*)\} (\S+)", text):
        got = dict(kv.split("=", 1) for kv in found.split(","))
        if all(got.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total


def test_metadata_says_text_in_embeddings_out(server):
    meta = client(server.url).get_model_metadata("minilm")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_embeddings_match_the_model_in_process(server, reference, binary):
    out = triton.InferRequestedOutput("embedding", binary_data=binary)
    result = client(server.url).infer("minilm", [text_input(TEXTS, binary)], outputs=[out])
    got = result.as_numpy("embedding")
    assert got.shape == (3, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_concurrent_requests_are_batched(server, reference):
    url = server.url
    before = metric(url, "gpulab_serving_batch_size_count", {"model": "minilm"})
    c = client(url, concurrency=12)
    pending = [c.async_infer("minilm", [text_input([TEXTS[i % 3]], True)]) for i in range(12)]
    for i, p in enumerate(pending):  # every caller gets its own row back
        row = p.get_result(timeout=TIMEOUT).as_numpy("embedding")
        assert row.shape == (1, 384)
        np.testing.assert_allclose(row[0], reference[i % 3], atol=1e-4)
    c.close()
    batches = metric(url, "gpulab_serving_batch_size_count", {"model": "minilm"}) - before
    assert 1 <= batches < 12  # some model call carried more than one request


def post(url, doc=None, data=None, headers=None):
    body = json.dumps(doc).encode() if doc is not None else data
    return requests.post(
        f"http://{url}/v2/models/minilm/infer", data=body, headers=headers or {}, timeout=TIMEOUT
    )


def text_doc(data, shape=None):
    shape = [len(data)] if shape is None else shape
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}]}


def test_bad_text_is_refused_with_one_line(server):
    bad_utf8, head_length = binary_texts([b"\xff\xfe"])
    cases = [
        (post(server.url, text_doc(["fine", 7])), "element 1 is int, not a string"),
        (post(server.url, text_doc([], [0])), "empty batch"),
        (post(server.url, text_doc(["t"] * 9)), "exceeds the max batch size 8"),
        (
            post(
                server.url,
                data=bad_utf8,
                headers={"Inference-Header-Content-Length": str(head_length)},
            ),
            "element 0 is not UTF-8 text",
        ),
        (
            post(server.url, {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1]}]}),
            "the model expects 'BYTES'",
        ),
    ]
    for resp, message in cases:
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert message in error and "\n" not in error
    # The server carries on.
    ok = post(server.url, text_doc(["still here"]))
    assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [1, 384]
