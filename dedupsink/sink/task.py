"""One task of one window, on an executor: classify its rows and stage its outputs.

``run_task`` reads the store's latest committed manifest, classifies each Arrow record batch
through this process's bucket manager, writes the rows of each port to staged Parquet files,
writes the keys it found new as one window file, and returns a small ``TaskSummary`` for the
driver's commit. Nothing it writes is visible until that commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from dedupsink.engine.fingerprint import Fingerprints, first_occurrences
from dedupsink.engine.keyset import KeySet
from dedupsink.engine.settings import Settings
from dedupsink.errors import StoreOwnershipError
from dedupsink.options import DedupOptions
from dedupsink.sink.ports import Output, PortFile, PortWriters
from dedupsink.store.cache import BucketManager, CacheInfo, manager_for
from dedupsink.store.format import (
    Manifest,
    Segment,
    SegmentBytes,
    WindowFile,
    concat_segments,
    encode_segments,
)
from dedupsink.store.store import BucketStore, now_ms, window_file_name


@dataclass(frozen=True)
class SinkPlan:
    """Everything tasks and commits need; built once on the driver and pickled with the writer."""

    options: DedupOptions
    settings: Settings
    schema: pa.Schema

    @property
    def store(self) -> BucketStore:
        return BucketStore(self.options.store_path)

    @property
    def output(self) -> Output:
        return Output(self.options.path)


@dataclass(frozen=True)
class TaskIdentity:
    """Where a task stands: Spark's query id, batch id, partition and attempt."""

    query_id: str
    batch_id: int
    partition: int
    attempt: int

    @property
    def token(self) -> str:
        return f"{self.query_id}-{self.batch_id}"


@dataclass
class TaskSummary:
    """What one task reports to the commit: small, whatever the number of rows."""

    identity: TaskIdentity
    base_version: int
    skipped: bool = False
    files: list[PortFile] = field(default_factory=list)
    unique_keys: str | None = None  # staged keys: of the unique rows, then of the yielded ones
    yielded: int = 0  # unique rows given up to another partition: the duplicate file's last rows
    counts: dict[str, int] = field(default_factory=dict)
    window_file: WindowFile | None = None
    segments: dict[int, Segment] = field(default_factory=dict)
    max_stamp: float | None = None
    new_categories: list[str] = field(default_factory=list)
    new_keys: int = 0
    supersedes: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    cache: CacheInfo | None = None
    seconds: float = 0.0
    classify_seconds: float = 0.0


def lease_ms(owner: dict[str, Any], timeout_ms: int) -> int:
    """How long a lease lasts after its owner's last commit: the owner's ``ownerTimeout``, which
    the lease records (``timeout_ms`` for leases written before it did)."""
    return int(owner.get("timeout_ms", timeout_ms))


def lease_is_live(manifest: Manifest, timeout_ms: int) -> bool:
    owner = manifest.owner
    if not owner:
        return False
    return now_ms() - int(owner.get("heartbeat_ms", 0)) < lease_ms(owner, timeout_ms)


def check_owner(manifest: Manifest, query_id: str, timeout_ms: int, url: str) -> None:
    """Refuse to work on a store another query holds a live lease on."""
    owner = manifest.owner
    if not owner or owner.get("query") == query_id:
        return
    age_ms = now_ms() - int(owner.get("heartbeat_ms", 0))
    length_ms = lease_ms(owner, timeout_ms)
    if age_ms < length_ms:
        wait_s = max(0, length_ms - age_ms) / 1000
        raise StoreOwnershipError(
            f"store {url} is owned by streaming query {owner.get('query')} "
            f"(last commit {age_ms / 1000:.0f}s ago). Stop that query; if it is already gone, "
            f"wait {wait_s:.0f}s for its lease (ownerTimeout) to lapse, or run: "
            f"dedupsink release {url}"
        )


# Spark hands Arrow batches of 10,000 rows; classifying fewer, larger batches pays the
# per-bucket lookup overhead less often, at a bounded memory cost.
COALESCE_ROWS = 131_072


