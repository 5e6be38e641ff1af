"""A collection of texts embedded by an endpoint: long texts go in as chunks through
the endpoint, hits come back with their chunk's text, and sharing the collection says
(in the share and in the refusal) that its endpoint must be shared too. The real
service in-process with the real embedded engine; its embedder is the service's call
path over an endpoint table (the standby's ``TableCalls``, the live one's rules) to a
real model server on the exported all-MiniLM-L6-v2 (no hub: no deployment to make).
LangChain's and LlamaIndex's stores over it need no embedding model of their own."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from hubproc import let_accounts_reach
from support.model_server import ServerProcess
from support.service import running_service

from gpulab.client import Client
from gpulab.client.collections import Collection
from gpulab.client.errors import PermissionDenied
from gpulab.service.endpoints.standby import TableCalls
from gpulab.serving.export import CARD_FILE

pytestmark = pytest.mark.slow

SECRET = "replica-secret"
BOOK = (
    "The tarfile module makes it possible to read and write tar archives, including "
    "those using gzip, bz2 and lzma compression. Use the zipfile module to read or write "
    "zip files. The json module encodes Python objects as JSON text and decodes it again. "
    "The sqlite3 module is an interface to SQLite, a small disk-based database."
)


@pytest.fixture(scope="module")
def replica(minilm_dir):
    os.environ["GPULAB_SERVING_TOKEN"] = SECRET  # read (and dropped) by the server at start
    try:
        proc = ServerProcess(minilm_dir, "--max-batch-size", "8")
    finally:
        del os.environ["GPULAB_SERVING_TOKEN"]
    try:
        proc.wait_listening()
        yield f"http://{proc.url}"
    finally:
        proc.stop()


class CardCalls(TableCalls):
    def __init__(self, card: dict):
        super().__init__()
        self._card = card

    def card(self, unit):
        return self._card


def endpoint_table(address: str, shares=()) -> list[dict]:
    version = {"id": "d1", "version": 1, "weight": 100, "state": "running"}
    version |= {"message": "1/1 ready", "max_queue": 8, "replicas": 1, "max_batch_size": 8}
    version |= {"ready": [[0, address]], "token": SECRET}
    row = {"id": "d1", "user": "alice", "name": "minilm", "share_users": list(shares)}
    row |= {"share_groups": [], "state": "running", "message": "1/1 ready"}
    return [{**row, "versions": [version]}]


async def test_a_text_collection_keeps_chunks_and_says_its_endpoint_must_be_shared(
    tmp_path, replica, minilm_dir
):
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM

    from gpulab.client.langchain import GpulabVectorStore as LangChainStore
    from gpulab.client.llama_index import GpulabVectorStore as LlamaStore

    with open(os.path.join(minilm_dir, CARD_FILE)) as f:
        calls = CardCalls(json.load(f))
    calls.load(endpoint_table(replica))
    let_accounts_reach(tmp_path)
    try:
        async with running_service(tmp_path / "svc") as svc:
            svc.app.vectors.embedder = calls.embed
            svc.app.vectors.endpoint_row = calls.endpoint
            alice = Client(api_url=svc.api, token=svc.create_user("alice"))
            bob = Client(api_url=svc.api, token=svc.create_user("bob"))
            query = "open a compressed tar archive"

            def alice_side():
                docs = Collection("alice/docs", embed="minilm", client=alice)
                ids = docs.insert(
                    texts=[BOOK],
                    metadata=[{"source": "guide.txt"}],
                    ids=["guide"],
                    chunk_size=120,
                    chunk_overlap=30,
                )
                assert len(ids) > 3 and ids[0] == "guide#0"
                (hit,) = docs.search(text=query, k=1)
                assert hit.id == "guide#0" and "tar archives" in hit.text
                assert hit.text == BOOK[: len(hit.text)]
                assert hit.metadata == {"source": "guide.txt", "chunk": 0, "start": 0}
                return docs.share(users=["bob"])

            shared = await asyncio.to_thread(alice_side)
            assert shared["warning"] == (
                "alice/docs embeds texts through endpoint alice/minilm, which bob may not "
                "call: they can search it with vectors, but text searches and inserts of "
                "texts are refused until the endpoint is shared too: "
                "Client().share_deployment(\"minilm\", share_users=['bob'])"
            )

            def bob_refused():
                docs = Collection("alice/docs", client=bob)
                with pytest.raises(PermissionDenied) as refused:
                    docs.search(text=query, k=1)
                assert str(refused.value) == (
                    "bob may use alice/docs but not call the endpoint that embeds its texts, "
                    "alice/minilm: ask alice to share it with you too (Client()."
                    'share_deployment("minilm", share_users=[..., "bob"])), or send vectors '
                    "you embed yourself"
                )
                assert len(docs.search(vector=[0.05] * 384, k=2)) == 2

            await asyncio.to_thread(bob_refused)

            calls.load(endpoint_table(replica, shares=["bob"]))  # alice shares minilm too
            view = await asyncio.to_thread(
                lambda: Collection("alice/docs", client=alice).share(users=["bob"])
            )
            assert "warning" not in view

            def bob_through_the_frameworks():
                # No embedding model here: the collection's endpoint embeds the queries.
                store = LangChainStore("alice/docs", client=bob)
                (doc,) = store.similarity_search(query, k=1)
                assert doc.id == "guide#0" and "tar archives" in doc.page_content
                index = VectorStoreIndex.from_vector_store(
                    LlamaStore("alice/docs", client=bob), embed_model=MockEmbedding(embed_dim=8)
                )
                response = index.as_query_engine(llm=MockLLM(), similarity_top_k=1).query(query)
                assert response.source_nodes[0].node.node_id == "guide#0"

            await asyncio.to_thread(bob_through_the_frameworks)
    finally:
        await calls.proxy.close()
