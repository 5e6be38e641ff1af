"""The model server as a real process, called by a real OIP v2 client (tritonclient.http)."""

import json
import re

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

TIMEOUT = 60  # seconds; a bound on every call, never a wait


def client(url, concurrency=1):
    return triton.InferenceServerClient(
        url, concurrency=concurrency, connection_timeout=TIMEOUT, network_timeout=TIMEOUT
    )


def infer(c, model, x, binary=True, name="input", datatype="FP32"):
    inp = triton.InferInput(name, list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    out = triton.InferRequestedOutput("output", binary_data=binary)
    return c.infer(model, [inp], outputs=[out])


def reference(model, x):
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def metric(url, name, labels):
    text = requests.get(f"http://{url}/metrics", timeout=TIMEOUT).text
    pattern = re.escape(name) + r"\{([^}]*)\} (\S+)"
    total = 0.0
    for found, value in re.findall(pattern, text):
        got = dict(kv.split("=", 1) for kv in found.split(","))
        if all(got.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total


def test_health_and_metadata(servers):
    c = client(servers["batching"].url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("tiny")
    meta = c.get_model_metadata("tiny")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 4]}]
    assert "binary_tensor_data" in c.get_server_metadata()["extensions"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_outputs_match_the_model_in_process(servers, tiny_model, binary):
    c = client(servers["batching"].url)
    x = np.random.default_rng(0).standard_normal((3, 16), dtype=np.float32)
    result = infer(c, "tiny", x, binary=binary)
    np.testing.assert_allclose(
        result.as_numpy("output"), reference(tiny_model, x), rtol=1e-5, atol=1e-6
    )
    assert (
        result.get_output("output").get("parameters", {}).get("binary_data_size") is not None
    ) == binary


def test_default_request_gets_binary_outputs(servers, tiny_model):
    # No outputs named: tritonclient asks for all of them in binary (binary_data_output).
    c = client(servers["batching"].url)
    x = np.ones((2, 16), dtype=np.float32)
    inp = triton.InferInput("input", [2, 16], "FP32")
    inp.set_data_from_numpy(x)
    result = c.infer("tiny", [inp], request_id="req-7")
    assert result.get_response()["id"] == "req-7"
    np.testing.assert_allclose(
        result.as_numpy("output"), reference(tiny_model, x), rtol=1e-5, atol=1e-6
    )


def test_gzip_request_body(servers, tiny_model):
    c = client(servers["batching"].url)
    x = np.full((1, 16), 0.5, dtype=np.float32)
    inp = triton.InferInput("input", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    result = c.infer("tiny", [inp], request_compression_algorithm="gzip")
    np.testing.assert_allclose(
        result.as_numpy("output"), reference(tiny_model, x), rtol=1e-5, atol=1e-6
    )


def test_concurrent_requests_are_batched(servers, tiny_model):
    url = servers["batching"].url
    batches_before = metric(url, "gpulab_serving_batch_size_count", {"model": "tiny"})
    c = client(url, concurrency=16)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 16), dtype=np.float32) for _ in range(16)]
    pending = []
    for x in xs:
        inp = triton.InferInput("input", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        pending.append(c.async_infer("tiny", [inp]))
    for x, p in zip(xs, pending, strict=False):  # every caller gets its own rows back
        np.testing.assert_allclose(
            p.get_result(timeout=TIMEOUT).as_numpy("output"),
            reference(tiny_model, x),
            rtol=1e-5,
            atol=1e-6,
        )
    c.close()
    batches = metric(url, "gpulab_serving_batch_size_count", {"model": "tiny"}) - batches_before
    # 16 one-row requests ran in fewer than 16 model calls: some batch held more than one.
    assert 1 <= batches < 16
    assert metric(url, "gpulab_serving_requests_total", {"model": "tiny", "code": "200"}) >= 16
    assert metric(url, "gpulab_serving_queue_depth", {"model": "tiny"}) == 0


def burst(c, x) -> list[int]:
    """48 requests at once; the status each got."""
    pending = []
    for _ in range(48):
        inp = triton.InferInput("input", [256, 512], "FP32")
        inp.set_data_from_numpy(x)
        pending.append(c.async_infer("heavy", [inp]))
    codes = []
    for p in pending:
        try:
            p.get_result(timeout=TIMEOUT)
            codes.append(200)
        except InferenceServerException as exc:
            assert "queue full" in exc.message()
            codes.append(int(exc.status()))
    return codes


def test_a_full_queue_answers_429_and_the_server_carries_on(servers):
    url = servers["overload"].url
    # 48 requests of 256 rows at once: each takes the model ~3x as long as the client
    # takes to send it, so the burst arrives faster than it is served. Should a busy
    # machine slow the client's sends to the model's pace (no queue forms), the burst
    # is sent again, at most 3 times.
    c = client(url, concurrency=48)
    x = np.random.default_rng(2).standard_normal((256, 512), dtype=np.float32)
    for _ in range(3):
        codes = burst(c, x)
        if 429 in codes:
            break
    c.close()
    assert set(codes) == {200, 429}, codes
    assert metric(url, "gpulab_serving_requests_total", {"model": "heavy", "code": "429"}) >= 1
    assert servers["overload"].alive()
    assert infer(client(url), "heavy", x[:2]).as_numpy("output").shape == (2, 512)


def test_bad_requests_get_400_with_a_message_and_serving_goes_on(servers, tiny_model):
    url = servers["batching"].url
    c = client(url)
    cases = [
        (lambda: infer(c, "tiny", np.zeros((2, 15), np.float32)), 400, "shape [2, 15]"),
        (
            lambda: infer(c, "tiny", np.zeros((2, 16), np.float64), datatype="FP64"),
            400,
            "datatype 'FP64'",
        ),
        (
            lambda: infer(c, "tiny", np.zeros((2, 16), np.float32), name="pixels"),
            400,
            "unknown input 'pixels'",
        ),
        (lambda: infer(c, "tiny", np.zeros((9, 16), np.float32)), 400, "max batch size 8"),
        (lambda: infer(c, "nope", np.zeros((2, 16), np.float32)), 400, "unknown model 'nope'"),
    ]
    for call, status, message in cases:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert int(info.value.status()) == status and message in info.value.message()

    raw = [
        (b"{not json", {}, 400, "malformed JSON"),
        (b"[1, 2]", {}, 400, "JSON object"),
        (
            json.dumps(
                {
                    "inputs": [
                        {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 15}
                    ]
                }
            ).encode(),
            {},
            400,
            "15 values",
        ),
        (b'{"inputs": []}' + b"\0" * 8, {"Inference-Header-Content-Length": "14"}, 400, "inputs"),
        (
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "datatype": "FP32",
                            "shape": [1, 16],
                            "parameters": {"binary_data_size": 64},
                        }
                    ]
                }
            ).encode()
            + b"\0" * 10,
            {"Inference-Header-Content-Length": "99"},
            400,
            "",
        ),
        (b"\x1f\x8b garbage", {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
    ]
    for body, headers, status, message in raw:
        r = requests.post(
            f"http://{url}/v2/models/tiny/infer", data=body, headers=headers, timeout=TIMEOUT
        )
        assert r.status_code == status, (body, r.text)
        assert message in r.json()["error"]
    r = requests.get(f"http://{url}/v2/models/nope", timeout=TIMEOUT)
    assert r.status_code == 404 and "unknown model" in r.json()["error"]
    r = requests.get(f"http://{url}/v2/nowhere", timeout=TIMEOUT)
    assert r.status_code == 404 and "error" in r.json()

    assert servers["batching"].alive()
    x = np.ones((1, 16), np.float32)
    np.testing.assert_allclose(
        infer(c, "tiny", x).as_numpy("output"), reference(tiny_model, x), rtol=1e-5, atol=1e-6
    )
    assert metric(url, "gpulab_serving_requests_total", {"model": "tiny", "code": "400"}) >= 9
    assert metric(url, "gpulab_serving_requests_total", {"model": "", "code": "400"}) >= 1
