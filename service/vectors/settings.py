"""The site's settings for vector collections (``c.VectorSettings.<name>``), read by
:class:`~gpulab.service.vectors.manager.CollectionManager` and the collections routes."""

from __future__ import annotations

from traitlets import Float, Int, TraitError, Unicode, validate
from traitlets.config import Configurable

from ..setting_checks import positive, setting_name, zero_or_more


class VectorSettings(Configurable):
    vector_engine_uri = Unicode(
        "",
        help="""The Milvus that holds vector collections. Empty: the embedded engine
        (FAISS HNSW behind gpulab's write-ahead log), run by the service as a process of
        its own (account `gpulab_vectors` when run as root) with its data in
        `<data-dir>/vectors/faiss`; its first start copies in what an older gpulab kept
        in Milvus Lite. Else a Milvus cluster's address (the chart's `vectors.milvus.uri`).

        c.VectorSettings.vector_engine_uri = "http://milvus.gpulab.svc:19530"
        """,
    ).tag(config=True)

    vector_engine_token = Unicode(
        "",
        help="""The token for vector_engine_uri (Milvus `user:password` or an API key);
        never shown to users or logged.

        c.VectorSettings.vector_engine_token = "root:Milvus"
        """,
    ).tag(config=True)

    collection_max_rows = Int(
        1000,
        help="""The most rows (vectors or texts) one insert, upsert, delete or search may
        carry; more is refused with 413 (send them in batches).

        c.VectorSettings.collection_max_rows = 1000
        """,
    ).tag(config=True)

    max_rows_per_user = Int(
        5_000_000,
        help="""The most rows one user's collections hold together (rows written into a
        collection shared with you count as its owner's). The embedded engine keeps
        every row in memory (a 384-d vector and its metadata: about 2 KiB), so one
        user's rows must not fill the host; a write past it is refused with 403.

        c.VectorSettings.max_rows_per_user = 20_000_000
        """,
    ).tag(config=True)

    max_mib_per_user = Int(
        8192,
        help="""The most memory (MiB) one user's collections may take in the embedded
        engine together, counted as each row's vector (4 bytes a value), its metadata's
        JSON and 64 bytes per key or list item of it (what the engine holds it as: many
        small keys take far more memory than their JSON). Rows written into a collection
        shared with you count as its owner's. A write past it is refused with 403,
        naming it; max_rows_per_user holds as well. 8192 MiB holds 5,000,000 384-d rows
        with a short field or two each. A Milvus cluster (vector_engine_uri) keeps its own
        quotas: this applies to the embedded engine.

        c.VectorSettings.max_mib_per_user = 16384
        """,
    ).tag(config=True)

    collection_max_dim = Int(
        4096,
        help="""The largest vector dimension a collection may have.

        c.VectorSettings.collection_max_dim = 4096
        """,
    ).tag(config=True)

    max_user_collections = Int(
        50,
        help="""How many collections one user may have.

        c.VectorSettings.max_user_collections = 50
        """,
    ).tag(config=True)

    collection_body_limit_mib = Int(
        64,
        help="""The largest body (MiB) an insert, upsert or search takes (1,000 vectors
        of 4,096 floats are about 40 MiB of JSON).

        c.VectorSettings.collection_body_limit_mib = 64
        """,
    ).tag(config=True)

    collection_max_queries = Int(
        100,
        help="""The most query vectors (or texts) one search may carry; more is refused
        with 400 (send several searches).

        c.VectorSettings.collection_max_queries = 100
        """,
    ).tag(config=True)

    collection_max_hits = Int(
        10_000,
        help="""The most hits one search may ask for: its query vectors times k. A
        search's work grows with both (1,000 queries of k=1,000 held the embedded engine
        21 s for everyone); more is refused with 400.

        c.VectorSettings.collection_max_hits = 10000
        """,
    ).tag(config=True)

    vector_call_timeout = Float(
        30.0,
        help="""Seconds one call to the vector engine (a search, a write, a count) may
        take. A call past it is abandoned and answered 504; if the embedded engine then
        does not answer at all (a call holds it), it is restarted: it replays its log,
        so no acknowledged row is lost.

        c.VectorSettings.vector_call_timeout = 30
        """,
    ).tag(config=True)

    collection_search_ef = Int(
        128,
        help="""How widely the embedded engine's HNSW index searches (FAISS efSearch;
        at least 2k). Wider finds more of the true nearest rows and costs more per
        search. On clustered 384-d vectors shaped like text embeddings
        (benchmarks/vector_search.py), recall@10 at 64 / 128 / 256: 0.999 / 1.000 /
        1.000 at 100,000 rows, 0.914 / 0.977 / 0.995 at 1,000,000 (FAISS on a graph
        built with efConstruction 128, as the engine builds it). 128 rather than
        FAISS's 64: through the REST path a search's time is mostly not the index's
        (p50 2.1 ms at 64, 2.2 ms at 256, 1,000,000 rows). At most 4096.

        c.VectorSettings.collection_search_ef = 128
        """,
    ).tag(config=True)

    @validate("collection_search_ef")
    def _search_ef(self, proposal):
        if not 1 <= proposal.value <= 4096:
            raise TraitError(f"{setting_name(proposal)} must be 1 to 4096, got {proposal.value}")
        return proposal.value

    @validate(
        "collection_max_rows",
        "collection_max_dim",
        "collection_body_limit_mib",
        "collection_max_queries",
        "collection_max_hits",
        "max_rows_per_user",
        "max_mib_per_user",
        "vector_call_timeout",
    )
    def _positive(self, proposal):
        return positive(proposal)

    @validate("max_user_collections")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "no collections")
