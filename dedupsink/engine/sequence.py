"""Sequence dedup's column work: sequence ids as int64, producers grouped, (producer, id) keys.

In sequence dedup (``sequenceKey``, Pulsar's design) the store remembers one number per
producer, its highest sequence id, instead of every key (docs/SEMANTICS.md, "Sequence dedup").
The classifier (``classify.WindowClassifier``) asks this module for each row's sequence id, for
the producers of a batch with each row's producer, and for the fingerprint of each row's
(producer, sequence id), which finds the copies of one id inside a window as a key mode finds
copies of a key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# pyarrow.compute (tens of ms to import) is imported by the functions that use it: Spark's
# planner and commit processes import this module for a query's first batch and need none.
from dedupsink.engine.fingerprint import FINALIZER_MULTIPLIERS, Fingerprints, fmix64

# The stored highest id of a producer not seen yet: below every sequence id.
NO_SEQUENCE = np.iinfo(np.int64).min
# Multipliers that spread a sequence id over both words of a producer's fingerprint: ids 1
# and 2 of one producer share no bits of their keys.
_SPREAD_1, _SPREAD_2 = FINALIZER_MULTIPLIERS


@dataclass(frozen=True)
class SequenceIds:
    """Each row's sequence id as int64; ``missing`` rows are null, ``unreadable`` rows hold a
    value that is not a whole number within int64 (a fraction, NaN, an overflow)."""

    values: np.ndarray
    missing: np.ndarray
    unreadable: np.ndarray


def sequence_ids(array: pa.Array) -> SequenceIds:
    """Sequence ids of an integer, floating or decimal column: a value is an id if casting it
    to int64 and back gives it again (and, unsigned, it stays non-negative)."""
    import pyarrow.compute as pc

    missing = array.is_null().to_numpy(zero_copy_only=False)
    ints = pc.cast(array, pa.int64(), safe=False)
    exact = pc.equal(pc.cast(ints, array.type, safe=False), array)
    if pa.types.is_unsigned_integer(array.type):
        exact = pc.and_(exact, pc.greater_equal(ints, 0))
    unreadable = ~missing & ~exact.fill_null(False).to_numpy(zero_copy_only=False)
    values = np.asarray(ints.fill_null(0), dtype=np.int64)
    return SequenceIds(values, missing, unreadable)


def with_sequence(producers: Fingerprints, ids: np.ndarray) -> Fingerprints:
    """The fingerprint of each (producer, sequence id): the producer's, mixed with the id."""
    spread = ids.view(np.uint64)
    h1 = fmix64(producers.h1 ^ (spread * _SPREAD_1))
    h2 = fmix64(producers.h2 + (spread * _SPREAD_2))
    return Fingerprints(h1, h2)


@dataclass(frozen=True)
class Producers:
    """The distinct producers of some rows (sorted by ``h1``), and each row's producer."""

    fingerprints: Fingerprints
    of_row: np.ndarray  # row -> index into ``fingerprints``


def group_producers(fps: Fingerprints) -> Producers:
    """Group rows by producer fingerprint."""
    order, starts = _sorted_groups(fps)
    of_row = np.empty(len(order), dtype=np.int64)
    of_row[order] = np.cumsum(starts) - 1
    return Producers(fps.take(order[starts]), of_row)


def highest_per_producer(fps: Fingerprints, ids: np.ndarray) -> tuple[Fingerprints, np.ndarray]:
    """Each distinct producer of ``fps`` with the highest of its rows' ``ids``."""
    if len(fps) == 0:
        return fps, np.empty(0, dtype=np.int64)
    order, starts = _sorted_groups(fps)
    highest = np.maximum.reduceat(ids[order], np.flatnonzero(starts))
    return fps.take(order[starts]), highest


def _sorted_groups(fps: Fingerprints) -> tuple[np.ndarray, np.ndarray]:
    """The rows in fingerprint order, and where each run of one fingerprint starts in it."""
    # Sorting one word is several times cheaper than sorting two; only a 64-bit collision
    # (two producers sharing h1 inside a run) needs the sort of both.
    order = np.argsort(fps.h1, kind="stable")
    h1, h2 = fps.h1[order], fps.h2[order]
    same_h1 = h1[1:] == h1[:-1]
    if (same_h1 & (h2[1:] != h2[:-1])).any():
        order = np.lexsort((fps.h2, fps.h1))
        h1, h2 = fps.h1[order], fps.h2[order]
        same_h1 = (h1[1:] == h1[:-1]) & (h2[1:] == h2[:-1])
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = ~same_h1
    return order, starts
