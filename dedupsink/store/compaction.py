"""Compaction: folding a bucket's many small segments into one, so the index stays bounded.

Every window adds one segment per bucket it touched, per task. Without folding, a bucket's
segments (and so the manifest, and a cold bucket's reads) would grow with the number of windows.
The task of partition 0 folds up to ``COMPACT_BUCKETS_PER_WINDOW`` buckets that have more than
``COMPACT_ABOVE_SEGMENTS`` segments, writing each fold as one segment of its own window file;
the commit replaces the folded segments with it (``transaction.FoldSegments``).

* **Time buckets** (tupleTime and ordered under Assumption 1) stop receiving keys once their
  span has passed, so they are folded whole then (the current span's bucket is left alone:
  folding it every window would rewrite it every window).
* **Hash buckets** (the other modes) receive keys every window, so only their small segments
  are folded (``tiered_fold``): segment sizes grow geometrically and each key is rewritten a
  logarithmic number of times. The window's own new keys for the bucket join the fold, as a
  file holds one segment per bucket.

Either way a fold concatenates the segments lane by lane and sorts nothing (readers sort, and
keep a key's largest stamp if a bucket holds it twice: a forgotten key seen again). Where
stamps are final it concatenates their bytes, nothing decoded; in categorical and systemTime a
file's stamps may be provisional, meaningful only with its own index entry, so there the fold
decodes them to their final values. Keys at or below the expiry point are left out: whole
segments of a time bucket, each key of a hash bucket (whose segments mix old and new keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dedupsink.engine.classify import NewKeys, WindowClassifier, stamp_dtype
from dedupsink.engine.expiry_policy import is_alive
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.placement import bucket_of
from dedupsink.engine.sequence import highest_per_producer
from dedupsink.engine.settings import Settings
from dedupsink.store.cache import BucketManager
from dedupsink.store.format import (
    DecodedSegment,
    Manifest,
    Segment,
    SegmentBytes,
    StampCounts,
    WindowFile,
    concat_segments,
    count_stamps,
    decode_segment,
    encode_segments,
    merge_stamp_counts,
)
from dedupsink.store.store import BucketStore, window_file_name

COMPACT_ABOVE_SEGMENTS = 8
COMPACT_BUCKETS_PER_WINDOW = 8


@dataclass
class Fold:
    """Segments of one bucket to rewrite as one: as their stored bytes, or (provisional
    stamps) as their decoded keys, already without the expired ones; with each segment's stamp
    counts (None where its file records none: nothing to take them from)."""

    bucket: int
    segments: list[Segment]
    raw: Sequence[SegmentBytes] | None = None
    keys: DecodedSegment | None = None
    stamp_counts: list[StampCounts | None] = field(default_factory=list)


@dataclass
class WrittenWindowFile:
    """A task's window file as the commit needs it: the file, its segments, what they fold
    and the stamp counts of the folded segments (by segment identity), which leave their files'
    (``transaction.FoldSegments``)."""

    window_file: WindowFile | None
    segments: dict[int, Segment]
    supersedes: dict[int, list[tuple[str, int]]]
    new_keys: int
    folded_stamps: dict[tuple[str, int], StampCounts | None] = field(default_factory=dict)


def choose_folds(
    manager: BucketManager,
    manifest: Manifest,
    context: KeysContext,
    new: NewKeys,
    partition: int,
) -> list[Fold]:
    """The folds partition 0's task makes in this window (none for other partitions; none in
    sequence dedup, whose commit folds every bucket the window touched: ``fold_producers``)."""
    if partition != 0 or context.settings.by_sequence:
        return []
    crowded = sorted(
        (b for b, segments in manifest.buckets.items() if len(segments) > COMPACT_ABOVE_SEGMENTS),
        key=lambda b: -len(manifest.buckets[b]),
    )
    by_time = context.settings.buckets_by_time
    if by_time:
        newest = [f for f in manifest.files.values() if f.version == manifest.version]
        hot = {bucket for window_file in newest for bucket in window_file.buckets}
        hot.update(np.unique(new.buckets).tolist())  # a bucket keeps one segment per file
        crowded = [b for b in crowded if b not in hot]
    chosen: list[tuple[int, list[Segment]]] = []
    for bucket in crowded:
        if len(chosen) == COMPACT_BUCKETS_PER_WINDOW:
            break
        segments = sorted(manifest.buckets[bucket], key=lambda s: s.count)
        if not by_time:
            segments = tiered_fold(segments)
        if len(segments) >= 2:
            chosen.append((bucket, segments))
    if context.settings.provisional_stamps:
        return [_decoded_fold(manager, manifest, context, b, s) for b, s in chosen]
    return _raw_folds(manager, manifest, context, chosen)


def _counted(manifest: Manifest, segments: list[Segment]) -> list[bool]:
    return [manifest.files[s.file].stamp_counts is not None for s in segments]


def _decoded_fold(
    manager: BucketManager,
    manifest: Manifest,
    context: KeysContext,
    bucket: int,
    segments: list[Segment],
) -> Fold:
    read = manager.read_segments(segments)
    counts = _segment_stamp_counts(read.stamps, segments, _counted(manifest, segments))
    return Fold(bucket, segments, keys=_alive(read, context.expiry_point), stamp_counts=counts)


def _raw_folds(
    manager: BucketManager,
    manifest: Manifest,
    context: KeysContext,
    chosen: list[tuple[int, list[Segment]]],
) -> list[Fold]:
    """The folds' stored bytes, fetched in one call for all of them: the crowded buckets'
    segments lie in the same few window files, which one fetch reads once each, side by side
    (a fetch a bucket read each file once a bucket, one round trip after another)."""
    every = [segment for _, segments in chosen for segment in segments]
    fetched = iter(manager.store.fetch(every))
    dtype = stamp_dtype(context.settings)
    folds = []
    for bucket, segments in chosen:
        raw = [next(fetched) for _ in segments]
        counts = [
            _raw_stamp_counts(r, s, dtype) if wanted else None
            for r, s, wanted in zip(raw, segments, _counted(manifest, segments), strict=True)
        ]
        folds.append(Fold(bucket, segments, raw, stamp_counts=counts))
    return folds


def _segment_stamp_counts(
    stamps: np.ndarray | None, segments: list[Segment], counted: list[bool]
) -> list[StampCounts | None]:
    """Each segment's stamp counts, of their final stamps read back to back (where wanted)."""
    if stamps is None:
        return [None] * len(segments)
    ends = np.cumsum([s.count for s in segments]).tolist()
    starts = [0, *ends[:-1]]
    return [
        count_stamps(stamps[start:end]) if wanted else None
        for start, end, wanted in zip(starts, ends, counted, strict=True)
    ]


