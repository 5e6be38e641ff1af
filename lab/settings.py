"""The server extension's settings (jupyter_server configuration, not the hub's)."""

from __future__ import annotations

from traitlets import Float, Int
from traitlets.config import Configurable


class GpuLabLab(Configurable):
    """How this single-user server talks to the gpulab service for the browser."""

    request_timeout = Float(
        30.0,
        config=True,
        help="""Seconds the proxy waits for the gpulab service before answering 504.

        Example: ``c.GpuLabLab.request_timeout = 10``
        """,
    )
    connect_timeout = Float(
        5.0,
        config=True,
        help="""Seconds to reach the gpulab service before answering 502.

        Example: ``c.GpuLabLab.connect_timeout = 2``
        """,
    )
    max_body_bytes = Int(
        1024 * 1024,
        config=True,
        help="""Largest request body the proxy passes on (413 above it).

        Example: ``c.GpuLabLab.max_body_bytes = 65536``
        """,
    )
    inventory_ttl = Float(
        60.0,
        config=True,
        help="""Seconds the slice handler keeps the GPU models it read from the service.

        Example: ``c.GpuLabLab.inventory_ttl = 300``
        """,
    )
