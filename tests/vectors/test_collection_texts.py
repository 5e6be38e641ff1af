"""Hits carry their text, long texts go in as chunks, and LangChain's and LlamaIndex's
vector stores over a collection: the real service in-process with the real embedded
engine, called through the real client (from a thread: its sync face blocks), and
the real ``langchain-core`` and ``llama-index-core`` with a deterministic local
embedding (tests/support/word_embeddings.py: no model weights here)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import sys

import pytest
from hubproc import let_accounts_reach
from support.service import running_service
from support.word_embeddings import CORPUS, DIM, QUERY, WordEmbedding, WordEmbeddings, embed_words

from gpulab.client import Client, chunk_text
from gpulab.client.collections import Collection, chunked
from gpulab.client.errors import BadRequest, PermissionDenied

pytestmark = pytest.mark.slow


async def test_a_hit_returns_the_text_its_row_was_made_from(tmp_path):
    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        r = await svc.request("POST", "/collections", token=alice, json={"name": "d", "dim": DIM})
        assert r.status_code == 201, r.text
        path = "/collections/alice/d"
        texts = [t for _, t in CORPUS]
        body = {
            "ids": [n for n, _ in CORPUS],
            "vectors": [embed_words(t) for t in texts],
            "texts": texts,
            "metadata": [{"n": i} for i in range(len(texts))],
        }
        r = await svc.request("POST", f"{path}/insert", token=alice, json=body)
        assert r.status_code == 200, r.text
        # A row of a vector alone has no text.
        body = {"ids": ["bare"], "vectors": [embed_words("bare vector")]}
        r = await svc.request("POST", f"{path}/insert", token=alice, json=body)
        assert r.status_code == 200, r.text

        r = await svc.request(
            "POST", f"{path}/search", token=alice, json={"vector": embed_words(QUERY), "k": 1}
        )
        (hit,) = r.json()["hits"]
        assert (hit["id"], hit["text"], hit["metadata"]) == ("tarfile", texts[0], {"n": 0})
        r = await svc.request(
            "POST", f"{path}/search", token=alice, json={"vector": embed_words("bare vector")}
        )
        assert r.json()["hits"][0]["id"] == "bare" and r.json()["hits"][0]["text"] is None
        # The kept text can be filtered on like any metadata.
        flt = 'metadata["_text"] like "json%"'
        r = await svc.request(
            "POST",
            f"{path}/search",
            token=alice,
            json={"vector": embed_words(QUERY), "filter": flt},
        )
        assert [h["id"] for h in r.json()["hits"]] == ["json"], r.text

        refused = [
            ({"vectors": [embed_words("a")], "texts": ["a", "b"]}, "2 texts for 1 vectors"),
            ({"vectors": [embed_words("a")], "metadata": [{"_text": "x"}]}, "keeps the row's text"),
        ]
        for body, message in refused:
            r = await svc.request("POST", f"{path}/insert", token=alice, json=body)
            assert r.status_code == 400 and message in r.json()["error"], r.text
        r = await svc.request("GET", path, token=alice)
        assert r.json()["count"] == len(texts) + 1


def test_long_texts_are_cut_into_chunks_that_name_their_source_and_place():
    text = " ".join(f"word{i}" for i in range(300))
    pieces = chunk_text(text, chunk_size=200, chunk_overlap=50)
    assert len(pieces) > 5
    for start, piece in pieces:
        assert len(piece) <= 200 and text[start : start + len(piece)] == piece
        assert not piece.startswith("ord") and piece.split()[-1].startswith("word")  # whole words
    # Each chunk starts inside the one before (the overlap), and together they hold it all.
    for (a, pa), (b, _) in zip(pieces, pieces[1:], strict=False):
        assert a < b < a + len(pa)
    assert pieces[-1][1].endswith("word299")

    texts, metadata, ids = chunked(
        [text, "short one"], [{"source": "book.txt", "lang": "en"}, {}], ["b", "s"], 200, 50
    )
    assert ids[: len(pieces)] == [f"b#{j}" for j in range(len(pieces))] and ids[-1] == "s#0"
    assert metadata[1] == {"lang": "en", "source": "book.txt", "chunk": 1, "start": pieces[1][0]}
    assert metadata[-1] == {"source": "s", "chunk": 0, "start": 0} and texts[-1] == "short one"
    _, metadata, ids = chunked(["one", "two"], None, None, 10, 0)
    assert [m["source"] for m in metadata] == [0, 1] and ids is None
    with pytest.raises(ValueError, match="chunk_overlap must be from 0 to chunk_size - 1"):
        chunk_text(text, chunk_size=100, chunk_overlap=100)


async def test_langchain_and_llama_index_stores_over_a_collection_hold_its_sharing(tmp_path):
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from llama_index.core import VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
    from llama_index.core.vector_stores.types import (
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
    )

    from gpulab.client.langchain import GpulabVectorStore as LangChainStore
    from gpulab.client.llama_index import GpulabVectorStore as LlamaStore

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        alice = Client(api_url=svc.api, token=svc.create_user("alice"))
        bob = Client(api_url=svc.api, token=svc.create_user("bob"))

        def langchain_side():
            store = LangChainStore.from_texts(
                [t for _, t in CORPUS],
                WordEmbeddings(),
                metadatas=[{"module": n, "n": i} for i, (n, _) in enumerate(CORPUS)],
                ids=[n for n, _ in CORPUS],
                collection_name="alice/stdlib",
                client=alice,
            )
            (doc, score), *_ = store.similarity_search_with_score(QUERY, k=2)
            assert (doc.id, doc.page_content, doc.metadata["module"]) == (
                "tarfile",
                CORPUS[0][1],
                "tarfile",
            )
            assert score == pytest.approx(0.535, abs=1e-3)
            docs = store.similarity_search(QUERY, k=3, filter={"module": "csv"})
            assert [d.id for d in docs] == ["csv"]
            docs = store.similarity_search_by_vector(embed_words("sql databases"), k=1)
            assert docs[0].id == "sqlite3" and "sqlite" in docs[0].page_content

            # A retrieval chain: the retriever's documents formatted into the prompt.
            retriever = store.as_retriever(search_kwargs={"k": 1})
            prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {question}")
            chain = (
                {
                    "context": retriever
                    | RunnableLambda(lambda ds: "\n".join(d.page_content for d in ds)),
                    "question": RunnablePassthrough(),
                }
                | prompt
                | RunnableLambda(lambda p: p.to_string())
            )
            answer = chain.invoke(QUERY)
            assert f"Context: {CORPUS[0][1]}" in answer and QUERY in answer

            assert store.delete(["csv"]) and store.collection.count() == len(CORPUS) - 1
            return store

        await asyncio.to_thread(langchain_side)

        def llama_side():
            store = LlamaStore("alice/stdlib", client=alice)
            index = VectorStoreIndex.from_vector_store(store, embed_model=WordEmbedding())
            response = index.as_query_engine(llm=MockLLM(), similarity_top_k=1).query(QUERY)
            (source,) = response.source_nodes
            assert source.node.node_id == "tarfile" and source.node.text == CORPUS[0][1]

            # Nodes of a document in, found by filters, deleted by the document.
            nodes = [
                TextNode(id_=f"guide-{i}", text=t, embedding=embed_words(t), metadata={"p": i})
                for i, t in enumerate(["tar archive guide part one", "tar archive guide two"])
            ]
            for node in nodes:
                node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id="guide")
            assert store.add(nodes) == ["guide-0", "guide-1"]
            filters = MetadataFilters(
                filters=[
                    MetadataFilter(key="p", value=1, operator=FilterOperator.EQ),
                    MetadataFilters(
                        filters=[
                            MetadataFilter(
                                key="module", value=["json", "csv"], operator=FilterOperator.IN
                            ),
                            MetadataFilter(key="p", value=0, operator=FilterOperator.GTE),
                        ],
                        condition=FilterCondition.OR,
                    ),
                ],
                condition=FilterCondition.AND,
            )
            query = VectorStoreQuery(
                query_embedding=embed_words(QUERY), similarity_top_k=5, filters=filters
            )
            result = store.query(query)
            assert result.ids == ["guide-1"] and result.nodes[0].ref_doc_id == "guide"
            assert result.nodes[0].metadata == {"p": 1}
            query = VectorStoreQuery(
                query_embedding=embed_words(QUERY), similarity_top_k=5, doc_ids=["guide"]
            )
            assert sorted(store.query(query).ids) == ["guide-0", "guide-1"]
            store.delete("guide")
            assert store.query(query).ids == []

        await asyncio.to_thread(llama_side)

        def bob_side():
            # Not shared: bob's stores are refused as his Collection is.
            for make in (
                lambda: LangChainStore("alice/stdlib", WordEmbeddings(), client=bob),
                lambda: LlamaStore("alice/stdlib", client=bob),
            ):
                with pytest.raises(PermissionDenied, match="not shared with you"):
                    make()
            Collection("alice/stdlib", client=alice).share(users=["bob"])
            store = LangChainStore("alice/stdlib", WordEmbeddings(), client=bob)
            assert store.similarity_search(QUERY, k=1)[0].id == "tarfile"
            # A collection of vectors needs an Embeddings to take texts.
            with pytest.raises(ValueError, match="give embedding="):
                LangChainStore("alice/stdlib", client=bob)
            with pytest.raises(BadRequest, match="chunk_size= cuts texts="):
                store.collection.insert(vectors=[embed_words("x")], chunk_size=10)

        await asyncio.to_thread(bob_side)


async def test_vectors_magic_errors_name_its_flags_not_python_arguments(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    from gpulab.magics.vectors import VectorsMagics

    let_accounts_reach(tmp_path)
    async with running_service(tmp_path / "svc") as svc:
        monkeypatch.setenv("GPULAB_API_URL", svc.api)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", svc.create_user("alice"))
        monkeypatch.setenv("JUPYTERHUB_USER", "alice")
        magic = VectorsMagics(shell=InteractiveShell.instance())

        def said(line: str) -> str:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                magic.vectors(line)
            return out.getvalue().splitlines()[0]

        cases = [
            ("create docs", "make it with %vectors create NAME --dim N (or --embed ENDPOINT)"),
            ("create docs --dim 0", "--dim must be a whole number from 1 to"),
            ("create docs --dim many", "--dim must be a whole number, not 'many'"),
            ("create docs --dims 8", "unknown option --dims; create takes --dim, --embed"),
            ("create docs --dim", "--dim needs a value"),
            ("create docs --dim 8", "alice/docs: 8-d, cosine"),
            ("search docs hello -k 0", "-k must be a whole number from 1 to 1000, not 0"),
            (
                "search docs hello",
                "search it with vector= in Python, or make one with "
                "%vectors create NAME --embed ENDPOINT",
            ),
            ("count nothing", "%vectors create NAME --dim N"),
        ]
        for line, message in cases:
            got = await asyncio.to_thread(said, line)
            assert message in got, (line, got)
            assert "dim=" not in got and "embed=" not in got and "k=" not in got, (line, got)


def test_the_client_imports_no_framework_until_its_store_is_used():
    code = (
        "import sys, gpulab.client, gpulab.client.collections, gpulab.magics.vectors\n"
        "from gpulab.client import Collection, chunk_text\n"
        "assert not {'langchain_core', 'llama_index'} & {m.split('.')[0] for m in sys.modules}"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
