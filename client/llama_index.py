"""A LlamaIndex vector store over a gpulab collection.

    from llama_index.core import VectorStoreIndex
    from gpulab.client.llama_index import GpulabVectorStore
    store = GpulabVectorStore("docs")                   # or "alice/docs", a Collection
    index = VectorStoreIndex.from_vector_store(store, embed_model=embed_model)
    index.as_query_engine(similarity_top_k=3).query("a question")
    GpulabEmbedding("minilm")      # an embedding endpoint as LlamaIndex's embed model

Nodes go in with their embeddings and texts (a hit returns its node's text); a node
without an embedding is embedded by the collection's endpoint, where it has one. A
query with no embedding (``query_str`` alone) is embedded by that endpoint too: a
store over such a collection tells LlamaIndex so (``is_embedding_query`` is false),
so no local embedding model is needed to query it. Metadata filters become gpulab's
filter grammar (``==, !=, <, <=, >, >=, in, nin, contains, any, all, text_match``,
and/or/not, nested); ``delete(ref_doc_id)`` removes every node of that document.

This module imports ``llama_index.core``; ``gpulab.client`` itself does not need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)

from . import filter_text
from .collections import Collection
from .endpoint import Endpoint

#: The metadata key that names a node's document (``delete(ref_doc_id)`` finds them by it).
REF_DOC_KEY = "ref_doc_id"

COMPARED = {
    FilterOperator.EQ: "==",
    FilterOperator.NE: "!=",
    FilterOperator.GT: ">",
    FilterOperator.GTE: ">=",
    FilterOperator.LT: "<",
    FilterOperator.LTE: "<=",
}
CONTAINS = {
    FilterOperator.CONTAINS: "json_contains",
    FilterOperator.ANY: "json_contains_any",
    FilterOperator.ALL: "json_contains_all",
}


class GpulabVectorStore(BasePydanticVectorStore):
    stores_text: bool = True
    flat_metadata: bool = False
    _collection: Collection = PrivateAttr()

    def __init__(self, collection: Collection | str, client=None, **kwargs: Any):
        """``collection``: a :class:`Collection` or its name (``docs``, ``alice/docs``)."""
        if isinstance(collection, str):
            collection = Collection(collection, client=client)
        super().__init__(is_embedding_query=collection.embed is None, **kwargs)
        self._collection = collection

    @classmethod
    def class_name(cls) -> str:
        return "GpulabVectorStore"

    @property
    def client(self) -> Collection:
        return self._collection

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        if not nodes:
            return []
        texts = [n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        metadata = []
        for n in nodes:
            m = dict(n.metadata)
            if n.ref_doc_id is not None:
                m[REF_DOC_KEY] = n.ref_doc_id
            metadata.append(m)
        ids = [n.node_id for n in nodes]
        embedded = [n.embedding is not None for n in nodes]
        if all(embedded):
            vectors = [n.get_embedding() for n in nodes]
            return self._collection.insert(vectors=vectors, texts=texts, metadata=metadata, ids=ids)
        if not any(embedded) and self._collection.embed is not None:
            return self._collection.insert(texts=texts, metadata=metadata, ids=ids)
        raise ValueError(
            f"{self._where()}: every node needs an embedding"
            + ("" if self._collection.embed is None else " (or none: the endpoint embeds)")
        )

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        expression = f"{filter_text.field(REF_DOC_KEY)} == {filter_text.literal(ref_doc_id)}"
        self._collection.delete(filter=expression)

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        if query.mode != VectorStoreQueryMode.DEFAULT:
            raise ValueError(f"{self._where()}: query mode {query.mode.value!r}; use default")
        expression = filter_text.both(
            to_expression(query.filters) if query.filters else "",
            f"{filter_text.field(REF_DOC_KEY)} in {filter_text.listing(query.doc_ids)}"
            if query.doc_ids
            else "",
            f"id in {filter_text.listing(query.node_ids)}" if query.node_ids else "",
        )
        k = query.similarity_top_k
        search = {"k": k, "filter": expression or None}
        if query.query_embedding is not None:
            hits = self._collection.search(vector=query.query_embedding, **search)
        elif query.query_str and self._collection.embed is not None:
            hits = self._collection.search(text=query.query_str, **search)
        else:
            raise ValueError(
                f"{self._where()} names no embedding endpoint: give the query an "
                "embedding (an embed_model on the index)"
            )
        nodes = []
        for h in hits:
            metadata = dict(h.metadata)
            ref = metadata.pop(REF_DOC_KEY, None)
            node = TextNode(id_=h.id, text=h.text or "", metadata=metadata)
            if ref is not None:
                node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=str(ref))
            nodes.append(node)
        return VectorStoreQueryResult(
            nodes=nodes, similarities=[h.score for h in hits], ids=[h.id for h in hits]
        )

    def _where(self) -> str:
        return f"{self._collection.owner}/{self._collection.name}"


class GpulabEmbedding(BaseEmbedding):
    """A gpulab embedding endpoint (``"minilm"``, ``"alice/minilm"``) as a LlamaIndex
    embed model: documents put in an index are embedded where the endpoint runs."""

    _endpoint: Endpoint = PrivateAttr()

    def __init__(self, endpoint: str, client=None, **kwargs: Any):
        super().__init__(model_name=endpoint, **kwargs)
        self._endpoint = Endpoint(endpoint, client=client)

    @classmethod
    def class_name(cls) -> str:
        return "GpulabEmbedding"

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._endpoint.embed(list(texts)).tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embeddings([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def to_expression(filters: MetadataFilters) -> str:
    """LlamaIndex's metadata filters as gpulab's filter grammar."""
    parts = [
        to_expression(f) if isinstance(f, MetadataFilters) else _condition(f)
        for f in filters.filters
    ]
    parts = [p for p in parts if p]
    if not parts:
        return ""
    if filters.condition == FilterCondition.NOT:
        return "not (" + " or ".join(f"({p})" for p in parts) + ")"
    joiner = " or " if filters.condition == FilterCondition.OR else " and "
    return joiner.join(f"({p})" for p in parts) if len(parts) > 1 else parts[0]


def _condition(f: MetadataFilter) -> str:
    key = filter_text.field(f.key)
    op = f.operator
    if op in COMPARED:
        return f"{key} {COMPARED[op]} {filter_text.literal(f.value)}"
    if op == FilterOperator.IN:
        return f"{key} in {filter_text.listing(f.value)}"
    if op == FilterOperator.NIN:
        return f"{key} not in {filter_text.listing(f.value)}"
    if op == FilterOperator.CONTAINS:
        return f"json_contains({key}, {filter_text.literal(f.value)})"
    if op in CONTAINS:
        return f"{CONTAINS[op]}({key}, {filter_text.listing(f.value)})"
    if op == FilterOperator.TEXT_MATCH:
        if not isinstance(f.value, str) or "%" in f.value or "_" in f.value:
            raise ValueError(
                f"filter {f.key!r}: text_match takes a string without % or _ (gpulab's "
                "like cannot escape them); match such a value with eq"
            )
        return f"{key} like {filter_text.literal('%' + f.value + '%')}"
    supported = ", ".join(
        o.value
        for o in (
            *COMPARED,
            FilterOperator.IN,
            FilterOperator.NIN,
            *CONTAINS,
            FilterOperator.TEXT_MATCH,
        )
    )
    raise ValueError(f"filter {f.key!r}: operator {op.value!r} is not supported; use {supported}")
