"""Compaction: folding a bucket's many small segments into one, so the index stays bounded.

Every window adds one segment per bucket it touched, per task. Without folding, a bucket's
segments (and so the manifest, and a cold bucket's reads) would grow with the number of windows.
The task of partition 0 folds up to ``COMPACT_BUCKETS_PER_WINDOW`` buckets that have more than
``COMPACT_ABOVE_SEGMENTS`` segments, writing each fold as one segment of its own window file;
the commit replaces the folded segments with it (``nextversion.apply_compaction``).

* **Time buckets** (tupleTime and ordered under Assumption 1) stop receiving keys once their
  span has passed, so they are folded whole then (the current span's bucket is left alone:
  folding it every window would rewrite it every window), by concatenating the segments'
  bytes lane by lane: nothing decoded or sorted, memory for the bucket's bytes only.
* **Hash buckets** (the other modes) receive keys every window, so only their small segments
  are folded (``tiered_fold``): segment sizes grow geometrically and each key is rewritten a
  logarithmic number of times.

Either way keys at or below the expiry point are left out of the fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dedupsink.engine.classify import NewKeys, WindowClassifier, stamp_dtype
from dedupsink.engine.keyset import KeySet
from dedupsink.engine.settings import Settings
from dedupsink.store.cache import BucketManager
from dedupsink.store.format import (
    Manifest,
    Segment,
    SegmentBytes,
    WindowFile,
    concat_segments,
    encode_segments,
)
from dedupsink.store.store import BucketStore, window_file_name

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


@dataclass
class WrittenKeys:
    """A task's window file as the commit needs it: the file, its segments, what they fold."""

    window_file: WindowFile | None
    segments: dict[int, Segment]
    supersedes: dict[int, list[tuple[str, int]]]
    new_keys: int


def choose_folds(
    manager: BucketManager,
    manifest: Manifest,
    context: KeysContext,
    new: NewKeys,
    partition: int,
) -> list[Fold]:
    """The folds partition 0's task makes in this window (none for other partitions)."""
    if partition != 0:
        return []
    crowded = sorted(
        (b for b, segments in manifest.buckets.items() if len(segments) > COMPACT_ABOVE_SEGMENTS),
        key=lambda b: -len(manifest.buckets[b]),
    )
    by_time = context.settings.buckets_by_time
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
            keys = manager.read_segments(segments).alive(context.expiry_point)
            folds.append(Fold(bucket, segments, keys=keys))
    return folds


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


def write_window_file(
    store: BucketStore,
    manifest: Manifest,
    context: KeysContext,
    new: NewKeys,
    partition: int,
    folds: list[Fold],
) -> WrittenKeys:
    """Write the task's new keys and its folds as one window file (none if both are empty)."""
    written = WrittenKeys(None, {}, {}, len(new.h1))
    h1, h2, buckets, stamps = new.h1, new.h2, new.buckets, new.stamps
    for fold in folds:
        written.supersedes[fold.bucket] = [s.ident for s in fold.segments]
        if fold.keys is not None:
            keys = fold.keys
            h1, h2 = np.concatenate([h1, keys.h1]), np.concatenate([h2, keys.h2])
            buckets = np.concatenate([buckets, np.full(len(keys), fold.bucket, dtype=np.int64)])
            if stamps is not None and keys.stamps is not None:
                stamps = np.concatenate([stamps, keys.stamps.astype(stamps.dtype)])
    window = manifest.version + 1
    name = window_file_name(window, partition)
    data, segments = encode_segments(buckets, h1, h2, stamps, name)
    file_max = _known_max(stamps, context.settings)
    chunks: list[bytes | memoryview] = [data]
    nbytes, count = len(data), len(h1)
    dtype = stamp_dtype(context.settings)
    for fold in folds:
        if fold.raw is None:
            continue
        paths = [store.data_url(s.file) for s in fold.segments]
        parts, segment, top = concat_segments(
            fold.raw, fold.segments, dtype, paths, name, nbytes, context.expiry_point
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
        return written  # no new keys, or folds that left nothing: the commit drops the folded
    store.write_window_file(name, chunks)
    written.window_file = WindowFile(
        name=name,
        window=window,
        partition=partition,
        keys=count,
        nbytes=nbytes,
        buckets=sorted(segments),
        max_stamp=file_max,
        local_categories=list(context.new_categories),
    )
    written.segments = segments
    return written


def _known_max(stamps: np.ndarray | None, settings: Settings) -> float | None:
    """The largest stamp the task knows; provisional (negative) category numbers and window
    times are resolved by the commit."""
    if stamps is None or not len(stamps):
        return None
    provisional = settings.mode in ("categorical", "systemTime")
    known = stamps[stamps >= 0] if provisional else stamps
    return known.max().item() if len(known) else None
