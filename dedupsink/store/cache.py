"""The bucket manager: an LRU cache of decoded buckets in front of the bucket store.

One manager per store lives in each executor Python process between micro-batches, so a warm
bucket costs only the segments committed since it was loaded. Only segments a committed
manifest references are loaded, so a cached bucket answers as one built afresh. A task notes
what it wrote (``note_written``): when the next manifest references that very segment, the
manager still reads and checks it but takes its keys from memory instead of decoding them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from dedupsink.engine.classify import NewKeys
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.keyset import FILTER_FROM_KEYS, KeyFilter, KeySet
from dedupsink.runtime import RUNTIME
from dedupsink.store.format import (
    DecodedSegment,
    Manifest,
    Segment,
    SegmentBytes,
    check_segment,
    decode_segment,
    group_by_bucket,
    segment_ident,
)
from dedupsink.store.store import BucketStore


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    evictions: int
    size: int
    capacity: int
    nbytes: int = 0


@dataclass
class CachedBucket:
    """A bucket's keys as a few sorted sets: *sealed* parts (never merged again, so no merge
    rewrites more than ``SEAL_AT`` keys), the bulk, and the keys added since in runs of
    decreasing size (``recent``). New keys merge into the smallest run, which folds into the
    next larger at a fraction of it (``_fold_ratio``): a window's new keys cost in proportion
    to themselves, not to the bucket. Sealed parts shed expired keys (``_alive_sealed``)."""

    keys: KeySet
    segments: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    recent: tuple[KeySet, ...] = ()
    sealed: tuple[KeySet, ...] = ()
    # Counted once: the cache reads it at every store, and the sets never change.
    nbytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(part.nbytes for part in self.sets)

    def __len__(self) -> int:
        return sum(len(part) for part in self.sets)

    @property
    def sets(self) -> tuple[KeySet, ...]:
        return (*self.sealed, self.keys, *self.recent)

    def contains(self, fps: Fingerprints, forget_at_or_below: float | None) -> np.ndarray:
        """Which of these queries, sorted by ``h1``, the bucket remembers, newest keys first:
        re-sent keys are mostly recent ones, found in the small runs, and only the rest need the
        large sets, whose search costs a cache miss at most steps: before a large set the
        queries already answered are picked out. For a small set or a few queries, picking
        out costs more than it spares. Each binary search narrows the next, the queries being
        sorted."""
        found = np.zeros(len(fps), dtype=bool)
        rows: np.ndarray | None = None  # the positions of ``queries`` in ``fps`` (None: all)
        queries = fps
        for keys in reversed(self.sets):
            if len(keys) >= FILTER_FROM_KEYS and len(queries) >= _PICK_OUT_FROM_QUERIES:
                still = np.flatnonzero(~found) if rows is None else rows[~found[rows]]
                if len(still) < len(queries):
                    rows, queries = still, fps.take(still)
            hit = keys.contains(queries, forget_at_or_below, presorted=True)
            if rows is None:
                found |= hit
            else:
                found[rows[hit]] = True
            if found.all():  # past the filter, most queries left are re-sends of recent keys
                break
        return found

    def highest(self, fps: Fingerprints) -> np.ndarray:
        """Each query's largest stamp in this bucket (queries sorted by ``h1``)."""
        return np.maximum.reduce([keys.highest(fps) for keys in self.sets])

    def added(
        self, parts: list[KeySet], segments: frozenset[tuple[str, int]], forget: float | None
    ) -> CachedBucket:
        added = sum(len(part) for part in parts)
        sealed = self.sealed if forget is None else _alive_sealed(self.sealed, forget)
        if not added:
            return CachedBucket(self.keys, segments, self.recent, sealed)
        new = parts[0]
        for part in parts[1:]:
            new = new.merge(part)
        runs = [self.keys, *self.recent]
        if len(runs) < _RUNS:
            runs.append(new)
        else:
            runs[-1] = runs[-1].merge(new)
        ratio = _fold_ratio(len(self.keys), added)
        while len(runs) > 1 and len(runs[-1]) * ratio >= len(runs[-2]):
            smallest = runs.pop()
            runs[-1] = runs[-1].merge(smallest)
        bulk = runs[0] if runs[0] is self.keys else runs[0].alive(forget)
        recent = runs[1:]
        if len(bulk) >= SEAL_AT:
            sealed = (*sealed, bulk)
            bulk = recent.pop(0) if recent else KeySet.empty(bulk.stamp_dtype)
        return CachedBucket(bulk, segments, tuple(recent), sealed)

    def unheld(self, part: KeySet) -> KeySet:
        """The keys of ``part`` this bucket does not already hold with at least their stamp:
        a compacted segment's keys are mostly the folded segments' again."""
        held = np.zeros(len(part), dtype=bool)
        for keys in self.sets:
            held |= part.held_in(keys)
        return part.without(held) if held.any() else part

    def merged(self) -> KeySet:
        keys = self.keys
        for part in (*self.sealed, *self.recent):
            keys = keys.merge(part)
        return keys


