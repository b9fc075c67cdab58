"""dedupsink: a deduplicating sink for Spark Structured Streaming.

Layers, each importing only those before it: ``options``/``errors`` -> ``engine`` (pure
classification) -> ``store`` (bucket store and cache, fsspec only) -> ``ports`` (Parquet, Delta
and Iceberg ports) -> ``sink`` (the Spark data source; below the CLI, the only pyspark import)
and, beside it, ``inspection`` (the operator's questions as typed answers, which the functions
here return) -> ``cli`` (parses and prints; starts Spark for ``dedupsink run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dedupsink.errors import DedupError, DedupOptionError, StoreCorruptError, StoreOwnershipError
from dedupsink.options import DedupOptions
from dedupsink.version import __version__ as __version__

if TYPE_CHECKING:
    import pyarrow as pa

    from dedupsink.inspection import LookupResult
    from dedupsink.inspection.page import ReportFile

__all__ = [
    "DedupDataSource",
    "DedupError",
    "DedupOptionError",
    "DedupOptions",
    "StoreCorruptError",
    "StoreOwnershipError",
    "history",
    "lookup",
    "partition_for_dedup",
    "release",
    "report",
]


def __getattr__(name: str) -> Any:
    # Imported lazily so that the engine and store stay usable without starting pyspark.
    if name == "DedupDataSource":
        from dedupsink.sink.datasource import DedupDataSource

        return DedupDataSource
    if name == "partition_for_dedup":
        from dedupsink.sink.partitioning import partition_for_dedup

        return partition_for_dedup
    raise AttributeError(name)


def history(
    path: str, storage_options: dict[str, Any] | None = None, store_path: str | None = None
) -> pa.Table:
    """The store's history under output ``path`` (or a store URL): one row per committed
    window, oldest first, as ``spark.read.format("dedup").load(path)`` and ``dedupsink
    history`` show it (columns: ``dedupsink.store.history.SCHEMA``)."""
    from dedupsink.store.history import load_history

    return load_history(path, storage_options, store_path)


def lookup(
    path: str,
    key: dict[str, Any],
    storage_options: dict[str, Any] | None = None,
    store_path: str | None = None,
    expiry: Any = None,
) -> LookupResult:
    """Whether the store under output ``path`` (or a store URL) remembers a key, as ``dedupsink
    lookup`` says it: ``key`` maps each key column to its value (ISO text or a Python value of
    the column's type). The answer is a frozen ``LookupResult`` (``to_dict()`` gives what
    ``--json`` prints): ``remembered``; when remembered,
    ``window`` (the version that stored it), ``query_id``, ``batch_id``, ``committed_at``,
    ``stamp`` and ``forgotten_when``; else ``reason`` (and ``stamp`` for a key expired and
    awaiting fold). ``expiry``: the key's expiry value, which
    narrows the search to one time bucket (tupleTime, ordered)."""
    from dedupsink.inspection import locate
    from dedupsink.inspection import lookup as lookup_key

    location = locate(path, store_path, storage_options)
    return lookup_key(location, key, expiry)


def report(
    path: str,
    output: str,
    storage_options: dict[str, Any] | None = None,
    store_path: str | None = None,
    last: int | None = None,
) -> ReportFile:
    """Write the history of the store under output ``path`` (or a store URL) as charts in one
    self-contained HTML page, the local file ``output``, as ``dedupsink report`` does: the health
    verdict, rows per port, duplicate and expired shares, wall and task time, remembered keys
    and expired keys awaiting fold, store bytes, latest and expiry points, one column a window
    (groups of windows past 500). ``last``: only the last windows. Returns
    a frozen ``ReportFile`` (``path``, ``store_url``, ``windows``, ``columns``, ``nbytes``)."""
    from dedupsink.inspection import locate
    from dedupsink.inspection.page import write_report

    return write_report(locate(path, store_path, storage_options), output, last)


def release(
    path: str, query_id: str | None = None, storage_options: dict[str, Any] | None = None
) -> None:
    """Give up the store under output ``path`` (or a store URL) so another query can take it at
    once, without waiting for the owner's lease (``ownerTimeout``) to lapse."""
    from dedupsink.store.ownership import release as release_store
    from dedupsink.store.store import BucketStore, find_store

    found = find_store(path, storage_options)
    if found is not None:
        release_store(BucketStore(found[0], storage_options), query_id)
