"""A window's commit as the store applies it: typed requirements, typed updates, one create.

As pyiceberg applies a table's updates, a ``Transaction`` holds the version it builds on (the
*base*: the version the window's tasks classified against), the *requirements* that base must
meet, and the *updates* that turn a copy of it into the next version. ``commit`` checks the
requirements, applies the updates in order and creates the next manifest only if absent (the
commit point): a writer that read an older version loses there, whatever it believed. Nothing
here reads a row or knows Spark; the sink builds a window's updates from its tasks' summaries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from dedupsink.engine.classify import WINDOW_TIME_PLACEHOLDER
from dedupsink.engine.expiry_policy import ExpiryPolicy, is_expired
from dedupsink.errors import StoreConflictError
from dedupsink.store.compaction import WrittenWindowFile
from dedupsink.store.format import (
    Manifest,
    PortState,
    Segment,
    StampCounts,
    resolve_stamp_counts,
    without_stamp_counts,
)
from dedupsink.store.ownership import BATCH_WRITE_PREFIX, Writer, check_not_fenced, next_owner
from dedupsink.store.records import Publication, StateUse, WindowCounts, WindowRecord
from dedupsink.store.retry import StoreWaits
from dedupsink.store.store import GARBAGE_EVERY, BucketStore, garbage_due

KEEP_QUERIES = 32


# -- requirements: what the base version must be ---------------------------------------------


class Requirement(Protocol):
    def validate(self, base: Manifest, store_url: str) -> None:
        """Raise a ``StoreError`` if ``base`` does not meet the requirement."""


@dataclass(frozen=True)
class AssertBase:
    """The window's tasks classified against this version of this store. The commit point's
    conditional create enforces that it is still the latest when the next one is created."""

    version: int
    store_id: str

    def validate(self, base: Manifest, store_url: str) -> None:
        if (base.version, base.store_id) != (self.version, self.store_id):
            raise StoreConflictError(
                f"store {store_url} is at version {base.version} ({base.store_id}), not the "
                f"version {self.version} ({self.store_id}) the window was classified against. "
                "Restart the query to re-run the batch."
            )


@dataclass(frozen=True)
class AssertNotFenced:
    """The writer's run has not lost the store (docs/ARCHITECTURE.md, "Ownership")."""

    writer: Writer

    def validate(self, base: Manifest, store_url: str) -> None:
        check_not_fenced(base, self.writer, store_url)


@dataclass(frozen=True)
class AssertBatchNew:
    """The base has not committed this batch of this query: a re-run commits nothing."""

    query: str
    batch: int

    def validate(self, base: Manifest, store_url: str) -> None:
        if base.queries.get(self.query, -1) >= self.batch:
            raise StoreConflictError(
                f"store {store_url} has committed batch {self.batch} of query {self.query} "
                f"already (version {base.version}): a re-run of it commits nothing."
            )


# -- updates: what the next version changes ---------------------------------------------------


@dataclass
class NextVersion:
    """The next version while the updates apply, with what one update leaves for a later one."""

    base: Manifest
    manifest: Manifest
    added: list[WrittenWindowFile] = field(default_factory=list)  # by ``AddWindowFiles``
    dropped_keys: int = 0  # by ``DropExpiredFiles``
    expired_unfolded_keys: int = 0  # by ``CountExpiredUnfolded``


class Update(Protocol):
    def apply(self, next_version: NextVersion) -> None:
        """Change ``next_version.manifest``, a copy the base shares no container with."""


@dataclass(frozen=True)
class SetOwner:
    """The writer holds the store (a batch write releases it); a run it took it from is fenced."""

    writer: Writer
    now_ms: int

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        manifest.owner, manifest.fenced = next_owner(
            next_version.base, self.writer, manifest.version, self.now_ms
        )