def _alive_sealed(sealed: tuple[KeySet, ...], forget: float) -> tuple[KeySet, ...]:
    """Sealed parts without their expired keys: a part whose every key expired leaves, and one
    whose expired keys reach an eighth of it is filtered (about what a bulk held, rebuilt at
    each fold of its largest run, an eighth to a quarter of it). A sealed part spans hours of a
    day's keys, so kept whole until its last key expired, it held up to half a period of dead
    keys: a 20,000-row stream's second day outgrew a cache sized for one period and thrashed."""
    shed = (part.alive(forget) if part.an_eighth_expired(forget) else part for part in sealed)
    return tuple(part for part in shed if len(part))


# A bucket's bulk is sealed from this many keys (see ``CachedBucket``): merges up to about this
# size still take the faster sorted way (``keyset._SORT_UP_TO``); bench/RESULTS.md,
# "Measurements behind design choices", has what sealing saved.
SEAL_AT = 1 << 18
# Below this many queries a bucket's search gives every set all of them (see ``contains``).
_PICK_OUT_FROM_QUERIES = 16
# Folding at a quarter keeps a window's merge cost flat through a time bucket's hour (bench/
# RESULTS.md, "Measurements behind design choices").
_FOLD_RATIO = 4
_RUNS = 3


def _fold_ratio(bulk: int, added: int) -> float:
    """Fold a run into the next larger once it reaches ``1 / ratio`` of it. With ``k`` runs in
    ratio ``r`` merging costs about ``k * r * added`` keys a window, least at
    ``r = (bulk / added) ** (1 / k)``: a hash bucket, which gets a few keys every window, needs
    more than a time bucket's fixed quarter (bench/RESULTS.md, "Figures formerly in code
    comments")."""
    return max(_FOLD_RATIO, (bulk / (2 * added)) ** (1 / _RUNS))


class BucketCache:
    """A thread-safe LRU of buckets, bounded by a number of buckets and by their bytes, which
    count the bytes ``reserve``d for the manager's filter.

    The bucket stored last is never evicted, so one bucket larger than the byte bound is still
    served from memory while it stays in use (only it is kept)."""

    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, CachedBucket] = OrderedDict()
        self._nbytes = 0
        self._reserved = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def get(self, bucket: int) -> CachedBucket | None:
        with self._lock:
            entry = self._entries.get(bucket)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(bucket)
            self.hits += 1
            return entry

    def put(self, bucket: int, entry: CachedBucket) -> None:
        with self._lock:
            previous = self._entries.pop(bucket, None)
            if previous is not None:
                self._nbytes -= previous.nbytes
            self._entries[bucket] = entry
            self._nbytes += entry.nbytes
            self._evict_over_bounds()

    def reserve(self, nbytes: int) -> None:
        """Count these bytes (the manager's filter) against the byte bound."""
        with self._lock:
            self._nbytes += nbytes - self._reserved
            self._reserved = nbytes
            self._evict_over_bounds()

    def keys_held(self, at_least: int) -> int:
        """The keys of the cached buckets holding at least this many."""
        with self._lock:
            return sum(len(entry) for entry in self._entries.values() if len(entry) >= at_least)

    def _evict_over_bounds(self) -> None:
        while len(self._entries) > 1 and self._over_bounds():
            _, evicted = self._entries.popitem(last=False)
            self._nbytes -= evicted.nbytes
            self.evictions += 1

    def _over_bounds(self) -> bool:
        too_many = len(self._entries) > self.capacity
        return too_many or (self.max_bytes is not None and self._nbytes > self.max_bytes)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._nbytes = self._reserved

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(
                self.hits,
                self.misses,
                self.evictions,
                len(self._entries),
                self.capacity,
                self._nbytes,
            )

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._nbytes