def _raw_stamp_counts(
    raw: SegmentBytes, segment: Segment, dtype: np.dtype | None
) -> StampCounts | None:
    """A stored segment's stamp counts (final stamps: modes whose stamps are never provisional)."""
    if dtype is None:
        return None
    little = np.dtype(dtype).newbyteorder("<")
    n = segment.count
    return count_stamps(np.frombuffer(raw, dtype=little, offset=16 * n, count=n))


def _alive(keys: DecodedSegment, forget_at_or_below: float | None) -> DecodedSegment:
    if forget_at_or_below is None or keys.stamps is None:
        return keys
    keep = is_alive(keys.stamps, forget_at_or_below)
    return DecodedSegment(keys.h1[keep], keys.h2[keep], keys.stamps[keep])


def tiered_fold(segments: list[Segment]) -> list[Segment]:
    """Of a hash bucket's segments, smallest first, those to fold: the two smallest, then each
    next one while it holds no more keys than those taken so far together.

    A key folded after the first two thus lands in a segment at least twice the size of the one
    it left, and the two smallest are a window's few keys or earlier folds of similar size, so
    a key is rewritten a logarithmic number of times. Folding all but the few largest instead
    rewrites a fixed fraction of the bucket at every compaction: a cost per window that grows
    with the store."""
    taken = segments[:2]
    total = sum(s.count for s in taken)
    for segment in segments[2:]:
        if segment.count > total:
            break
        taken.append(segment)
        total += segment.count
    return taken


@dataclass(frozen=True)
class KeysContext:
    """What writing a window file needs to know of the window: its settings, expiry point and
    the categories its task found new (provisional stamps -1, -2, ... index them)."""

    settings: Settings
    expiry_point: float | None
    new_categories: tuple[str, ...] = ()

    @classmethod
    def of(cls, classifier: WindowClassifier) -> KeysContext:
        return cls(classifier.settings, classifier.expiry_point, tuple(classifier.new_categories))


@dataclass
class _FileLayout:
    """A window file as it is laid out: its byte chunks, segments, size, keys, newest and
    oldest final stamps, and its stamp counts (provisional stamps as stored: the commit
    resolves them)."""

    name: str
    chunks: list[bytes | memoryview]
    segments: dict[int, Segment]
    nbytes: int
    count: int
    newest: float | None
    oldest: float | None
    stamp_counts: StampCounts | None

    def add(
        self,
        pieces: list[memoryview],
        bucket: int,
        segment: Segment,
        stamps: tuple[float | None, float | None],
        stamp_counts: StampCounts | None,
    ) -> None:
        self.chunks.extend(pieces)
        self.segments[bucket] = segment
        self.nbytes += segment.length
        self.count += segment.count
        top, low = stamps
        if top is not None:
            self.newest = top if self.newest is None else max(self.newest, top)
        if low is not None:
            self.oldest = low if self.oldest is None else min(self.oldest, low)
        self.stamp_counts = merge_stamp_counts([self.stamp_counts, stamp_counts])