@dataclass(frozen=True)
class RecordBatch:
    """Remember (query, batch), so a re-run of the batch is recognised and discarded.

    Of batch writes only the committing one is kept: Spark never re-runs a committed batch
    write, and a backfill of many would otherwise push a stopped stream's last batch out of
    the list, which, re-run at the stream's restart, would then be committed twice."""

    query: str
    batch: int

    def apply(self, next_version: NextVersion) -> None:
        streams = [
            (query, batch)
            for query, batch in next_version.base.queries.items()
            if query != self.query and not query.startswith(BATCH_WRITE_PREFIX)
        ]
        kept = dict(streams[-(KEEP_QUERIES - 1) :])
        next_version.manifest.queries = {**kept, self.query: self.batch}


@dataclass(frozen=True)
class ForgetCollectedTombstones:
    """Tombstones of files the base version's garbage collection deleted leave the list."""

    def apply(self, next_version: NextVersion) -> None:
        base, manifest = next_version.base, next_version.manifest
        deleted = set(garbage_due(base)) if base.version % GARBAGE_EVERY == 0 else set()
        kept = [(name, at) for name, at in manifest.tombstones if name not in deleted]
        manifest.tombstones = kept


@dataclass(frozen=True)
class AddCategories:
    """Categories the window's tasks found new, in order of first appearance."""

    names: tuple[str, ...]

    def apply(self, next_version: NextVersion) -> None:
        categories = next_version.manifest.categories
        for name in self.names:
            if name not in categories:
                categories.append(name)


@dataclass(frozen=True)
class AddWindowFiles:
    """The window's files and their segments join the index. A file's provisional category
    numbers become final here; a systemTime file's newest stamp is set by the latest point."""

    files: tuple[WrittenWindowFile, ...]

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        ordinals = manifest.category_ordinals()
        for written in self.files:
            next_version.added.append(written)
            window_file = written.window_file
            if window_file is None:
                continue
            if window_file.local_categories:
                top = max(ordinals[name] for name in window_file.local_categories)
                low = min(ordinals[name] for name in window_file.local_categories)
                newest = top if window_file.max_stamp is None else max(window_file.max_stamp, top)
                oldest = low if window_file.min_stamp is None else min(window_file.min_stamp, low)
                # A provisional number -1, -2, ... names the file's first, second, ... category.
                final: dict[float, float] = {
                    -1 - i: ordinals[c] for i, c in enumerate(window_file.local_categories)
                }
                counts = resolve_stamp_counts(window_file.stamp_counts, final)
                window_file = replace(
                    window_file, max_stamp=newest, min_stamp=oldest, stamp_counts=counts
                )
            manifest.files[window_file.name] = window_file
            for bucket, segment in written.segments.items():
                manifest.buckets.setdefault(bucket, []).append(segment)


@dataclass(frozen=True)
class FoldSegments:
    """A folded segment replaces the segments it folded; files left with none are dropped.

    Each file is replaced once, however many of its buckets were folded: a window folds dozens
    of segments of the same few files, and a changed file's entry is packed again."""

    supersedes: Mapping[int, Sequence[tuple[str, int]]]  # bucket -> the folded segments' idents
    # The folded segments' stamp counts (by ident; None or missing: unknown), taken from their
    # files' so that those stay exact.
    folded_stamps: Mapping[tuple[str, int], StampCounts | None] = field(default_factory=dict)

    @classmethod
    def of(cls, files: Sequence[WrittenWindowFile]) -> FoldSegments:
        supersedes: dict[int, list[tuple[str, int]]] = {}
        folded_stamps: dict[tuple[str, int], StampCounts | None] = {}
        for written in files:
            for bucket, idents in written.supersedes.items():
                supersedes.setdefault(bucket, []).extend(idents)
            folded_stamps.update(written.folded_stamps)
        return cls(supersedes, folded_stamps)

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        folded_from: dict[str, list[tuple[int, Segment]]] = {}
        for bucket, idents in self.supersedes.items():
            folded = {tuple(ident) for ident in idents}
            kept: list[Segment] = []
            for segment in manifest.buckets.get(bucket, []):
                if segment.ident in folded:
                    folded_from.setdefault(segment.file, []).append((bucket, segment))
                else:
                    kept.append(segment)
            manifest.buckets[bucket] = kept
        for name, segments in folded_from.items():
            self._drop_segments_of_file(manifest, name, segments)

    def _drop_segments_of_file(
        self, manifest: Manifest, name: str, segments: list[tuple[int, Segment]]
    ) -> None:
        """A file's folded segments leave it, and their keys its stamp counts; a file left
        without a segment is tombstoned."""
        window_file = manifest.files.get(name)
        if window_file is None:
            return
        folded = {bucket for bucket, _ in segments}
        remaining = [b for b in window_file.buckets if b not in folded]
        if not remaining:
            del manifest.files[name]
            manifest.tombstones.append((name, manifest.version))
            return
        counts = window_file.stamp_counts
        for _, segment in segments:
            counts = without_stamp_counts(counts, self.folded_stamps.get(segment.ident))
        manifest.files[name] = replace(window_file, buckets=remaining, stamp_counts=counts)


