"""The executor side of one window: ``run_task`` classifies one task's rows.

A task reads the store's latest version, classifies each Arrow record batch through this
process's bucket manager, writes the rows of each port to staged Parquet files, settles keys it
shares with other partitions (``settle``), writes the keys it found new (and partition 0's
folds, ``compaction``) as one window file, and returns a small ``TaskSummary`` for the commit.
Nothing it writes is visible until that commit.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import pyarrow as pa

# pyarrow.compute (tens of ms to import) is imported by the functions that use it: Spark's
# planner and commit processes import this module for a query's first batch and need none.
from dedupsink.engine.classify import (
    PORTS,
    CommittedState,
    NewKeys,
    WindowClassifier,
    split,
    stamp_dtype,
)
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.settings import Rows
from dedupsink.ports.output import PortFile, PortWriters, staging_folder
from dedupsink.sink.plan import SinkPlan, TaskIdentity
from dedupsink.sink.settle import Settlement, StagedKeys, settle_task
from dedupsink.sink.worker import tune_worker_process
from dedupsink.store.cache import BucketManager, CacheInfo, manager_for
from dedupsink.store.compaction import (
    KeysContext,
    WrittenWindowFile,
    choose_folds,
    share_written,
    write_window_file,
)
from dedupsink.store.format import Manifest
from dedupsink.store.ownership import check_not_fenced
from dedupsink.store.records import StateUse, WindowCounts
from dedupsink.store.retry import WAITS, StoreWaits
from dedupsink.store.store import check_settings

log = logging.getLogger("dedupsink")

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
    written: WrittenWindowFile | None = None
    max_stamp: float | None = None
    new_categories: list[str] = field(default_factory=list)
    cache: CacheInfo | None = None
    state: StateUse = field(default_factory=StateUse)
    process: str = ""  # host and pid of the task's process: the commit counts each once
    seconds: float = 0.0
    started_at: float = 0.0  # when the task started, seconds since the epoch (wall clock)
    classify_seconds: float = 0.0
    error_reasons: dict[str, int] = field(default_factory=dict)  # error rows per reason
    store_waits: StoreWaits = field(default_factory=StoreWaits)  # requests retried, seconds

    @property
    def folder(self) -> str:
        """The window's staging folder (relative to the output root)."""
        identity = self.identity
        return staging_folder(
            self.base_version + 1, identity.query_id, identity.batch_id, identity.run
        )


def coalesce(
    batches: Iterator[pa.RecordBatch], rows: int, nbytes: int = COALESCE_BYTES
) -> Iterator[Rows]:
    """Regroup record batches into chunks of at least ``rows`` rows or ``nbytes`` bytes (the
    last may be smaller): tables over the batches' buffers, as copying a chunk's every column
    into one batch cost more than the classification (the engine joins the key columns only)."""
    pending: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if count >= rows or size >= nbytes:
            yield pending[0] if len(pending) == 1 else pa.Table.from_batches(pending)
            pending, count, size = [], 0, 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.Table.from_batches(pending)


def run_task(
    plan: SinkPlan, identity: TaskIdentity, batches: Iterator[pa.RecordBatch]
) -> TaskSummary:
    started, waits = time.perf_counter(), WAITS.now()
    started_at = time.time()
    tune_worker_process()
    store, options = plan.store, plan.options
    manifest = store.read() or store.open(plan.settings)
    summary = TaskSummary(identity, manifest.version, manifest.store_id, started_at=started_at)
    if manifest.queries.get(identity.query_id, -1) >= identity.batch_id:
        summary.skipped = True  # a re-run of a committed batch: its outputs already exist
        return summary
    check_settings(manifest.settings, plan.settings, store.url)
    plan = replace(plan, settings=plan.settings.laid_out_as(manifest.settings))
    check_not_fenced(manifest, plan.writer(identity.query_id, identity.run), store.url)
    manager = manager_for(
        store,
        manifest,
        options.max_cached_buckets,
        stamp_dtype(plan.settings),
        options.max_cache_memory.nbytes,
        options.state_cache_dir,
    )
    manager.begin_task()
    writers = PortWriters(plan.output, summary.folder, identity.partition, identity.attempt)
    try:
        classified = _classify(plan, manifest, manager, batches, writers, summary)
        new, later = _settle(plan, summary, classified, writers, started)
    except BaseException:
        writers.discard()
        raise
    context = classified.context

    def window_file() -> WrittenWindowFile:
        folds = choose_folds(manager, manifest, context, new, identity.partition)
        written = write_window_file(store, manifest, context, new, identity.partition, folds)
        share_written(manager, written, new, plan.settings)
        return written

    # The ports' last files, the window file and the keys staged again are independent: on an
    # object store they go side by side, one round trip for all.
    closing = partial(writers.close, later)
    summary.files, written = plan.output.storage.both(closing, window_file)
    summary.written = written
    if plan.settings.by_sequence:
        # A task cannot tell a new producer: the commit's fold counts them.
        written.new_keys = 0
    summary.cache = manager.cache.info()
    summary.state = manager.task_use()
    summary.process = f"{socket.gethostname()}:{os.getpid()}"
    log.info(
        "dedup task of batch %s, partition %s: %s",
        identity.batch_id,
        identity.partition,
        summary.state.task_text(),
    )
    summary.seconds = time.perf_counter() - started
    summary.store_waits = WAITS.now() - waits
    return summary


