"""dedupsink: a deduplicating sink for Spark Structured Streaming.

Layers, each importing only those before it: ``options``/``errors`` -> ``engine`` (pure
classification) -> ``store`` (bucket store and cache, fsspec only) -> ``sink`` (the Spark data
source; the only pyspark import) -> ``cli``.
"""

from __future__ import annotations

from typing import Any

from dedupsink.errors import DedupError, DedupOptionError, StoreCorruptError, StoreOwnershipError
from dedupsink.options import DedupOptions

__all__ = [
    "DedupDataSource",
    "DedupError",
    "DedupOptionError",
    "DedupOptions",
    "StoreCorruptError",
    "StoreOwnershipError",
    "release",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported lazily so that the engine and store stay usable without starting pyspark.
    if name == "DedupDataSource":
        from dedupsink.sink.datasource import DedupDataSource

        return DedupDataSource
    raise AttributeError(name)


def release(path: str, query_id: str | None = None) -> None:
    """Release the owner lease of the store under output ``path`` (or a store URL)."""
    from dedupsink.sink.commit import release as release_store
    from dedupsink.store.store import BucketStore

    release_store(BucketStore(store_url(path)), query_id)


def store_url(path: str) -> str:
    """The store behind ``path``: the path itself if it holds a store, else ``<path>/_store``."""
    from dedupsink.options import STORE_DIRNAME_DEFAULT, join_url
    from dedupsink.store.store import LOG_DIR, BucketStore

    candidate = BucketStore(path)
    if candidate.fs.exists(candidate.path(LOG_DIR)):
        return candidate.url
    return join_url(path, STORE_DIRNAME_DEFAULT)
