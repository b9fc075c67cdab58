"""Where a key lives: its fingerprint, its key shard and its bucket.

A store created with ``key_hash="spark"`` puts Spark's own ``hash(keys)`` (Murmur3, seed 42:
what ``HashPartitioning`` partitions by) in the high 32 bits of each fingerprint's first word.
A key's shard is that hash modulo the store's shard count, the very value
``dedupsink.partition_for_dedup`` partitions the input by, so a task of partition p of N sees
only the keys of the shards ``s % N == p`` and loads only their buckets. Every reader of the
store (tasks, commit, compaction, ``lookup``) finds a key's shard in its fingerprint alone.

Placement decides only which bucket holds a key, never whether it is found: any input,
partitioned this way or not, is classified the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from dedupsink.engine.fingerprint import Fingerprints, fingerprint
from dedupsink.engine.settings import Settings
from dedupsink.engine.sparkhash import spark_hash

_LOW_WORD = np.uint64(0xFFFF_FFFF)
_HIGH_SHIFT = np.uint64(32)


def key_fingerprints(settings: Settings, columns: Sequence[pa.Array]) -> Fingerprints:
    """The fingerprints of these key columns as the store places them.

    With Spark's hash in the high half of ``h1`` a fingerprint keeps 96 bits of its own hash
    (a false duplicate among a billion keys: about one chance in 10^11)."""
    fps = fingerprint(columns)
    if settings.key_hash != "spark" or len(fps) == 0:
        return fps
    spark = spark_hash(columns).view(np.uint32).astype(np.uint64)
    return Fingerprints((fps.h1 & _LOW_WORD) | (spark << _HIGH_SHIFT), fps.h2)


def key_shards(settings: Settings, fps: Fingerprints) -> np.ndarray:
    """Each key's shard, ``0 <= shard < settings.shard_count``: Spark's ``pmod(hash(keys), S)``
    for a store placed by Spark's hash, the fingerprint modulo S otherwise."""
    count = settings.shard_count
    if settings.key_hash == "spark":
        spark = (fps.h1 >> _HIGH_SHIFT).astype(np.uint32).view(np.int32).astype(np.int64)
        return np.mod(spark, count)
    return (fps.h1 % np.uint64(count)).astype(np.int64)


def bucket_of(settings: Settings, fps: Fingerprints, stamps: np.ndarray | None) -> np.ndarray:
    """Each key's bucket: its key shard of its time bucket in the time-bucket modes (the time
    bucket's index times the shard count, plus the shard), its shard otherwise."""
    shards = key_shards(settings, fps)
    if settings.buckets_by_time and stamps is not None and settings.span is not None:
        times = np.floor_divide(stamps, settings.span).astype(np.int64)
        return np.mod(times, settings.bucket_count) * settings.key_shards + shards
    return shards


def shard_of_bucket(settings: Settings, bucket: int) -> int:
    """The key shard a bucket holds (``bucket_of`` read backwards)."""
    if settings.buckets_by_time:
        return bucket % settings.key_shards
    return bucket
