"""What a window's commit changes in the store, from what its tasks report.

The store applies typed updates (``store/transaction.py``); this module says which ones a
window makes (``WindowCommit.transaction``), writes the store files the commit adds itself
(keys settlement moved between partitions, sequence dedup's fold) and the empty files that
give a port without rows its schema, and plans the publication through the port format, which
the store layer does not know.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from dedupsink.engine.classify import PORTS, NewKeys, stamp_dtype
from dedupsink.engine.placement import bucket_of
from dedupsink.ports.base import schema_record
from dedupsink.ports.encoding import port_schema
from dedupsink.ports.output import Output, PortFile
from dedupsink.sink.plan import SinkPlan
from dedupsink.sink.settle import Moved, SettlingTask, StagedKeys
from dedupsink.sink.task import TaskSummary
from dedupsink.store.cache import manager_for, segment_stamps
from dedupsink.store.compaction import (
    KeysContext,
    WrittenWindowFile,
    fold_producers,
    write_window_file,
)
from dedupsink.store.format import Manifest, PortState
from dedupsink.store.ownership import Writer
from dedupsink.store.records import (
    LogEntry,
    Move,
    Publication,
    StateUse,
    WindowCounts,
    error_reasons,
)
from dedupsink.store.retry import StoreWaits
from dedupsink.store.store import BucketStore
from dedupsink.store.transaction import (
    AddCategories,
    AddWindowFiles,
    AdvanceLatestPoint,
    AssertBase,
    AssertBatchNew,
    AssertNotFenced,
    CountExpiredUnfolded,
    DropExpiredFiles,
    FoldSegments,
    ForgetCollectedTombstones,
    RecordBatch,
    RecordPublication,
    RecordWindow,
    SetOwner,
    Transaction,
)


@dataclass(frozen=True)
class WindowCommit:
    """One window's commit: its plan, the version its tasks read, who commits, what they did."""

    plan: SinkPlan
    base: Manifest
    writer: Writer
    batch_id: int
    tasks: list[TaskSummary]  # in partition order
    schema_files: list[PortFile]  # empty files giving a port without rows its schema
    now_ms: int
    commit_waits: StoreWaits = field(default_factory=StoreWaits)  # the commit's, so far
    commit_started_at: float | None = None  # seconds since the epoch

    def transaction(
        self, written_by_commit: list[WrittenWindowFile], cross_partition: int
    ) -> Transaction:
        """The store's transaction for this window; ``written_by_commit`` are the window files
        the commit wrote (keys settlement promoted, sequence dedup's fold)."""
        base, writer, policy = self.base, self.writer, self.plan.settings.expiry
        written = [t.written for t in self.tasks if t.written is not None] + written_by_commit
        publication, ports = self._publication()
        return Transaction(
            base,
            requirements=(
                AssertBase(self.tasks[0].base_version, self.tasks[0].store_id),
                AssertNotFenced(writer),
                AssertBatchNew(writer.query, self.batch_id),
            ),
            updates=(
                SetOwner(writer, self.now_ms),
                RecordBatch(writer.query, self.batch_id),
                ForgetCollectedTombstones(),
                AddCategories(tuple(name for t in self.tasks for name in t.new_categories)),
                AddWindowFiles(tuple(written)),
                FoldSegments.of(written),
                AdvanceLatestPoint(policy, self._window_stamps(), int(time.time() * 1_000_000)),
                DropExpiredFiles(policy),
                *self._count_expired_unfolded(),
                RecordWindow(
                    writer.query,
                    self.batch_id,
                    sum((t.counts for t in self.tasks), WindowCounts()),
                    cross_partition,
                    sum(t.seconds for t in self.tasks),
                    StateUse.of_tasks([(t.process, t.state) for t in self.tasks]),
                    error_reasons(t.error_reasons for t in self.tasks),
                    sum((t.store_waits for t in self.tasks), self.commit_waits),
                    min((t.started_at for t in self.tasks if t.started_at), default=None),
                    self.commit_started_at,
                ),
                RecordPublication(publication, ports),
            ),
        )

    def _count_expired_unfolded(self) -> tuple[CountExpiredUnfolded, ...]:
        """Counting the expired keys awaiting a fold, in the modes where keys expire."""
        dtype = stamp_dtype(self.plan.settings)
        if not self.plan.settings.has_expiry or dtype is None:
            return ()
        policy = self.plan.settings.expiry
        return (CountExpiredUnfolded(policy, segment_stamps(self.plan.store, dtype)),)

    def _window_stamps(self) -> tuple[float, ...]:
        return tuple(t.max_stamp for t in self.tasks if t.max_stamp is not None)

    def _publication(self) -> tuple[Publication, dict[str, PortState]]:
        """Each port's files as its format publishes them (and, for Parquet ports, their Spark
        log entries), and the ports' positions after them; the record holds everything a
        publisher writes."""
        version = self.base.version + 1
        moves: list[Move] = []
        entries: list[LogEntry] = []
        staged = [f for t in self.tasks for f in t.files if f.rows > 0] + self.schema_files
        ports: dict[str, PortState] = {}
        for port in PORTS:
            state = _copy(self.base.ports.get(port, PortState()))
            files = [f for f in staged if f.port == port]
            port_moves, entry = self.plan.ports.plan_port(port, state, files, version, self.now_ms)
            ports[port] = state
            moves.extend(port_moves)
            if entry is not None:
                entries.append(entry)
        folder = self.tasks[0].folder
        schema, schema_version = self._schema()
        publication = Publication(
            version, folder, self.now_ms, tuple(moves), tuple(entries), schema, schema_version
        )
        return publication, ports

    def _schema(self) -> tuple[bytes, int]:
        """The window's input schema as recorded, and the store's schema version: the base's,
        one more if the base's window recorded another schema (0 where none is recorded)."""
        schema = schema_record(self.plan.schema)
        previous = self.base.publication
        if previous is None or previous.schema is None:
            return schema, 0
        return schema, previous.schema_version + (previous.schema != schema)


