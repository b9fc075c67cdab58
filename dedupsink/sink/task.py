"""The executor side of one window: ``run_task`` classifies one task's rows.

A task reads the store's latest version, classifies each Arrow record batch through this
process's bucket manager, writes the rows of each port to staged Parquet files, settles keys it
shares with other partitions (``settle``), writes the keys it found new (and partition 0's
folds, ``compaction``) as one window file, and returns a small ``TaskSummary`` for the commit.
Nothing it writes is visible until that commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from dedupsink.engine.classify import (
    PORTS,
    CommittedState,
    NewKeys,
    WindowClassifier,
    split,
    stamp_dtype,
)
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.sink.compaction import KeysContext, WrittenKeys, choose_folds, write_window_file
from dedupsink.sink.output import PortFile, PortWriters, staging_folder
from dedupsink.sink.plan import SinkPlan, TaskIdentity
from dedupsink.sink.settle import Settlement, StagedKeys, settle_in_task
from dedupsink.store.cache import CacheInfo, manager_for
from dedupsink.store.ownership import check_not_fenced
from dedupsink.store.records import WindowCounts
from dedupsink.store.store import check_settings

# Spark hands Arrow batches of 10,000 rows; classifying fewer, larger batches pays the
# per-bucket lookup overhead less often, at a bounded memory cost: a chunk ends at this many rows
# or bytes, whichever comes first (wide rows would otherwise make a chunk of a hundred MB).
COALESCE_ROWS = 131_072
COALESCE_BYTES = 16 << 20


@dataclass
class TaskSummary:
    """What one task reports to the commit: small, whatever the number of rows."""

    identity: TaskIdentity
    base_version: int
    store_id: str
    skipped: bool = False  # a re-run of a committed batch: nothing was written
    files: list[PortFile] = field(default_factory=list)
    settlement: Settlement = field(default_factory=Settlement)
    counts: WindowCounts = field(default_factory=WindowCounts)
    written: WrittenKeys | None = None
    max_stamp: float | None = None
    new_categories: list[str] = field(default_factory=list)
    cache: CacheInfo | None = None
    seconds: float = 0.0
    classify_seconds: float = 0.0

    @property
    def folder(self) -> str:
        """The window's staging folder (relative to the output root)."""
        identity = self.identity
        return staging_folder(self.base_version + 1, identity.query_id, identity.batch_id)


def coalesce(
    batches: Iterator[pa.RecordBatch], rows: int, nbytes: int = COALESCE_BYTES
) -> Iterator[pa.RecordBatch]:
    """Regroup record batches into batches of at least ``rows`` rows or ``nbytes`` bytes (the
    last may be smaller)."""
    pending: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if count >= rows or size >= nbytes:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, count, size = [], 0, 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def run_task(
    plan: SinkPlan, identity: TaskIdentity, batches: Iterator[pa.RecordBatch]
) -> TaskSummary:
    started = time.perf_counter()
    store, settings, options = plan.store, plan.settings, plan.options
    manifest = store.read() or store.open(settings)
    summary = TaskSummary(identity, manifest.version, manifest.store_id)
    if manifest.queries.get(identity.query_id, -1) >= identity.batch_id:
        summary.skipped = True  # a re-run of a committed batch: its outputs already exist
        return summary
    check_settings(manifest.settings, settings.identity(), store.url)
    check_not_fenced(manifest, plan.writer(identity.query_id, identity.run), store.url)
    manager = manager_for(
        store,
        manifest,
        options.max_cached_buckets,
        stamp_dtype(settings),
        options.max_cache_memory.nbytes,
    )
    state = CommittedState(manifest.latest, manifest.category_ordinals())
    classifier = WindowClassifier(settings, state, manager)
    output = plan.output
    writers = PortWriters(output, summary.folder, identity.partition, identity.attempt)
    counts = dict.fromkeys(PORTS, 0)
    # A chunk's unique rows are held until the next chunk comes: the last chunk's are written
    # once settled with the other partitions.
    held: pa.RecordBatch | None = None
    try:
        for batch in coalesce(batches, COALESCE_ROWS):
            tick = time.perf_counter()
            result = classifier.classify(batch)
            summary.classify_seconds += time.perf_counter() - tick
            if held is not None:
                writers.write("unique", held)
                counts["unique"] += held.num_rows
                held = None
            for port, rows in split(batch, result).items():
                if port == "unique":
                    held = rows
                    continue
                writers.write(port, rows)
                counts[port] += rows.num_rows
        new = classifier.new_keys()
        settled = settle_in_task(
            output,
            summary.folder,
            identity.partition,
            identity.attempt,
            StagedKeys(Fingerprints(new.h1, new.h2), new.stamps),
            held,
            writers,
            waited_since=started,
        )
        summary.settlement = settled.settlement
        # Rows yielded from earlier chunks were counted unique when written.
        yielded = settled.settlement.yielded
        counts["unique"] += (0 if held is None else held.num_rows) - yielded
        counts["duplicate"] += yielded
        new = _kept(new, settled.yielded)  # the keeping partition remembers the yielded keys
        summary.files = writers.close()
    except BaseException:
        writers.discard()
        raise
    summary.counts = WindowCounts(**counts)
    summary.max_stamp = classifier.max_stamp
    summary.new_categories = classifier.new_categories
    folds = choose_folds(manager, manifest, classifier, new, identity.partition)
    context = KeysContext.of(classifier)
    summary.written = write_window_file(store, manifest, context, new, identity.partition, folds)
    summary.cache = manager.cache.info()
    summary.seconds = time.perf_counter() - started
    return summary


def _kept(new: NewKeys, yielded: np.ndarray) -> NewKeys:
    if not yielded.any():
        return new
    kept = ~yielded
    stamps = None if new.stamps is None else new.stamps[kept]
    return NewKeys(new.h1[kept], new.h2[kept], new.buckets[kept], stamps)