@dataclass(frozen=True)
class AdvanceLatestPoint:
    """The latest point after the window (``ExpiryPolicy.next_latest_point``); in systemTime
    it is the commit's time, which becomes the newest stamp of the window's files."""

    policy: ExpiryPolicy
    window_stamps: tuple[float, ...]  # each task's largest expiry value
    now_us: int

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        manifest.latest = self.policy.next_latest_point(
            next_version.base.latest, self.window_stamps, len(manifest.categories), self.now_us
        )
        if self.policy.mode != "systemTime":
            return
        for written in next_version.added:
            if written.window_file is not None:
                name = written.window_file.name
                window_file = manifest.files[name]
                # Its keys' placeholders mean this time; a fold's final stamps are older.
                latest = manifest.latest
                oldest = latest if window_file.min_stamp is None else window_file.min_stamp
                counts = None
                if latest is not None:
                    counts = resolve_stamp_counts(
                        window_file.stamp_counts, {WINDOW_TIME_PLACEHOLDER: latest}
                    )
                manifest.files[name] = replace(
                    window_file, max_stamp=latest, min_stamp=oldest, stamp_counts=counts
                )


@dataclass(frozen=True)
class DropExpiredFiles:
    """Whole window files whose newest key is at or below the expiry point are forgotten."""

    policy: ExpiryPolicy

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        expiry_point = self.policy.expiry_point(manifest.latest)
        if expiry_point is None:
            return
        expired = [
            window_file
            for window_file in manifest.files.values()
            if window_file.max_stamp is not None and is_expired(window_file.max_stamp, expiry_point)
        ]
        for window_file in expired:
            name = window_file.name
            del manifest.files[name]
            for bucket in window_file.buckets:
                remaining = [s for s in manifest.buckets.get(bucket, []) if s.file != name]
                if remaining:
                    manifest.buckets[bucket] = remaining
                else:
                    manifest.buckets.pop(bucket, None)
            manifest.tombstones.append((name, manifest.version))
            next_version.dropped_keys += window_file.keys


# The final stamps of some committed segments of a version (``BucketManager.read_segments``).
StampReader = Callable[[Manifest, list[Segment]], np.ndarray]


@dataclass(frozen=True)
class CountExpiredUnfolded:
    """Count the keys at or below the expiry point still in window files (a file leaves once
    its newest key is forgotten, a time bucket's segment once folded): remembered keys are the
    others. Only files whose oldest stamp is at or below the expiry point, or unknown (files
    written before it was recorded), hold any: in a stream that keeps up, the one or two files
    the expiry point is passing through, or (hash-bucket modes) folds' files mixing many
    windows' keys. Such a file is counted from its stamp counts where it records them, exactly
    and without a read; only the others' keys are read."""

    policy: ExpiryPolicy
    read_stamps: StampReader

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        expiry_point = self.policy.expiry_point(manifest.latest)
        if expiry_point is None:
            return
        counted, unread = 0, set()
        for name, window_file in manifest.files.items():
            if window_file.min_stamp is not None and not is_expired(
                window_file.min_stamp, expiry_point
            ):
                continue
            expired = window_file.expired_keys(expiry_point)
            if expired is None:
                unread.add(name)
            else:
                counted += expired
        segments = [
            segment
            for bucket in sorted(manifest.buckets)
            for segment in manifest.buckets[bucket]
            if segment.file in unread
        ]
        if segments:
            stamps = self.read_stamps(manifest, segments)
            counted += int(is_expired(stamps, expiry_point).sum())
        next_version.expired_unfolded_keys = counted


