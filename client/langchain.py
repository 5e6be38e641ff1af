"""A LangChain vector store over a gpulab collection.

    from gpulab.client.langchain import GpulabVectorStore
    store = GpulabVectorStore("docs")                    # a collection with embed=: the
                                                         # service embeds, no model here
    store = GpulabVectorStore("notes", embedding=emb)    # vectors alone: emb embeds here
    store.add_texts(["...", ...], metadatas=[{...}, ...])
    store.similarity_search("a question", k=4, filter={"lang": "en"})
    retriever = store.as_retriever(search_kwargs={"k": 3})
    store = GpulabVectorStore.from_texts(texts, emb, collection_name="notes")
    emb = GpulabEmbeddings("minilm")                     # an endpoint as Embeddings

A collection made with an embedding endpoint (``Collection("docs", embed="minilm")``)
embeds texts and queries on the service, through that endpoint (as the caller: one
shared with you needs its endpoint shared too). Any other collection needs a LangChain
``Embeddings`` (``embedding=``); the texts are kept beside its vectors either way, so
every hit comes back as a ``Document`` with its ``page_content``. ``filter`` is what
:meth:`Collection.search` takes: ``{"lang": "en"}`` or an expression
(``'metadata["year"] > 2020'``). Scores: the collection's (cosine: higher is closer).

This module imports ``langchain_core``; ``gpulab.client`` itself does not need it.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from .collections import Collection, Hit
from .endpoint import Endpoint


class GpulabEmbeddings(Embeddings):
    """A gpulab embedding endpoint (``"minilm"``, ``"alice/minilm"``) as LangChain
    ``Embeddings``: the model runs where the endpoint runs, not in this kernel."""

    def __init__(self, endpoint: str, client=None):
        self.endpoint = Endpoint(endpoint, client=client)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.endpoint.embed(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class GpulabVectorStore(VectorStore):
    def __init__(
        self,
        collection: Collection | str,
        embedding: Embeddings | None = None,
        *,
        client=None,
    ):
        """``collection``: a :class:`Collection` or its name (``docs``, ``alice/docs``)."""
        if isinstance(collection, str):
            collection = Collection(collection, client=client)
        self.collection = collection
        where = f"{collection.owner}/{collection.name}"
        if collection.embed is None and embedding is None:
            raise ValueError(
                f"{where} names no embedding endpoint: give embedding= (a LangChain "
                "Embeddings) to embed texts and queries here"
            )
        # The collection's own endpoint wins: vectors of another model would not match.
        self._embedding = None if collection.embed else embedding

    @property
    def embeddings(self) -> Embeddings | None:
        """The caller's embeddings; None where the collection's endpoint embeds."""
        return self._embedding

    # -- writing ---------------------------------------------------------------------------
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        if ids is not None:  # LangChain passes documents' ids, some of which may be None
            ids = [i if i is not None else uuid.uuid4().hex for i in ids]
        metadata = [dict(m or {}) for m in metadatas] if metadatas is not None else None
        if self._embedding is None:
            return self.collection.insert(texts=texts, metadata=metadata, ids=ids)
        vectors = self._embedding.embed_documents(texts)
        return self.collection.insert(vectors=vectors, texts=texts, metadata=metadata, ids=ids)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        if not ids:
            return None
        self.collection.delete(ids=ids)
        return True

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        collection_name: str = "langchain",
        embed: str | None = None,
        client=None,
        **kwargs: Any,
    ) -> GpulabVectorStore:
        """Texts into the collection ``collection_name`` (yours; made if it does not
        exist): with ``embed="minilm"`` (an endpoint) it embeds them on the service,
        else ``embedding`` does here."""
        if embed is not None:
            collection = Collection(collection_name, embed=embed, client=client)
        else:
            if embedding is None:
                raise ValueError("give embedding= (a LangChain Embeddings) or embed=ENDPOINT")
            dim = len(embedding.embed_query("dimension probe"))
            collection = Collection(collection_name, dim=dim, client=client)
        store = cls(collection, embedding)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    # -- searching -------------------------------------------------------------------------
    def similarity_search(
        self, query: str, k: int = 4, filter=None, **kwargs: Any
    ) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter=None, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        if self._embedding is None:
            hits = self.collection.search(text=query, k=k, filter=filter)
        else:
            vector = self._embedding.embed_query(query)
            hits = self.collection.search(vector=vector, k=k, filter=filter)
        return [(_document(h), h.score) for h in hits]

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter=None, **kwargs: Any
    ) -> list[Document]:
        hits = self.collection.search(vector=embedding, k=k, filter=filter)
        return [_document(h) for h in hits]

    def _select_relevance_score_fn(self):
        """Scores as 0-1 relevance (higher is closer), for LangChain's thresholds."""
        metric = self.collection.info.get("metric", "cosine")
        if metric == "l2":  # the squared distance of unit vectors: 0 to 4
            return lambda score: max(0.0, 1.0 - math.sqrt(max(score, 0.0)) / 2)
        return lambda score: min(1.0, max(0.0, (1.0 + score) / 2))


def _document(hit: Hit) -> Document:
    return Document(page_content=hit.text or "", metadata=dict(hit.metadata), id=hit.id)
