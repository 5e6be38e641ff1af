"""An embedding model (the real all-MiniLM-L6-v2) exported, loaded and encoded as a
replica does: the card, the shapes, unit rows, and that nearness means something."""

import json
import os

import numpy as np
import pytest
from support.model_server import binary_texts

from gpulab.serving.embedding import ARCHIVE_FILE, EmbeddingModel
from gpulab.serving.export import CARD_FILE, ModelCard, export_model, load_model
from gpulab.serving.oip import BadRequest, decode_request

TARFILE_DOC = (
    "Read from and write to tar format archives. The tarfile module makes it possible "
    "to read and write tar archives, including those using gzip, bz2 and lzma compression."
)
JSON_DOC = (
    "JSON encoder and decoder. json exposes an API familiar to users of the standard "
    "library marshal and pickle modules: dumps and loads turn Python objects into text."
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, minilm_model):
    model_dir = str(tmp_path_factory.mktemp("minilm"))
    card = export_model(minilm_model, None, model_dir, name="minilm", max_batch_size=64)
    return model_dir, card


def test_the_card_says_text_in_embeddings_out(exported):
    model_dir, card = exported
    assert sorted(os.listdir(model_dir)) == [CARD_FILE, ARCHIVE_FILE]
    with open(os.path.join(model_dir, CARD_FILE)) as f:
        written = json.load(f)
    assert written["kind"] == "sentence-embedding" and written["normalized"] is True
    assert written["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert written["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert written["name"] == "minilm" and written["max_batch_size"] == 64
    assert card.kind == "sentence-embedding"


def test_loaded_model_gives_unit_rows_and_sensible_neighbours(exported):
    model_dir, _ = exported
    served = load_model(model_dir)
    assert isinstance(served, EmbeddingModel)
    query = "open a compressed tar file"
    (out,) = served(np.array([query, TARFILE_DOC, JSON_DOC], dtype=object))
    assert out.shape == (3, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert out[0] @ out[1] > out[0] @ out[2]
    # The same text alone or in a batch: the same row (padding does not leak in).
    (alone,) = served(np.array([query], dtype=object))
    np.testing.assert_allclose(alone[0], out[0], atol=1e-5)


def test_text_requests_decode_and_bad_ones_say_why(exported):
    model_dir, _ = exported
    with open(os.path.join(model_dir, CARD_FILE)) as f:
        card = ModelCard.from_json(f.read())

    def body(data, shape=None):
        shape = [len(data)] if shape is None else shape
        doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}]}
        return json.dumps(doc).encode()

    req = decode_request(body(["a", "b"]), None, card)
    assert req.rows == 2 and req.inputs[0].tolist() == ["a", "b"]
    # tritonclient's binary form: a 4-byte little-endian length before each element.
    texts, head_length = binary_texts(["héllo".encode(), b"x"])
    req = decode_request(texts, str(head_length), card)
    assert req.inputs[0].tolist() == ["héllo", "x"]

    bad_utf8, head_length = binary_texts([b"\xff\xfe"])
    for payload, length, message in [
        (body([1, "b"]), None, "element 0 is int, not a string"),
        (body([], [0]), None, "empty batch"),
        (body(["a"], [2]), None, "needs 2 strings, got 1"),
        (bad_utf8, str(head_length), "element 0 is not UTF-8 text"),
    ]:
        with pytest.raises(BadRequest, match=message) as err:
            decode_request(payload, length, card)
        assert "\n" not in str(err.value)
