"""A deterministic local embedding for the framework tests (no model weights here):
each word hashed into one of DIM buckets, the counts scaled to unit length, so texts
that share words are near. As LangChain ``Embeddings`` and a LlamaIndex embed model.

Standard library plus the two frameworks; its source is also sent to a kernel
(``Path(__file__).read_text()``), so it imports nothing from the tests."""

import hashlib
import math
import re

from langchain_core.embeddings import Embeddings
from llama_index.core.embeddings import BaseEmbedding

DIM = 64

CORPUS = [
    ("tarfile", "tarfile reads and writes tar archives, gzip or bz2 compressed tar files"),
    ("zipfile", "zipfile reads and writes zip archives"),
    ("json", "json encodes and decodes json documents"),
    ("sqlite3", "sqlite3 is the interface to sqlite databases, sql queries"),
    ("socket", "socket is the low level networking interface, sockets and addresses"),
    ("csv", "csv reads and writes comma separated values files"),
]
QUERY = "open a compressed tar archive"


def embed_words(text: str) -> list[float]:
    v = [0.0] * DIM
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        v[int(hashlib.sha256(word.encode()).hexdigest(), 16) % DIM] += 1.0
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


class WordEmbeddings(Embeddings):
    def embed_documents(self, texts):
        return [embed_words(t) for t in texts]

    def embed_query(self, text):
        return embed_words(text)


class WordEmbedding(BaseEmbedding):
    def _get_text_embedding(self, text):
        return embed_words(text)

    def _get_query_embedding(self, query):
        return embed_words(query)

    async def _aget_query_embedding(self, query):
        return embed_words(query)