def write_window_file(
    store: BucketStore,
    manifest: Manifest,
    context: KeysContext,
    new: NewKeys,
    partition: int,
    folds: list[Fold],
) -> WrittenWindowFile:
    """Write the task's new keys and its folds as one window file (none if both are empty)."""
    written = WrittenWindowFile(None, {}, {}, len(new.h1))
    for fold in folds:
        written.supersedes[fold.bucket] = [s.ident for s in fold.segments]
        counts = fold.stamp_counts or [None] * len(fold.segments)
        for segment, segment_counts in zip(fold.segments, counts, strict=True):
            written.folded_stamps[segment.ident] = segment_counts
    version = manifest.version + 1
    name = window_file_name(version, partition)
    keys = _with_decoded_folds(new, [(f.bucket, f.keys) for f in folds if f.keys is not None])
    byte_folds = [(fold, fold.raw) for fold in folds if fold.raw is not None]
    joining = np.isin(keys.buckets, [fold.bucket for fold, _ in byte_folds])
    data, segments = _encode(keys, ~joining, name)
    count = len(keys.h1) - int(joining.sum())
    known = _known(keys.stamps, context.settings)
    layout = _FileLayout(
        name,
        [data],
        segments,
        len(data),
        count,
        None if known is None else known.max().item(),
        None if known is None else known.min().item(),
        count_stamps(None if keys.stamps is None else keys.stamps[~joining]),
    )
    # The new keys of buckets folded as bytes join their folds, as segments of their own.
    joined = _encode(keys, joining, name)
    for fold, raw in byte_folds:
        _add_byte_fold(store, context, layout, fold, raw, joined)
    if not layout.segments:
        return written  # no new keys, or folds that left nothing: the commit drops the folded
    store.write_window_file(name, layout.chunks)
    written.window_file = WindowFile(
        name=name,
        version=version,
        partition=partition,
        keys=layout.count,
        nbytes=layout.nbytes,
        buckets=sorted(layout.segments),
        max_stamp=layout.newest,
        local_categories=list(context.new_categories),
        min_stamp=layout.oldest,
        stamp_counts=layout.stamp_counts,
    )
    written.segments = layout.segments
    return written


def _add_byte_fold(
    store: BucketStore,
    context: KeysContext,
    layout: _FileLayout,
    fold: Fold,
    raw: Sequence[SegmentBytes],
    joined: tuple[bytes | memoryview, dict[int, Segment]],
) -> None:
    """Append a fold made of stored bytes, the window's own new keys of its bucket first."""
    raws, parts = list(raw), list(fold.segments)
    paths = [store.data_url(s.file) for s in fold.segments]
    counts = list(fold.stamp_counts or [None] * len(parts))
    joined_bytes, joined_segments = joined
    dtype = stamp_dtype(context.settings)
    if fold.bucket in joined_segments:
        own = joined_segments[fold.bucket]
        raws.insert(0, joined_bytes[own.offset : own.offset + own.length])
        parts.insert(0, own)
        paths.insert(0, store.data_url(layout.name))
        counts.insert(0, _raw_stamp_counts(raws[0], own, dtype))
    each_key = not context.settings.buckets_by_time  # a hash bucket's segments mix old and new
    pieces, segment, top, low = concat_segments(
        raws, parts, dtype, paths, layout.name, layout.nbytes, context.expiry_point, each_key
    )
    if segment is not None:  # None: every folded key is expired, the segments just leave
        kept = _kept_stamp_counts(counts, context.expiry_point, each_key)
        layout.add(pieces, fold.bucket, segment, (top, low), kept)


def _kept_stamp_counts(
    counts: list[StampCounts | None], forget_at_or_below: float | None, each_key: bool
) -> StampCounts | None:
    """The stamp counts of what ``concat_segments`` keeps of segments with these counts: a
    segment whose every key is expired leaves; with ``each_key`` so does each expired key."""
    kept: list[StampCounts | None] = []
    for segment_counts in counts:
        if segment_counts is None or forget_at_or_below is None:
            kept.append(segment_counts)
            continue
        alive = tuple((s, n) for s, n in segment_counts if is_alive(s, forget_at_or_below))
        if alive:
            kept.append(alive if each_key else segment_counts)
    return merge_stamp_counts(kept)


