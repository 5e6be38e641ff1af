"""LangChain and LlamaIndex over a gpulab collection, from a real kernel in alice's
server on a real hub: she fills a collection through LangChain's vector store, a
retrieval chain puts the tar archive text in its prompt, and a LlamaIndex query
engine finds the same node. bob's stores over her collection are refused until she
shares it. The embedding is deterministic and local (tests/support/word_embeddings.py:
no model weights here); the service-side embedding is in test_collections_notebook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hubproc import fresh_user
from kernelexec import run_in_kernel
from support import word_embeddings
from support.word_embeddings import CORPUS, QUERY, WordEmbeddings

from gpulab.client import Client
from gpulab.client.errors import PermissionDenied

pytestmark = pytest.mark.slow

ALICE = fresh_user("alice-frameworks")
BOB = fresh_user("bob-frameworks")

CELL = """
import json
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from llama_index.core import VectorStoreIndex
from llama_index.core.llms import MockLLM
from gpulab.client.langchain import GpulabVectorStore as LangChainStore
from gpulab.client.llama_index import GpulabVectorStore as LlamaStore

store = LangChainStore.from_texts(
    [t for _, t in CORPUS], WordEmbeddings(),
    metadatas=[{"module": n} for n, _ in CORPUS], ids=[n for n, _ in CORPUS],
    collection_name="modules",
)
prompt = ChatPromptTemplate.from_template("Context: {context}\\nQuestion: {question}")
chain = (
    {"context": store.as_retriever(search_kwargs={"k": 1})
        | RunnableLambda(lambda docs: "\\n".join(d.page_content for d in docs)),
     "question": RunnablePassthrough()}
    | prompt
    | RunnableLambda(lambda p: p.to_string())
)
print("CHAIN", json.dumps(chain.invoke(QUERY)))

index = VectorStoreIndex.from_vector_store(LlamaStore("modules"), embed_model=WordEmbedding())
response = index.as_query_engine(llm=MockLLM(), similarity_top_k=1).query(QUERY)
node = response.source_nodes[0].node
print("LLAMA", json.dumps([node.node_id, node.text]))
"""


@pytest.fixture(scope="module")
def hub(plain_hub):
    return plain_hub


def test_a_langchain_chain_and_a_llama_index_query_in_a_kernel_hold_sharing(hub):
    token = hub.create_user(ALICE)
    bob = hub.create_user(BOB)
    hub.spawn_ready({ALICE: {"gpu_milli": 0}})
    code = Path(word_embeddings.__file__).read_text() + CELL
    out = run_in_kernel(f"{hub.url}/user/{ALICE}", token, code, timeout=300)

    answer = json.loads(out.split("CHAIN ", 1)[1].splitlines()[0])
    assert f"Context: {CORPUS[0][1]}" in answer and f"Question: {QUERY}" in answer, out
    node = json.loads(out.split("LLAMA ", 1)[1].splitlines()[0])
    assert node == ["tarfile", CORPUS[0][1]], out

    # bob's stores over alice's collection: refused, as his Collection is, until shared.
    from gpulab.client.langchain import GpulabVectorStore as LangChainStore
    from gpulab.client.llama_index import GpulabVectorStore as LlamaStore

    ca = hub.verify if isinstance(hub.verify, str) else None
    as_bob = Client(api_url=hub.api, token=bob, ca_file=ca)
    name = f"{ALICE}/modules"
    with pytest.raises(PermissionDenied, match="not shared with you"):
        LangChainStore(name, WordEmbeddings(), client=as_bob)
    with pytest.raises(PermissionDenied, match="not shared with you"):
        LlamaStore(name, client=as_bob)
    r = hub.gpulab("PATCH", f"/collections/{name}", token=token, json={"share_users": [BOB]})
    assert r.status_code == 200, r.text
    docs = LangChainStore(name, WordEmbeddings(), client=as_bob).similarity_search(QUERY, k=1)
    assert (docs[0].id, docs[0].page_content) == ("tarfile", CORPUS[0][1])