@dataclass
class _Classified:
    """A task's rows once classified: the unique rows of its last chunk (not written yet), the
    keys it found new, and the counts of the rows written."""

    held: Rows | None
    new: NewKeys
    context: KeysContext
    counts: dict[str, int]
    # Sequence dedup: the producers' highest ids, what the window file remembers instead.
    producers: NewKeys | None = None


def _classify(
    plan: SinkPlan,
    manifest: Manifest,
    manager: BucketManager,
    batches: Iterator[pa.RecordBatch],
    writers: PortWriters,
    summary: TaskSummary,
) -> _Classified:
    """Classify the task's rows chunk by chunk and write them to their ports, except the last
    chunk's unique rows: they wait for the settlement with the other partitions."""
    state = CommittedState(manifest.latest, manifest.category_ordinals())
    classifier = WindowClassifier(plan.settings, state, manager)
    counts: dict[str, int] = dict.fromkeys(PORTS, 0)
    held: Rows | None = None
    for batch in coalesce(batches, COALESCE_ROWS):
        tick = time.perf_counter()
        result = classifier.classify(batch)
        summary.classify_seconds += time.perf_counter() - tick
        count_reasons(result.error_reasons, summary.error_reasons)
        if held is not None:
            # A file per chunk: yielding rows of an earlier chunk rewrites only its file.
            writers.write("unique", held)
            writers.roll("unique")
            counts["unique"] += held.num_rows
            held = None
        for port, rows in split(batch, result).items():
            if port == "unique":
                held = rows
                continue
            writers.write(port, rows)
            counts[port] += rows.num_rows
    summary.max_stamp = classifier.max_stamp
    summary.new_categories = classifier.new_categories
    producers = classifier.producer_highest_ids() if plan.settings.by_sequence else None
    return _Classified(held, classifier.new_keys(), KeysContext.of(classifier), counts, producers)


def count_reasons(reasons: pa.Array, counts: dict[str, int]) -> None:
    """Add a batch's error rows to ``counts`` by reason (a few distinct texts a batch)."""
    import pyarrow.compute as pc

    if len(reasons):
        for entry in pc.value_counts(reasons).to_pylist():
            counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]


def _settle(
    plan: SinkPlan,
    summary: TaskSummary,
    classified: _Classified,
    writers: PortWriters,
    started: float,
) -> tuple[NewKeys, list[Callable[[], object]]]:
    """Settle the task's new keys with the lower partitions (``settle``), write its held unique
    rows, and count its ports; returns the keys its window file remembers, and the writes the
    settlement left to go beside the task's last ones."""
    identity, new, held = summary.identity, classified.new, classified.held
    classified.held = None  # written below: not held past the settlement
    settled = settle_task(
        plan.output,
        summary.folder,
        identity.partition,
        identity.attempt,
        StagedKeys(Fingerprints(new.h1, new.h2), new.stamps, new.by_h1),
        held,
        writers,
        waited_since=started,
    )
    summary.settlement = settled.settlement
    counts = classified.counts
    # Rows yielded from earlier chunks were counted unique when written.
    yielded = settled.settlement.yielded
    counts["unique"] += (0 if held is None else held.num_rows) - yielded
    counts["duplicate"] += yielded
    summary.counts = WindowCounts(**counts)
    later = [] if settled.restage is None else [settled.restage]
    if classified.producers is not None:
        return classified.producers, later
    return _kept(new, settled.yielded), later  # the keeping partition remembers the yielded keys


def _kept(new: NewKeys, yielded: np.ndarray) -> NewKeys:
    if not yielded.any():
        return new
    kept = ~yielded
    stamps = None if new.stamps is None else new.stamps[kept]
    return NewKeys(new.h1[kept], new.h2[kept], new.buckets[kept], stamps)
