"""``NodeSampler``: one call, one complete sample of this node.

The agent calls it at its interval; in the embedded default the service calls
it itself instead of running an agent. A source that fails is recorded under
``missing`` and never costs the others their readings.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from .cache_sampler import CacheSampler
from .nic import NicSampler
from .nvml import NvmlSampler
from .rdma import RdmaSampler
from .sample import SourceMissing, empty_sample

log = logging.getLogger(__name__)

FIELD_OF_SOURCE = {"gpu": "gpus", "nic": "nics", "rdma": "rdma", "cache": "cache"}


class NodeSampler:
    """Samples GPUs, NICs, RDMA ports and the dataset cache of this node.

    ``samplers`` maps source names (``gpu``, ``nic``, ``rdma``, ``cache``) to
    objects with a ``sample()`` method; leave it out for the real ones.
    """

    def __init__(
        self,
        node: str | None = None,
        cache_dir: str | None = None,
        samplers: dict[str, Any] | None = None,
    ):
        self.node = node or socket.gethostname()
        self.samplers = (
            samplers
            if samplers is not None
            else {
                "gpu": NvmlSampler(),
                "nic": NicSampler(),
                "rdma": RdmaSampler(),
                "cache": CacheSampler(cache_dir),
            }
        )

    def sample(self) -> dict:
        sample = empty_sample(self.node)
        for source, sampler in self.samplers.items():
            try:
                sample[FIELD_OF_SOURCE[source]] = sampler.sample()
            except SourceMissing as missing:
                sample["missing"][source] = missing.reason
            except Exception as err:  # a sampler bug must not stop the agent
                log.exception("the %s sampler failed", source)
                sample["missing"][source] = f"sampler failed: {err!r}"
        return sample

    def close(self) -> None:
        for sampler in self.samplers.values():
            close = getattr(sampler, "close", None)
            if close is not None:
                close()