class BucketsFilter:
    """One ``KeyFilter`` over a manager's large cached buckets (``FILTER_FROM_KEYS`` keys or
    more), probed once a lookup, not once a bucket (per bucket, its numpy calls cost what the
    searches it spared did). Only a *covered* bucket (all its cached keys added) has queries
    turned away. When full it is replaced by a larger one, which covers each bucket afresh at
    its next load. Its bytes count against the cache's byte bound."""

    def __init__(self) -> None:
        self._filter: KeyFilter | None = None
        self._covered: set[int] = set()
        self._room = 0  # keys that may still be added before the filter is replaced
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return 0 if self._filter is None else self._filter.bits.nbytes

    def cover(
        self,
        entries: dict[int, CachedBucket],
        new: dict[int, list[KeySet]],
        cached_keys: Callable[[], int],
    ) -> None:
        """Keep covered the buckets in ``entries`` (their versions about to be cached), which
        gained the keys in ``new``, and cover those grown large. ``cached_keys``: the keys of
        the large buckets cached, which size a new filter."""
        with self._lock:
            sets, covering = self._to_add(entries, new)
            count = sum(len(keys) for keys in sets)
            if count and (self._filter is None or count > self._room):
                self._covered.clear()
                sets, covering = self._to_add(entries, new)
                count = sum(len(keys) for keys in sets)
                self._filter = KeyFilter(max(cached_keys(), count) * 3 // 2)
                self._room = self._filter.capacity
            if count and self._filter is not None:
                _add_all(self._filter, sets)
                self._room -= count
            self._covered |= covering

    def _to_add(
        self, entries: dict[int, CachedBucket], new: dict[int, list[KeySet]]
    ) -> tuple[list[KeySet], set[int]]:
        sets: list[KeySet] = []
        covering: set[int] = set()
        for bucket, entry in entries.items():
            if bucket in self._covered:
                sets.extend(new[bucket])
            elif len(entry) >= FILTER_FROM_KEYS:
                sets.extend(entry.sets)
                covering.add(bucket)
        return sets, covering

    def passing(self, buckets: list[int], fps: Fingerprints) -> tuple[np.ndarray, list[bool]]:
        """Which of these queries may be held, and which of these buckets that answer holds
        for (the others' queries must all be searched). The buckets are read with the filter
        they are covered by: a filter replaced meanwhile leaves this one's bits as they were."""
        with self._lock:
            key_filter = self._filter
            covered = [bucket in self._covered for bucket in buckets]
        if key_filter is None or not any(covered):
            return np.ones(len(fps), dtype=bool), [False] * len(buckets)
        return key_filter.may_contain(fps.h1, fps.h2), covered


def _add_all(key_filter: KeyFilter, sets: list[KeySet]) -> None:
    """Add the keys of these sets: the small ones (a window's new keys) in one call, the large
    ones (buckets being covered) each in its own, so covering every bucket never copies them all."""
    small: list[KeySet] = []
    for keys in sets:
        if len(keys) < FILTER_FROM_KEYS:
            small.append(keys)
        else:
            key_filter.add(keys.h1, keys.h2)
    if small:
        key_filter.add(np.concatenate([k.h1 for k in small]), np.concatenate([k.h2 for k in small]))


_NOTED_BYTES_PER_KEY = 24  # two 64-bit fingerprint words and a stamp
_NOTES_WITHOUT_BOUND = 64 << 20


@dataclass(frozen=True)
class WrittenSegment:
    """A segment a task of this process wrote: its new keys as stored (stamps possibly
    provisional) and the segments it folds."""

    new: DecodedSegment
    folds: frozenset[tuple[str, int]]


class BucketManager:
    """Answers "is this key remembered?" for one committed manifest, through the cache."""

    def __init__(
        self, store: BucketStore, cache: BucketCache, stamp_dtype: np.dtype | None
    ) -> None:
        self.store = store
        self.cache = cache
        self.stamp_dtype = stamp_dtype
        self.manifest: Manifest | None = None
        self.filter = BucketsFilter()
        self._written: dict[Segment, tuple[int, WrittenSegment]] = {}
        self._noted_bytes = 0
        self._written_lock = threading.Lock()

    def use(self, manifest: Manifest) -> BucketManager:
        self.manifest = manifest
        with self._written_lock:
            # Kept for the version that commits them; older notes were committed or lost.
            stale = [s for s, (window, _) in self._written.items() if window < manifest.version]
            for segment in stale:
                self._drop_note(segment)
        return self

    def note_written(
        self,
        window: int,
        new: NewKeys,
        segments: dict[int, Segment],
        folds: dict[int, list[tuple[str, int]]],
    ) -> None:
        """Remember what a task wrote as ``window`` (its new keys, the segments holding them
        and the segments each folds), for when a manifest references it.

        Notes take at most an eighth of the cache's byte bound, the newest kept: a batch
        write's tasks all note the same window, and a large task's notes would otherwise add
        its whole key set to the worker's memory."""
        nbytes = _NOTED_BYTES_PER_KEY * len(new.h1)
        budget = (self.cache.max_bytes or _NOTES_WITHOUT_BOUND) // 8
        if not segments or nbytes > budget:
            return
        rows = _rows_by_bucket(new.buckets)
        empty = np.empty(0, dtype=np.int64)
        with self._written_lock:
            for bucket, segment in segments.items():
                mine = rows.get(bucket, empty)
                stamps = None if new.stamps is None else new.stamps[mine]
                keys = DecodedSegment(new.h1[mine], new.h2[mine], stamps)
                written = WrittenSegment(keys, frozenset(folds.get(bucket, [])))
                self._written[segment] = (window, written)
            self._noted_bytes += nbytes
            while self._noted_bytes > budget and self._written:
                self._drop_note(next(iter(self._written)))  # the oldest

    def _drop_note(self, segment: Segment) -> None:
        """Forget one note (the lock is held)."""
        _, written = self._written.pop(segment)
        self._noted_bytes -= _NOTED_BYTES_PER_KEY * len(written.new.h1)

    def _noted(self, segment: Segment, held: frozenset[tuple[str, int]]) -> WrittenSegment | None:
        """What this process wrote as ``segment``, if it did and a cached bucket holding
        ``held`` holds every segment it folds."""
        with self._written_lock:
            noted = self._written.get(segment)
        return noted[1] if noted is not None and noted[1].folds <= held else None

    def remembered(
        self, buckets: np.ndarray, fps: Fingerprints, forget_at_or_below: float | None
    ) -> np.ndarray:
        found = np.zeros(len(fps), dtype=bool)
        if len(fps) == 0:
            return found
        # Grouped by bucket, in h1 order within each: every bucket's queries arrive sorted.
        by_h1 = None if _ascending(fps.h1) else np.argsort(fps.h1)
        order, spans = group_by_bucket(buckets, within=by_h1)
        grouped = fps.take(order)
        # Fetch at most maxCachedBuckets buckets at a time: the count bound holds within one
        # lookup too (the byte bound is enforced as buckets are stored).
        for first in range(0, len(spans), self.cache.capacity):
            chunk = spans[first : first + self.cache.capacity]
            chunk_buckets = [bucket for bucket, _, _ in chunk]
            loaded = self.load(chunk_buckets, forget_at_or_below)
            low, high = chunk[0][1], chunk[-1][2]
            rows, queries = order[low:high], grouped[low:high]
            edges = [start - low for _, start, _ in chunk] + [high - low]
            passing, covered = self.filter.passing(chunk_buckets, queries)
            if any(covered):
                # The queries the filter lets through, picked out for all buckets at once:
                # a bucket's own pick-out cost more calls than its few remaining searches.
                for (_, start, end), filtered in zip(chunk, covered, strict=True):
                    if not filtered:
                        passing[start - low : end - low] = True
                kept = np.flatnonzero(passing)
                rows, queries = rows[kept], queries.take(kept)
                edges = np.searchsorted(kept, edges).tolist()
            for (bucket, _, _), (start, end) in zip(chunk, pairwise(edges), strict=True):
                if start < end:
                    found[rows[start:end]] = loaded[bucket].contains(
                        queries[start:end], forget_at_or_below
                    )
        return found

    def highest(self, buckets: np.ndarray, fps: Fingerprints) -> np.ndarray:
        """Each query's largest remembered stamp (``KeyIndex.highest``): sequence dedup's
        lookup of its producers, few, so without the filter ``remembered`` passes them by."""
        found = np.empty(len(fps), dtype=np.int64)
        by_h1 = None if _ascending(fps.h1) else np.argsort(fps.h1)
        order, spans = group_by_bucket(buckets, within=by_h1)
        for first in range(0, len(spans), self.cache.capacity):
            chunk = spans[first : first + self.cache.capacity]
            loaded = self.load([bucket for bucket, _, _ in chunk], None)
            for bucket, start, end in chunk:
                rows = order[start:end]
                found[rows] = loaded[bucket].highest(fps.take(rows))
        return found

    def load(self, buckets: list[int], forget_at_or_below: float | None) -> dict[int, CachedBucket]:
        """The committed keys of these buckets, fetching missing segments in parallel."""
        assert self.manifest is not None, "use(manifest) before lookups"
        entries: dict[int, CachedBucket] = {}
        live: dict[int, frozenset[tuple[str, int]]] = {}
        missing: list[tuple[int, Segment]] = []
        additions: dict[int, list[KeySet]] = {}
        compacted: set[int] = set()
        noted: dict[Segment, KeySet] = {}
        for bucket in buckets:
            caught = self._catch_up(bucket)
            entry, fresh, known = caught.entry, caught.fresh, caught.noted
            if caught.stale and 2 * sum(s.count for s in fresh) >= len(entry):
                # The bucket was compacted: re-reading it beats merging every key twice.
                entry = CachedBucket(KeySet.empty(self.stamp_dtype))
                fresh, known = self.manifest.buckets.get(bucket, []), {}
            elif caught.stale:
                compacted.add(bucket)
            entries[bucket], live[bucket], additions[bucket] = entry, caught.live, []
            noted.update(known)
            missing.extend((bucket, segment) for segment in [*fresh, *known])
        fetched = self.store.fetch([segment for _, segment in missing])
        for (bucket, segment), raw in zip(missing, fetched, strict=True):
            if segment in noted:
                check_segment(raw, segment, self.stamp_dtype, self.store.data_url(segment.file))
                additions[bucket].append(noted[segment])
                continue
            part = self._decode(raw, segment)
            additions[bucket].append(entries[bucket].unheld(part) if bucket in compacted else part)
        result = {
            bucket: entry.added(additions[bucket], live[bucket], forget_at_or_below)
            if additions[bucket]
            else entry
            for bucket, entry in entries.items()
        }
        self.filter.cover(result, additions, lambda: self.cache.keys_held(FILTER_FROM_KEYS))
        self.cache.reserve(self.filter.nbytes)
        for bucket, entry in result.items():
            self.cache.put(bucket, entry)
        return result

    def _catch_up(self, bucket: int) -> _CatchUp:
        """A bucket's cached entry against the manifest."""
        assert self.manifest is not None
        entry = self.cache.get(bucket)
        if entry is None:
            entry = CachedBucket(KeySet.empty(self.stamp_dtype))
        segments = self.manifest.buckets.get(bucket, [])
        # Every task catches up every bucket it looks up, against all of its segments (a dozen
        # a bucket late in a day of hash buckets): set operations over the idents, not a loop.
        live = frozenset(map(segment_ident, segments))
        stale = entry.segments - live
        fresh: list[Segment] = []
        noted: dict[Segment, KeySet] = {}
        for segment in _unheld(segments, live - entry.segments):
            written = self._noted(segment, entry.segments)
            if written is None:
                fresh.append(segment)
            else:
                noted[segment] = self._final(written.new, segment)
                stale -= written.folds
        return _CatchUp(entry, live, fresh, noted, stale)

    def read_segments(self, segments: list[Segment]) -> DecodedSegment:
        """The keys of these committed segments with their final stamps, in stored order, read
        from the store (the cache is not used)."""
        parts = [
            self._resolved(raw, segment)
            for segment, raw in zip(segments, self.store.fetch(segments), strict=True)
        ]
        stamps = None
        if self.stamp_dtype is not None:
            stamps = np.concatenate([p.stamps for p in parts] or [np.empty(0, self.stamp_dtype)])
        empty = [np.empty(0, np.uint64)]
        return DecodedSegment(
            np.concatenate([p.h1 for p in parts] or empty),
            np.concatenate([p.h2 for p in parts] or empty),
            stamps,
        )

    def _decode(self, raw: SegmentBytes, segment: Segment) -> KeySet:
        return self._final(self._resolved(raw, segment), segment)

    def _final(self, keys: DecodedSegment, segment: Segment) -> KeySet:
        """A segment's keys, as stored, as a sorted set with their final stamps."""
        resolved = self._resolved_stamps(keys, segment)
        return KeySet.build(resolved.h1, resolved.h2, resolved.stamps)

    def _resolved(self, raw: SegmentBytes, segment: Segment) -> DecodedSegment:
        """A segment's keys with their final stamps, in stored order."""
        decoded = decode_segment(raw, segment, self.stamp_dtype, self.store.data_url(segment.file))
        return self._resolved_stamps(decoded, segment)

    def _resolved_stamps(self, keys: DecodedSegment, segment: Segment) -> DecodedSegment:
        assert self.manifest is not None
        stamps = keys.stamps
        window_file = self.manifest.files[segment.file]
        if stamps is not None and window_file.local_categories:
            stamps = _resolve_categories(stamps, window_file.local_categories, self.manifest)
        if (
            stamps is not None
            and window_file.max_stamp is not None
            and self.manifest.settings.mode == "systemTime"
        ):
            # A placeholder stamp means the time of the window that stored the key: the file's.
            stamps = np.where(stamps < 0, window_file.max_stamp, stamps)
        return DecodedSegment(keys.h1, keys.h2, stamps)


class _CatchUp(NamedTuple):
    """A cached bucket against a manifest: the manifest's segments of it (``live``), the
    segments to decode (``fresh``), those whose new keys were noted in memory (with those
    keys), and the segments the entry holds that the manifest no longer lists and no noted
    fold accounts for (``stale``)."""

    entry: CachedBucket
    live: frozenset[tuple[str, int]]
    fresh: list[Segment]
    noted: dict[Segment, KeySet]
    stale: frozenset[tuple[str, int]]


def _unheld(segments: list[Segment], unheld: frozenset[tuple[str, int]]) -> list[Segment]:
    """The segments whose idents are in ``unheld``, in the manifest's order. A commit appends
    a window's segments, so they are looked for from the end."""
    found: list[Segment] = []
    if unheld:
        for segment in reversed(segments):
            if segment_ident(segment) in unheld:
                found.append(segment)
                if len(found) == len(unheld):
                    break
        found.reverse()
    return found


def _ascending(values: np.ndarray) -> bool:
    return bool((values[1:] >= values[:-1]).all())


def _rows_by_bucket(buckets: np.ndarray) -> dict[int, np.ndarray]:
    """The positions of each bucket's keys."""
    order, spans = group_by_bucket(buckets)
    return {bucket: order[start:end] for bucket, start, end in spans}


def _resolve_categories(stamps: np.ndarray, local: list[str], manifest: Manifest) -> np.ndarray:
    """Replace a file's provisional category numbers (-1, -2, ...) with committed ordinals."""
    ordinals = manifest.category_ordinals()
    table = np.array([ordinals[name] for name in local], dtype=np.int64)
    provisional = stamps < 0
    if not provisional.any():
        return stamps
    resolved = stamps.copy()
    resolved[provisional] = table[-1 - stamps[provisional]]
    return resolved


# Each store's bucket manager in this process, by store URL and id (``manager_for``).
_managers_lock = threading.Lock()
_managers: dict[tuple[str, str], BucketManager] = RUNTIME.cache(
    "store.bucket_managers", dict, _managers_lock
)


def manager_for(
    store: BucketStore,
    manifest: Manifest,
    capacity: int,
    stamp_dtype: np.dtype | None,
    max_bytes: int | None = None,
) -> BucketManager:
    """This process's manager for a store (keyed by the store's unique id, not just its URL)."""
    key = (store.url, manifest.store_id)
    with _managers_lock:
        manager = _managers.get(key)
        bounds = (capacity, max_bytes)
        if manager is None or (manager.cache.capacity, manager.cache.max_bytes) != bounds:
            manager = BucketManager(store, BucketCache(capacity, max_bytes), stamp_dtype)
            _managers[key] = manager
    return manager.use(manifest)
