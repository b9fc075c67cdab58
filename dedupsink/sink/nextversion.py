"""The next version of the store, built from the version a window was classified against.

``next_version`` starts from a copy of the base manifest and applies ``STEPS`` in order, each a
short function of the new manifest and the window (``WindowUpdate``), as pyiceberg applies
typed table updates: the owner, the batch, categories, window files, folds, the latest point,
expired files, the counts and the publication plan. Nothing here reads or writes a file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dedupsink.engine.classify import PORTS
from dedupsink.ports.output import PortFile
from dedupsink.sink.compaction import WrittenKeys
from dedupsink.sink.plan import BATCH_WRITE_PREFIX, SinkPlan
from dedupsink.sink.task import TaskSummary
from dedupsink.store.format import Manifest, PortState, Segment
from dedupsink.store.ownership import Writer, next_owner
from dedupsink.store.records import LogEntry, Move, Publication, WindowCounts, WindowRecord
from dedupsink.store.store import GARBAGE_EVERY, garbage_due

KEEP_QUERIES = 32


@dataclass
class WindowUpdate:
    """One window's commit: its plan, the version its tasks read, who commits, what they did."""

    plan: SinkPlan
    base: Manifest
    writer: Writer
    batch_id: int
    tasks: list[TaskSummary]  # in partition order
    schema_files: list[PortFile]  # empty files giving a port without rows its schema
    cross_partition: int
    now_ms: int
    promoted: list[WrittenKeys] = field(default_factory=list)  # written by the commit
    dropped_keys: int = 0  # keys forgotten with expired window files (set by a step)

    @property
    def written(self) -> list[WrittenKeys]:
        """Every window file of the window: its tasks' and the commit's."""
        return [t.written for t in self.tasks if t.written is not None] + self.promoted


def next_version(update: WindowUpdate) -> Manifest:
    nxt = _start_from(update.base, update.now_ms)
    for step in STEPS:
        step(nxt, update)
    return nxt


def _start_from(base: Manifest, now_ms: int) -> Manifest:
    """A copy of ``base`` as version + 1, its containers copied (the base stays as read)."""
    return replace(
        base,
        version=base.version + 1,
        committed_ms=now_ms,
        categories=list(base.categories),
        files=dict(base.files),
        buckets={bucket: list(segments) for bucket, segments in base.buckets.items()},
        tombstones=list(base.tombstones),
        ports={
            port: replace(state, recent=None if state.recent is None else list(state.recent))
            for port, state in base.ports.items()
        },
        totals=base.totals,
        publication=None,
        last_window=None,
    )


def set_owner(nxt: Manifest, update: WindowUpdate) -> None:
    nxt.owner, nxt.fenced = next_owner(update.base, update.writer, nxt.version, update.now_ms)


def record_batch(nxt: Manifest, update: WindowUpdate) -> None:
    """Remember this (query, batch), so a re-run of the batch is recognised and discarded.

    Of batch writes only the one committing is kept: Spark never runs a batch write again once
    committed, and a backfill of many writes would otherwise push a stopped stream's last batch
    out of the list, and that batch, re-run at the stream's restart, would be committed twice."""
    writer = update.writer.query
    streams = [
        (query, batch)
        for query, batch in update.base.queries.items()
        if query != writer and not query.startswith(BATCH_WRITE_PREFIX)
    ]
    nxt.queries = {**dict(streams[-(KEEP_QUERIES - 1) :]), writer: update.batch_id}


def forget_deleted_tombstones(nxt: Manifest, update: WindowUpdate) -> None:
    """Tombstones that the base version's garbage collection deleted leave the list."""
    collected = update.base.version % GARBAGE_EVERY == 0
    deleted = set(garbage_due(update.base)) if collected else set()
    nxt.tombstones = [(name, at) for name, at in nxt.tombstones if name not in deleted]


def add_categories(nxt: Manifest, update: WindowUpdate) -> None:
    for task in update.tasks:
        for name in task.new_categories:
            if name not in nxt.categories:
                nxt.categories.append(name)


def add_window_files(nxt: Manifest, update: WindowUpdate) -> None:
    """The tasks' window files and their segments join the index."""
    ordinals = nxt.category_ordinals()
    for written in update.written:
        if written.window_file is None:
            continue
        wf = written.window_file
        # A systemTime file's max stamp is the window's time: ``advance_latest_point`` sets it.
        if wf.local_categories:
            top = max(ordinals[name] for name in wf.local_categories)
            wf = replace(wf, max_stamp=top if wf.max_stamp is None else max(wf.max_stamp, top))
        nxt.files[wf.name] = wf
        for bucket, segment in written.segments.items():
            nxt.buckets.setdefault(bucket, []).append(segment)