def fold_producers(
    manager: BucketManager, base: Manifest, settings: Settings, written: list[WrittenWindowFile]
) -> WrittenWindowFile | None:
    """Sequence dedup's compaction, in the commit: every bucket the window's tasks wrote to
    becomes one segment holding each of its producers once, with its highest id (the base's
    keys and the tasks' merged, the largest stamp kept), superseding the base's segments and
    the tasks'. The store then holds one entry per producer after every window, whatever the
    number of rows, windows or partitions; the cost is a read and a write of the touched
    buckets' producers a window (bench/sequence.py)."""
    touched: dict[int, list[Segment]] = {}
    for task in written:
        for bucket, segment in task.segments.items():
            touched.setdefault(bucket, []).append(segment)
    if not touched:
        return None
    store, dtype = manager.store, stamp_dtype(settings)
    buckets = sorted(touched)
    lanes: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
    for first in range(0, len(buckets), manager.cache.capacity):
        chunk = [b for b in buckets[first : first + manager.cache.capacity] if b in base.buckets]
        for entry in manager.load(chunk, None).values():
            keys = entry.merged()  # one set, as the last fold left it, unless the cache split it
            lanes.append((keys.h1, keys.h2, keys.stamps))
    known = sum(len(h1) for h1, _, _ in lanes)  # producers the base held in these buckets
    new_segments = [segment for bucket in buckets for segment in touched[bucket]]
    for segment, raw in zip(new_segments, store.fetch(new_segments), strict=True):
        new = decode_segment(raw, segment, dtype, store.data_url(segment.file))
        lanes.append((new.h1, new.h2, new.stamps))
    # One grouped maximum over every touched bucket: a merge a bucket cost more in calls than
    # in keys (bench/RESULTS.md, "sequence.py").
    producers, highest = highest_per_producer(
        Fingerprints(
            np.concatenate([h1 for h1, _, _ in lanes]), np.concatenate([h2 for _, h2, _ in lanes])
        ),
        np.concatenate([stamps for _, _, stamps in lanes]),
    )
    folded = NewKeys(producers.h1, producers.h2, bucket_of(settings, producers, None), highest)
    result = write_window_file(store, base, KeysContext(settings, None), folded, 0, [])
    result.new_keys = len(folded.h1) - known  # the producers the window added (tasks count 0)
    result.supersedes = {
        bucket: [s.ident for s in (*base.buckets.get(bucket, []), *touched[bucket])]
        for bucket in buckets
    }
    return result


def share_written(
    manager: BucketManager, written: WrittenWindowFile, new: NewKeys, settings: Settings
) -> None:
    """Give the machine's shared copies the segments of the task's window file that hold its
    new keys alone, where their stamps are final already (not categorical or systemTime, whose
    stamps the commit resolves; not sequence dedup, whose commit supersedes them at once)."""
    if written.window_file is None or settings.provisional_stamps or settings.by_sequence:
        return
    order = np.argsort(new.buckets, kind="stable")
    buckets = new.buckets[order]
    for bucket, segment in written.segments.items():
        if bucket in written.supersedes:
            continue  # a fold: the bucket's older keys are in it too
        low, high = np.searchsorted(buckets, [bucket, bucket + 1])
        rows = order[low:high]
        stamps = None if new.stamps is None else new.stamps[rows]
        manager.share_written(segment, DecodedSegment(new.h1[rows], new.h2[rows], stamps))


def _with_decoded_folds(new: NewKeys, folds: list[tuple[int, DecodedSegment]]) -> NewKeys:
    """The new keys followed by the keys of folds made of decoded keys (bucket, keys)."""
    if not folds:
        return new
    parts = [keys for _, keys in folds]
    stamps = None
    if new.stamps is not None:
        dtype = new.stamps.dtype
        stamps = np.concatenate(
            [new.stamps, *(p.stamps.astype(dtype) for p in parts if p.stamps is not None)]
        )
    buckets = [np.full(len(keys.h1), bucket, dtype=np.int64) for bucket, keys in folds]
    return NewKeys(
        np.concatenate([new.h1, *(p.h1 for p in parts)]),
        np.concatenate([new.h2, *(p.h2 for p in parts)]),
        np.concatenate([new.buckets, *buckets]),
        stamps,
    )


def _encode(
    keys: NewKeys, rows: np.ndarray, name: str
) -> tuple[bytes | memoryview, dict[int, Segment]]:
    """The keys at ``rows`` laid out bucket after bucket (see ``encode_segments``)."""
    if rows.all():
        return encode_segments(keys.buckets, keys.h1, keys.h2, keys.stamps, name)
    stamps = None if keys.stamps is None else keys.stamps[rows]
    return encode_segments(keys.buckets[rows], keys.h1[rows], keys.h2[rows], stamps, name)


def _known(stamps: np.ndarray | None, settings: Settings) -> np.ndarray | None:
    """The stamps the task knows as final (None if none); provisional (negative) category
    numbers and window times are resolved by the commit."""
    if stamps is None or not len(stamps):
        return None
    known = stamps[stamps >= 0] if settings.provisional_stamps else stamps
    return known if len(known) else None
