"""The site's settings for vector collections (``c.GpuLabService.<name>``)."""

from __future__ import annotations

from traitlets import Int, Unicode
from traitlets.config import Configurable


class VectorSettings(Configurable):
    vector_engine_uri = Unicode(
        "",
        help="""The Milvus that holds vector collections. Empty: the embedded engine,
        Milvus Lite, run by the service as a process of its own (account
        `gpulab_vectors` when run as root) with its data in `<data-dir>/vectors`. Else a
        Milvus cluster's address (the chart's `vectors.milvus.uri`).

        c.GpuLabService.vector_engine_uri = "http://milvus.gpulab.svc:19530"
        """,
    ).tag(config=True)

    vector_engine_token = Unicode(
        "",
        help="""The token for vector_engine_uri (Milvus `user:password` or an API key);
        never shown to users or logged.

        c.GpuLabService.vector_engine_token = "root:Milvus"
        """,
    ).tag(config=True)

    collection_max_rows = Int(
        1000,
        help="""The most rows (vectors or texts) one insert, upsert, delete or search may
        carry; more is refused with 413 (send them in batches).

        c.GpuLabService.collection_max_rows = 1000
        """,
    ).tag(config=True)

    collection_max_dim = Int(
        4096,
        help="""The largest vector dimension a collection may have.

        c.GpuLabService.collection_max_dim = 4096
        """,
    ).tag(config=True)

    max_user_collections = Int(
        50,
        help="""How many collections one user may have.

        c.GpuLabService.max_user_collections = 50
        """,
    ).tag(config=True)

    collection_body_limit_mib = Int(
        64,
        help="""The largest body (MiB) an insert, upsert or search takes (1,000 vectors
        of 4,096 floats are about 40 MiB of JSON).

        c.GpuLabService.collection_body_limit_mib = 64
        """,
    ).tag(config=True)
