"""``CachedDataset``: a list of shards read through the node cache.

Torch-free on purpose: it is a plain sequence (``len``, ``ds[i]``, iteration)
of ``bytes``, which ``torch.utils.data.DataLoader`` accepts as a map-style
dataset and which decoders (tar, parquet, numpy) take as they are.

Iterating prefetches: while shard ``i`` is being consumed, shards ``i+1 …
i+prefetch`` are fetched into the cache on a thread pool, so in the first epoch
the consumer waits for the store's latency once instead of once per shard.
Random access (``ds[i]``) reads through the cache without prefetching.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from gpulab.training.lineage import dataset_name, note_read

from .patterns import expand
from .store import NodeCache

log = logging.getLogger(__name__)

MAX_PREFETCH_THREADS = 16
"""Beyond this, more threads only add index contention; shards still queue."""


class CachedDataset(Sequence):
    """Shards named by ``urls`` (a list, or one pattern: ``{000..099}``, ``*``).

    ``prefetch`` is how many shards ahead iteration fetches (0 turns it off);
    ``cache_dir`` and ``capacity_bytes`` default to ``$GPULAB_CACHE_DIR`` and
    ``$GPULAB_CACHE_CAPACITY_BYTES`` (see ``gpulab.cache.settings``). ``name``
    is what a model's lineage calls the dataset (default: the pattern, or what the
    URLs share); inside a gpulab job each shard read is noted for it
    (:mod:`gpulab.training.lineage`).
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        prefetch: int = 4,
        cache_dir: str | None = None,
        capacity_bytes: int | str | None = None,
        cache: NodeCache | None = None,
        name: str | None = None,
    ):
        pattern = urls if isinstance(urls, str) else None
        if isinstance(urls, str):
            urls = expand(urls)
        else:
            urls = list(urls)
            bad = [u for u in urls if not isinstance(u, str)]
            if bad:
                raise TypeError(f"shard URLs must be strings; got {bad[0]!r}")
        if not urls:
            raise ValueError(
                "no shards given; pass a list of URLs or a pattern "
                "such as 'https://host/train-{0000..0099}.tar'"
            )
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be a whole number >= 0, not {prefetch!r}")
        self.urls: list[str] = urls
        self.name = name or pattern or dataset_name(urls)
        self.prefetch = prefetch
        self._cache_args = (cache_dir, capacity_bytes)
        self._cache = cache

    @property
    def cache(self) -> NodeCache:
        # Made on first use so a dataset pickled into DataLoader workers opens
        # its own index connections there.
        if self._cache is None:
            self._cache = NodeCache(*self._cache_args)
        return self._cache

    def __getstate__(self):
        return {**self.__dict__, "_cache": None}

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> bytes:
        if not isinstance(i, int):
            raise TypeError(f"shard index must be an int, not {type(i).__name__}")
        return self._read(self.cache, self.urls[i])

    def _read(self, cache: NodeCache, url: str) -> bytes:
        data = cache.read(url)
        note_read(self.name, url, len(data))  # the job's lineage: what it trained on
        return data

    def __iter__(self) -> Iterator[bytes]:
        if self.prefetch == 0:
            for url in self.urls:
                yield self._read(self.cache, url)
            return
        cache = self.cache
        pool = ThreadPoolExecutor(
            min(self.prefetch, MAX_PREFETCH_THREADS), thread_name_prefix="gpulab-prefetch"
        )
        pending: dict[int, Future] = {}
        try:
            for i, url in enumerate(self.urls):
                for j in range(i + 1, min(i + 1 + self.prefetch, len(self.urls))):
                    if j not in pending:
                        pending[j] = pool.submit(self._prefetch, cache, self.urls[j])
                if i in pending:
                    wait([pending.pop(i)])
                yield self._read(cache, url)
        finally:
            # A consumer that stops early should not wait for shards it won't read.
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _prefetch(cache: NodeCache, url: str) -> None:
        try:
            cache.ensure(url)
        except Exception as err:  # the consumer's own read reports it properly
            log.debug("prefetch of %s failed: %r", url, err)

    def __repr__(self) -> str:
        return (
            f"CachedDataset({len(self.urls)} shards, prefetch={self.prefetch}, "
            f"cache={self.cache!r})"
        )