@dataclass(frozen=True)
class RecordWindow:
    """What the window did: its counts, added to the store's totals, and its record."""

    query: str
    batch: int
    counts: WindowCounts
    cross_partition_duplicates: int
    task_seconds: float
    state: StateUse = field(default_factory=StateUse)
    error_reasons: tuple[tuple[str, int], ...] = ()
    store_waits: StoreWaits = field(default_factory=StoreWaits)
    # When the window's first task and its commit started (seconds since the epoch; None: not
    # known), and the clock that says when the commit point is reached.
    tasks_started_at: float | None = None
    commit_started_at: float | None = None
    clock: Callable[[], float] = time.time

    def apply(self, next_version: NextVersion) -> None:
        manifest = next_version.manifest
        kept = sum(s.count for bucket in manifest.buckets.values() for s in bucket)
        expired = next_version.expired_unfolded_keys
        manifest.totals = manifest.totals.after_window(self.counts, kept - expired, expired)
        manifest.last_window = WindowRecord(
            version=manifest.version,
            query=self.query,
            batch=self.batch,
            counts=self.counts,
            new_keys=sum(written.new_keys for written in next_version.added),
            cross_partition_duplicates=self.cross_partition_duplicates,
            dropped_keys=next_version.dropped_keys,
            task_seconds=round(self.task_seconds, 3),
            state=self.state,
            error_reasons=self.error_reasons,
            store_waits=self.store_waits,
            **self._wall_times(),
        )

    def _wall_times(self) -> dict[str, float | None]:
        if self.tasks_started_at is None or self.commit_started_at is None:
            return {}
        now = self.clock()
        return {
            "wall_seconds": round(now - self.tasks_started_at, 3),
            "commit_seconds": round(now - self.commit_started_at, 3),
        }


@dataclass(frozen=True)
class RecordPublication:
    """How the window's port files become readable, and each port's position after it."""

    publication: Publication
    ports: Mapping[str, PortState]

    def apply(self, next_version: NextVersion) -> None:
        next_version.manifest.ports.update(self.ports)
        next_version.manifest.publication = self.publication


# -- the transaction --------------------------------------------------------------------------


@dataclass(frozen=True)
class Transaction:
    """The next version of a store, from ``base``: requirements checked, updates applied."""

    base: Manifest
    requirements: tuple[Requirement, ...]
    updates: tuple[Update, ...]

    def next_version(self, store_url: str, now_ms: int) -> Manifest:
        for requirement in self.requirements:
            requirement.validate(self.base, store_url)
        return _apply(NextVersion(self.base, _copy_as_next(self.base, now_ms)), self.updates)

    def commit(self, store: BucketStore, now_ms: int) -> Manifest:
        """Create the next version only if absent: the commit point (``StoreConflictError``
        names the winner if another writer created it first)."""
        manifest = self.next_version(store.url, now_ms)
        store.commit(manifest)
        return manifest


def apply_updates(manifest: Manifest, updates: Sequence[Update]) -> Manifest:
    """Apply ``updates`` to ``manifest`` in place, as to the next version of itself."""
    return _apply(NextVersion(manifest, manifest), updates)


def _apply(next_version: NextVersion, updates: Sequence[Update]) -> Manifest:
    for update in updates:
        update.apply(next_version)
    return next_version.manifest


def _copy_as_next(base: Manifest, now_ms: int) -> Manifest:
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
