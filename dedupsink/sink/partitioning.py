"""The input partitioned by the dedup keys, so that each task holds a share of the state.

``partition_for_dedup(df, options)`` is the one line before ``writeStream``: it repartitions
the input by the key shard the store places each key in (``engine/placement.py``), so that
partition p of N receives the keys of the shards ``s % N == p`` and its task loads only their
buckets, about ``numBuckets / N`` of them. Spark's Python data source API (4.3) has no way for
a writer to require a distribution of its input, so the sink asks for none; ``dedupsink run``
applies this function itself.

How the shard reaches Spark's partitioner: Spark partitions by ``pmod(hash(e), N)`` of the
repartition expression ``e``. The store's shard of a row is ``pmod(hash(keys), S)``, computed
by Spark itself (``F.hash``), and ``e`` maps a shard's residue ``r = shard % N`` to an integer
whose own hash is ``r`` modulo N (found once, on the driver): partition ``r`` then holds
exactly those shards. Partitioning never changes an answer, only which task loads what.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dedupsink.engine.settings import Settings, resolve
from dedupsink.engine.sparkhash import hash_int
from dedupsink.errors import DedupError, DedupOptionError
from dedupsink.options import DedupOptions
from dedupsink.sink.plan import with_absolute_paths
from dedupsink.store.store import BucketStore

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger("dedupsink")

PARTITIONS = "partitions"


def partition_for_dedup(
    df: DataFrame, options: Mapping[str, str], partitions: int | None = None
) -> DataFrame:
    """``df`` repartitioned by the dedup keys as the store of ``options`` (the sink's own
    options: ``path``, ``keys``, ...) places them. ``partitions``: how many (default: Spark's
    default parallelism, a partition a task slot, at most the number of key shards, as more
    would leave tasks without keys). Bad options raise here, as the sink would."""
    from pyspark.sql import functions as F

    from dedupsink.sink.compat import arrow_schema

    parsed = with_absolute_paths(DedupOptions.parse(options))
    # The conversion the data source makes (timestamps with a zone are UTC in Arrow).
    schema = arrow_schema(df.schema)
    settings = _store_layout(resolve(parsed, schema), parsed)
    keys = [F.col(name) for name in settings.keys]
    if partitions is not None and partitions < 1:
        raise DedupOptionError(PARTITIONS, str(partitions), "a positive number of partitions")
    count = partitions or _default_partitions(df, settings.shard_count)
    if settings.key_hash != "spark":
        # A store placing keys by fingerprint alone: keys grouped, buckets not divided.
        log.info("dedup partitioning by the keys only: the store places keys by fingerprint")
        return df.repartition(count, *keys)
    return df.repartition(count, shard_partition(keys, settings.shard_count, count))


def shard_partition(keys: list[Column], shards: int, partitions: int) -> Column:
    """The expression whose Spark hash puts a row in partition ``shard % partitions``."""
    from pyspark.sql import functions as F

    shard = F.pmod(F.hash(*keys), F.lit(shards))
    residue = F.pmod(shard, F.lit(partitions))
    targets = F.array(*(F.lit(value) for value in residue_targets(partitions)))
    return F.element_at(targets, residue + 1)


def residue_targets(partitions: int) -> list[int]:
    """For each residue r < ``partitions``, the smallest integer whose Spark hash is r modulo
    ``partitions``."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(hash_int(value) % partitions, value)
        value += 1
    return [found[r] for r in range(partitions)]


def _store_layout(settings: Settings, options: DedupOptions) -> Settings:
    """The placement of the store the options name, if it exists (it keeps the one it was
    created with), else a new store's."""
    try:
        manifest = BucketStore(
            options.store_path, options.storage_options, bounds=options.storage_bounds
        ).read()
    except (DedupError, OSError) as exc:
        log.info(
            "dedup partitioning for a new store: %s could not be read (%s)", options.store_path, exc
        )
        return settings
    return settings if manifest is None else settings.laid_out_as(manifest.settings)


def _default_partitions(df: DataFrame, shards: int) -> int:
    """A partition a task slot (Spark's default parallelism; a Spark Connect client, which
    sees no SparkContext, takes ``spark.sql.shuffle.partitions``), at most ``shards``."""
    from pyspark.sql.utils import is_remote

    session = df.sparkSession
    if is_remote():
        slots = int(session.conf.get("spark.sql.shuffle.partitions") or "200")
    else:
        slots = session.sparkContext.defaultParallelism
    return max(1, min(slots, shards))