def coalesce(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Regroup record batches into batches of at least ``rows`` rows (the last may be short)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, count = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


def run_task(
    plan: SinkPlan, identity: TaskIdentity, batches: Iterator[pa.RecordBatch]
) -> TaskSummary:
    started = time.perf_counter()
    store, settings = plan.store, plan.settings
    manifest = store.read()
    if manifest is None:
        manifest = store.open(settings)
    summary = TaskSummary(identity, manifest.version)
    if manifest.queries.get(identity.query_id, -1) >= identity.batch_id:
        summary.skipped = True  # a re-run of a committed batch: its outputs already exist
        return summary
    check_owner(manifest, identity.query_id, plan.options.owner_timeout.micros // 1000, store.url)
    options = plan.options
    manager = manager_for(
        store,
        manifest,
        options.max_cached_buckets,
        stamp_dtype(settings),
        options.max_cache_memory.nbytes,
    )
    state = CommittedState(manifest.latest, manifest.category_ordinals())
    classifier = WindowClassifier(settings, state, manager)
    writers = PortWriters(plan.output, identity.token, identity.partition, identity.attempt)
    counts = dict.fromkeys(PORTS, 0)
    held = None  # the last chunk's unique rows, written once settled with other partitions
    try:
        for batch, last in _marking_last(coalesce(batches, COALESCE_ROWS)):
            tick = time.perf_counter()
            result = classifier.classify(batch)
            summary.classify_seconds += time.perf_counter() - tick
            for port, rows in split(batch, result).items():
                if last and port == "unique":
                    held = rows
                    continue
                writers.write(port, rows)
                counts[port] += rows.num_rows
        new = classifier.new_keys()
        _settle_held_rows(
            plan, identity, Fingerprints(new.h1, new.h2), held, writers, summary, counts
        )
        summary.files = writers.close()
    except BaseException:
        writers.discard()
        raise
    summary.counts = counts
    summary.max_stamp = classifier.max_stamp
    summary.new_categories = classifier.new_categories
    folds = _compaction(manager, manifest, classifier, new, identity)
    _write_new_keys(store, manifest, classifier, new, identity, summary, folds)
    summary.cache = manager.cache.info()
    summary.seconds = time.perf_counter() - started
    if summary.window_file is not None:
        summary.window_file.keys -= summary.yielded  # the partition yielded to remembers them
    return summary


def _marking_last(items: Iterator[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch, bool]]:
    pending = next(items, None)
    while pending is not None:
        following = next(items, None)
        yield pending, following is None
        pending = following


# A task settles with the staged keys of at most this many other tasks of its window; with
# more, reading them all costs more than the commit's settlement would, and the commit does it.
SETTLE_WITH_AT_MOST = 8


def _settle_held_rows(
    plan: SinkPlan,
    identity: TaskIdentity,
    keys: Fingerprints,
    held: pa.RecordBatch | None,
    writers: PortWriters,
    summary: TaskSummary,
    counts: dict[str, int],
) -> None:
    """Stage the task's new keys, then write its held unique rows, giving up to duplicate those
    whose key a task of another partition of this window has already staged as new.

    The i-th new key is the key of the i-th unique row. Of two tasks that find a key new, the
    one that stages its keys later sees the other's and yields its row here, so that the
    commit need not rewrite a staged file to settle it. Tasks finishing within moments of each
    other may both yield, or yield to an attempt that then failed: the commit checks every
    yielded key against the window's final unique rows and promotes a row back where needed.
    """
    output = plan.output
    if len(keys):
        summary.unique_keys = output.write_unique_keys(
            identity.token, identity.partition, identity.attempt, keys
        )
    if held is None:
        return
    yielded = np.zeros(held.num_rows, dtype=bool)
    others = output.other_partitions_keys(identity.token, identity.partition, SETTLE_WITH_AT_MOST)
    if others is not None and len(others):
        mine = keys[len(keys) - held.num_rows :]
        yielded = ~first_occurrences(Fingerprints.concat([others, mine]))[len(others) :]
    if not yielded.any():
        writers.write("unique", held)
        counts["unique"] += held.num_rows
        return
    kept = np.concatenate([np.ones(len(keys) - held.num_rows, dtype=bool), ~yielded])
    if not yielded.all():
        writers.write("unique", held.filter(pa.array(~yielded)))
    writers.write("duplicate", held.filter(pa.array(yielded)))  # last rows of the file
    summary.yielded = int(yielded.sum())
    counts["unique"] += held.num_rows - summary.yielded
    counts["duplicate"] += summary.yielded
    summary.unique_keys = output.write_unique_keys(
        identity.token,
        identity.partition,
        identity.attempt,
        Fingerprints.concat([keys.take(kept), keys.take(~kept)]),
    )


# A bucket whose keys are spread over more than this many segments is compacted: folded into
# one segment, so the index and a cold bucket's reads stay bounded however long the history.
COMPACT_ABOVE_SEGMENTS = 8
COMPACT_BUCKETS_PER_WINDOW = 8


@dataclass
class Fold:
    """Segments of one bucket to rewrite as one: as merged keys (hash buckets) or as their
    stored bytes (closed time buckets: nothing decoded). Either way expired keys are dropped."""

    bucket: int
    segments: list[Segment]
    keys: KeySet | None = None
    raw: Sequence[SegmentBytes] | None = None


def _compaction(
    manager: BucketManager,
    manifest: Manifest,
    classifier: WindowClassifier,
    new: NewKeys,
    identity: TaskIdentity,
) -> list[Fold]:
    """Partition 0 (in every window) compacts the most fragmented buckets, a few per window.

    Time buckets are folded whole once they stop receiving keys (the hot bucket of the current
    span is left alone: folding it every window would rewrite it every window), by
    concatenating their segments' bytes: no sort, and memory for the bucket's bytes only. Hash
    buckets receive keys every window, so only their small segments are folded (see
    ``tiered_fold``): segment sizes grow geometrically and each key is rewritten a logarithmic
    number of times."""
    if identity.partition != 0:
        return []
    crowded = sorted(
        (b for b, segments in manifest.buckets.items() if len(segments) > COMPACT_ABOVE_SEGMENTS),
        key=lambda b: -len(manifest.buckets[b]),
    )
    by_time = classifier.settings.buckets_by_time
    if by_time:
        hot = {
            b for wf in manifest.files.values() if wf.window == manifest.version for b in wf.buckets
        }
        hot.update(np.unique(new.buckets).tolist())  # a bucket keeps one segment per file
        crowded = [b for b in crowded if b not in hot]
    folds: list[Fold] = []
    for bucket in crowded:
        if len(folds) == COMPACT_BUCKETS_PER_WINDOW:
            break
        segments = sorted(manifest.buckets[bucket], key=lambda s: s.count)
        if by_time:
            folds.append(Fold(bucket, segments, raw=manager.store.fetch(segments)))
            continue
        segments = tiered_fold(segments)
        if len(segments) > 1:
            keys = manager.read_segments(segments).alive(classifier.expiry_point)
            folds.append(Fold(bucket, segments, keys=keys))
    return folds


def tiered_fold(segments: list[Segment]) -> list[Segment]:
    """Of a hash bucket's segments, smallest first, those to fold: the two smallest, then each
    next one while it holds no more keys than those taken so far together.

    A key folded after the first two thus lands in a segment at least twice the size of the one
    it left, and the two smallest are a window's few keys or earlier folds of similar size, so
    a key is rewritten a logarithmic number of times (3.3 on average over a simulated day of
    one-minute windows into 64 buckets). Folding all but the 4 largest instead rewrote about a
    fifth of the bucket at every compaction: 18 rewrites a key over that day, and a cost per
    window that grew with the store."""
    taken = segments[:2]
    total = sum(s.count for s in taken)
    for segment in segments[2:]:
        if segment.count > total:
            break
        taken.append(segment)
        total += segment.count
    return taken


def _write_new_keys(
    store: BucketStore,
    manifest: Manifest,
    classifier: WindowClassifier,
    new: NewKeys,
    identity: TaskIdentity,
    summary: TaskSummary,
    folds: list[Fold],
) -> None:
    summary.new_keys = len(new.h1)
    h1, h2, buckets, stamps = new.h1, new.h2, new.buckets, new.stamps
    for fold in folds:
        summary.supersedes[fold.bucket] = [s.ident for s in fold.segments]
        if fold.keys is not None:
            keys = fold.keys
            h1, h2 = np.concatenate([h1, keys.h1]), np.concatenate([h2, keys.h2])
            buckets = np.concatenate([buckets, np.full(len(keys), fold.bucket, dtype=np.int64)])
            if stamps is not None and keys.stamps is not None:
                stamps = np.concatenate([stamps, keys.stamps.astype(stamps.dtype)])
    window = manifest.version + 1
    name = window_file_name(window, identity.partition)
    data, segments = encode_segments(buckets, h1, h2, stamps, name)
    file_max = None
    if stamps is not None and len(stamps):
        # Provisional (negative) category numbers and window times are resolved by the commit.
        provisional = classifier.settings.mode in ("categorical", "systemTime")
        known = stamps[stamps >= 0] if provisional else stamps
        file_max = known.max().item() if len(known) else None
    chunks: list[bytes | memoryview] = [data]
    nbytes, count = len(data), len(h1)
    dtype = stamp_dtype(classifier.settings)
    for fold in folds:
        if fold.raw is None:
            continue
        paths = [store.data_path(s.file) for s in fold.segments]
        parts, segment, top = concat_segments(
            fold.raw, fold.segments, dtype, paths, name, nbytes, classifier.expiry_point
        )
        if segment is None:
            continue  # every folded key is expired: the folded segments just leave the index
        chunks.extend(parts)
        segments[fold.bucket] = segment
        nbytes += segment.length
        count += segment.count
        if top is not None:
            file_max = top if file_max is None else max(file_max, top)
    if not segments:
        return  # no new keys, or folds that left nothing: the commit only drops what they replaced
    store.write_window_file(name, chunks)
    summary.window_file = WindowFile(
        name=name,
        window=window,
        partition=identity.partition,
        keys=count,
        nbytes=nbytes,
        buckets=sorted(segments),
        max_stamp=file_max,
        local_categories=list(classifier.new_categories),
    )
    summary.segments = segments
