"""A window's transaction, from what its tasks report: the sink's side of the store's commit.

The store applies typed updates (``store/transaction.py``); this module says which ones a
window makes, from its plan and its tasks' summaries, and plans its publication through the
port format, which the store layer does not know.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from dedupsink.engine.classify import PORTS
from dedupsink.ports.output import PortFile
from dedupsink.sink.plan import SinkPlan
from dedupsink.sink.task import TaskSummary
from dedupsink.store.compaction import WrittenWindowFile
from dedupsink.store.format import Manifest, PortState
from dedupsink.store.ownership import Writer
from dedupsink.store.records import LogEntry, Move, Publication, WindowCounts
from dedupsink.store.transaction import (
    AddCategories,
    AddWindowFiles,
    AdvanceLatestPoint,
    AssertBase,
    AssertBatchNew,
    AssertNotFenced,
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
                RecordWindow(
                    writer.query,
                    self.batch_id,
                    sum((t.counts for t in self.tasks), WindowCounts()),
                    cross_partition,
                    sum(t.seconds for t in self.tasks),
                ),
                RecordPublication(publication, ports),
            ),
        )

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
        return Publication(version, folder, self.now_ms, tuple(moves), tuple(entries)), ports


def _copy(state: PortState) -> PortState:
    return replace(state, recent=None if state.recent is None else list(state.recent))