def _copy(state: PortState) -> PortState:
    return replace(state, recent=None if state.recent is None else list(state.recent))


def files_written_by_commit(
    plan: SinkPlan,
    store: BucketStore,
    base: Manifest,
    done: list[TaskSummary],
    settling: list[SettlingTask],
    moves: list[Moved],
) -> list[WrittenWindowFile]:
    """The window files the commit writes itself, as settlement's moves make its tasks' files
    and counts follow: a task whose rows went to duplicate has its window file written again
    without their keys (the old file is left to the garbage collection, as a failed
    attempt's); keys promoted back to unique, which their task left out of its own, get a
    window file of theirs; sequence dedup's fold."""
    summary_of = {id(task): s for task, s in zip(settling, done, strict=True)}
    written = []
    for move in moves:
        summary = summary_of[id(move.task)]
        summary.files = move.task.files
        summary.counts = summary.counts.moved(move.rows, move.source, move.target)
        if plan.settings.by_sequence:
            continue  # the window files hold producers' highest ids, which no move changes
        if move.still_kept is not None:
            # Only partition 0 folds, and it keeps every key it found new: never demoted.
            summary.written = _window_file(plan, store, base, summary, move.still_kept)
        if move.keys is not None and len(move.keys):
            written.append(_window_file(plan, store, base, summary, move.keys))
    if plan.settings.by_sequence:
        written += _fold_producers(plan, store, base, done)
    return written


def _fold_producers(
    plan: SinkPlan, store: BucketStore, base: Manifest, done: list[TaskSummary]
) -> list[WrittenWindowFile]:
    options = plan.options
    manager = manager_for(
        store,
        base,
        options.max_cached_buckets,
        stamp_dtype(plan.settings),
        options.max_cache_memory.nbytes,
        options.state_cache_dir,
    )
    written = [s.written for s in done if s.written is not None]
    folded = fold_producers(manager, base, plan.settings, written)
    return [] if folded is None else [folded]


def _window_file(
    plan: SinkPlan, store: BucketStore, base: Manifest, summary: TaskSummary, keys: StagedKeys
) -> WrittenWindowFile:
    """A window file of a task's partition holding these keys, as its task would write it."""
    expiry_point = plan.settings.expiry_point(base.latest)
    buckets = bucket_of(plan.settings, keys.fingerprints, keys.stamps)
    new = NewKeys(keys.fingerprints.h1, keys.fingerprints.h2, buckets, keys.stamps)
    context = KeysContext(plan.settings, expiry_point, tuple(summary.new_categories))
    return write_window_file(store, base, context, new, summary.identity.partition, [])


def cross_partition(done: list[TaskSummary], moves: list[Moved]) -> int:
    """Rows that are duplicates because another partition of the window had the key too."""
    yielded = sum(s.settlement.yielded for s in done)
    demoted = sum(m.rows for m in moves if m.target == "duplicate")
    promoted = sum(m.rows for m in moves if m.target == "unique")
    return yielded + demoted - promoted


def empty_port_files(
    plan: SinkPlan, output: Output, base: Manifest, done: list[TaskSummary]
) -> list[PortFile]:
    """An empty file for each port that has no file yet and no rows in this window: a port is
    readable, with its schema, from the first committed window on."""
    files: list[PortFile] = []
    if not plan.ports.schema_files:
        return files
    for port in PORTS:
        state = base.ports.get(port)
        has_rows = any(f.port == port and f.rows > 0 for s in done for f in s.files)
        if has_rows or (state is not None and state.files > 0):
            continue
        relative = f"{done[0].folder}/pschema-0.{port}.parquet"
        size = output.write_table(relative, port_schema(port, plan.schema).empty_table())
        files.append(PortFile(port, relative, 0, size))
    return files