def apply_compaction(nxt: Manifest, update: WindowUpdate) -> None:
    """A folded segment replaces the segments it folded; files left with none are dropped.

    Each file is replaced once, however many of its buckets were folded: a window folds
    dozens of segments of the same few files, and a changed file's entry is packed again."""
    folded_from: dict[str, set[int]] = {}
    for written in update.written:
        for bucket, replaced in written.supersedes.items():
            folded = {tuple(ident) for ident in replaced}
            kept: list[Segment] = []
            for segment in nxt.buckets.get(bucket, []):
                if segment.ident in folded:
                    folded_from.setdefault(segment.file, set()).add(bucket)
                else:
                    kept.append(segment)
            nxt.buckets[bucket] = kept
    for name, buckets in folded_from.items():
        _drop_buckets_of_file(nxt, name, buckets)


def _drop_buckets_of_file(nxt: Manifest, name: str, buckets: set[int]) -> None:
    wf = nxt.files.get(name)
    if wf is None:
        return
    remaining = [b for b in wf.buckets if b not in buckets]
    if remaining:
        nxt.files[name] = replace(wf, buckets=remaining)
    else:
        del nxt.files[name]
        nxt.tombstones.append((name, nxt.version))


def advance_latest_point(nxt: Manifest, update: WindowUpdate) -> None:
    """The largest expiry value committed so far (docs/SEMANTICS.md, rule 2)."""
    mode = update.plan.settings.mode
    previous = update.base.latest
    if mode in ("basic", "sequence"):
        nxt.latest = None
    elif mode == "categorical":
        nxt.latest = len(nxt.categories) - 1 if nxt.categories else None
    elif mode == "systemTime":
        now_us = int(time.time() * 1_000_000)
        nxt.latest = now_us if previous is None else max(now_us, int(previous) + 1)
        for written in update.written:
            if written.window_file is not None:
                name = written.window_file.name
                nxt.files[name] = replace(nxt.files[name], max_stamp=nxt.latest)
    else:
        stamps = [t.max_stamp for t in update.tasks if t.max_stamp is not None]
        if previous is not None:
            stamps.append(previous)
        nxt.latest = max(stamps) if stamps else None


def drop_expired_files(nxt: Manifest, update: WindowUpdate) -> None:
    """Forget whole window files whose newest key is at or below the expiry point."""
    expiry_point = update.plan.settings.expiry_point(nxt.latest)
    if expiry_point is None:
        return
    expired = [
        wf for wf in nxt.files.values() if wf.max_stamp is not None and wf.max_stamp <= expiry_point
    ]
    for wf in expired:
        del nxt.files[wf.name]
        for bucket in wf.buckets:
            remaining = [s for s in nxt.buckets.get(bucket, []) if s.file != wf.name]
            if remaining:
                nxt.buckets[bucket] = remaining
            else:
                nxt.buckets.pop(bucket, None)
        nxt.tombstones.append((wf.name, nxt.version))
        update.dropped_keys += wf.keys


def count_window(nxt: Manifest, update: WindowUpdate) -> None:
    counts = sum((t.counts for t in update.tasks), WindowCounts())
    remembered = sum(s.count for segments in nxt.buckets.values() for s in segments)
    nxt.totals = nxt.totals.after_window(counts, remembered)
    nxt.last_window = WindowRecord(
        window=nxt.version,
        query=update.writer.query,
        batch=update.batch_id,
        counts=counts,
        new_keys=sum(written.new_keys for written in update.written),
        cross_partition_duplicates=update.cross_partition,
        dropped_keys=update.dropped_keys,
        task_seconds=round(sum(t.seconds for t in update.tasks), 3),
    )


def plan_publication(nxt: Manifest, update: WindowUpdate) -> None:
    """Each port's files as its format publishes them (and, for Parquet ports, their Spark log
    entries), the ports' positions advanced; the record holds everything a publisher writes."""
    ports = update.plan.ports
    moves: list[Move] = []
    entries: list[LogEntry] = []
    staged = [f for t in update.tasks for f in t.files if f.rows > 0] + update.schema_files
    for port in PORTS:
        state = nxt.ports.setdefault(port, PortState())
        files = [f for f in staged if f.port == port]
        port_moves, entry = ports.plan_port(port, state, files, nxt.version, update.now_ms)
        moves.extend(port_moves)
        if entry is not None:
            entries.append(entry)
    folder = update.tasks[0].folder
    nxt.publication = Publication(nxt.version, folder, update.now_ms, tuple(moves), tuple(entries))


STEPS: tuple[Callable[[Manifest, WindowUpdate], None], ...] = (
    set_owner,
    record_batch,
    forget_deleted_tombstones,
    add_categories,
    add_window_files,
    apply_compaction,
    advance_latest_point,
    drop_expired_files,
    count_window,
    plan_publication,
)
