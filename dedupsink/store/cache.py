"""The bucket manager: an LRU cache of buckets in front of the bucket store.

One manager per store lives in each executor Python process between micro-batches. A bucket is
one sorted set a committed segment; each set is a read-only map of the machine's shared copy of
its segment (``store/shared.py``), built once per machine and searched in place by every
process, so more task slots share one copy instead of holding one each. A warm bucket opens
only the segments committed since; only segments a committed manifest references are opened,
so a cached bucket answers as one built afresh. The bounds (``maxCachedBuckets``,
``maxCacheMemory``) apply to what a process holds privately: its Bloom filter and any set it
could not map.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.keyset import FILTER_FROM_KEYS, KeyFilter, KeySet
from dedupsink.engine.sequence import NO_SEQUENCE
from dedupsink.runtime import RUNTIME
from dedupsink.store.format import (
    DecodedSegment,
    Manifest,
    Segment,
    SegmentBytes,
    decode_segment,
    group_by_bucket,
    segment_ident,
)
from dedupsink.store.records import StateUse
from dedupsink.store.shared import SharedSegments, default_root
from dedupsink.store.store import BucketStore


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    evictions: int
    size: int
    capacity: int
    nbytes: int = 0  # private: the cached sets not mapped, and the filter
    mapped: int = 0  # the cached sets mapped from the machine's shared copies


@dataclass(frozen=True)
class CachedBucket:
    """A bucket's keys: one sorted set a committed segment, in the manifest's order (oldest
    first). A set is a map of the machine's shared copy of its segment (``store/shared.py``),
    or private where there is none (a tool's reader, a folder that cannot be written)."""

    parts: tuple[tuple[tuple[str, int], KeySet], ...] = ()
    # Counted once: the cache reads them at every store, and the sets never change.
    nbytes: int = field(init=False, repr=False, compare=False)  # private bytes
    mapped_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        private = sum(keys.nbytes for _, keys in self.parts if not keys.mapped)
        mapped = sum(keys.nbytes for _, keys in self.parts if keys.mapped)
        object.__setattr__(self, "nbytes", private)
        object.__setattr__(self, "mapped_bytes", mapped)

    @classmethod
    def of(cls, *sets: KeySet) -> CachedBucket:
        """A bucket of these sets, oldest first (segments of no file: tests and tools)."""
        return cls(tuple((("", i), keys) for i, keys in enumerate(sets)))

    def __len__(self) -> int:
        return sum(len(keys) for _, keys in self.parts)

    @property
    def sets(self) -> tuple[KeySet, ...]:
        return tuple(keys for _, keys in self.parts)

    @property
    def segments(self) -> frozenset[tuple[str, int]]:
        return frozenset(ident for ident, _ in self.parts)

    def contains(self, fps: Fingerprints, forget_at_or_below: float | None) -> np.ndarray:
        """Which of these queries, sorted by ``h1``, the bucket remembers, newest segments
        first: re-sent keys are mostly recent ones, and only the rest need the older, larger
        sets, whose search costs a cache miss at most steps: before a large set the queries
        already answered are picked out. For a small set or a few queries, picking out costs
        more than it spares. Each binary search narrows the next, the queries being sorted."""
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
        if not self.parts:
            return np.full(len(fps), NO_SEQUENCE, dtype=np.int64)
        return np.maximum.reduce([keys.highest(fps) for keys in self.sets])

    def merged(self) -> KeySet:
        """Every set in one (private) set, the largest stamp of a key kept."""
        if not self.parts:
            return KeySet.empty(None)
        keys = self.sets[0]
        for part in self.sets[1:]:
            keys = keys.merge(part)
        return keys


# Below this many queries a bucket's search gives every set all of them (see ``contains``).
_PICK_OUT_FROM_QUERIES = 16


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
        self._mapped = 0
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
                self._mapped -= previous.mapped_bytes
            self._entries[bucket] = entry
            self._nbytes += entry.nbytes
            self._mapped += entry.mapped_bytes
            self._evict_over_bounds()

    def retain(self, buckets: set[int]) -> None:
        """Drop every bucket but these (not counted as evictions)."""
        with self._lock:
            for bucket in [b for b in self._entries if b not in buckets]:
                dropped = self._entries.pop(bucket)
                self._nbytes -= dropped.nbytes
                self._mapped -= dropped.mapped_bytes

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
            self._mapped -= evicted.mapped_bytes
            self.evictions += 1

    def _over_bounds(self) -> bool:
        too_many = len(self._entries) > self.capacity
        return too_many or (self.max_bytes is not None and self._nbytes > self.max_bytes)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._nbytes = self._reserved
            self._mapped = 0

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(
                self.hits,
                self.misses,
                self.evictions,
                len(self._entries),
                self.capacity,
                self._nbytes,
                self._mapped,
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
        # The covered buckets, each with the segments whose keys are in the filter. Bits are
        # never cleared, so a covered bucket dropped from the cache and loaded again adds only
        # the segments committed since: before, it added its every key again, a cost growing
        # with the state at each such load (bench/RESULTS.md, "Keys at scale").
        self._added: dict[int, frozenset[tuple[str, int]]] = {}
        self._room = 0  # keys that may still be added before the filter is replaced
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return 0 if self._filter is None else self._filter.bits.nbytes

    def cover(self, entries: dict[int, CachedBucket], cached_keys: Callable[[], int]) -> None:
        """Keep covered the buckets in ``entries`` (their versions about to be cached), adding
        the segments the filter lacks, and cover those grown large. ``cached_keys``: the keys
        of the large buckets cached, which size a new filter."""
        with self._lock:
            sets, covering = self._to_add(entries)
            count = sum(len(keys) for keys in sets)
            if count and (self._filter is None or count > self._room):
                self._added.clear()
                sets, covering = self._to_add(entries)
                count = sum(len(keys) for keys in sets)
                self._filter = KeyFilter(max(cached_keys(), count) * 3 // 2)
                self._room = self._filter.capacity
            if count and self._filter is not None:
                _add_all(self._filter, sets)
                self._room -= count
            self._added.update(covering)

    def _to_add(
        self, entries: dict[int, CachedBucket]
    ) -> tuple[list[KeySet], dict[int, frozenset[tuple[str, int]]]]:
        """The sets to add, and the buckets covered once they are, with their segments."""
        sets: list[KeySet] = []
        covering: dict[int, frozenset[tuple[str, int]]] = {}
        for bucket, entry in entries.items():
            added = self._added.get(bucket)
            if added is None and len(entry) < FILTER_FROM_KEYS:
                continue  # left to its searches
            sets.extend(keys for ident, keys in entry.parts if added is None or ident not in added)
            covering[bucket] = entry.segments
        return sets, covering

    def keep_only(self, buckets: Collection[int]) -> None:
        """Forget the covered buckets not among these (a store's index no longer lists a time
        bucket once it is forgotten): their bits stay, harmless, until the filter is replaced."""
        with self._lock:
            for bucket in [b for b in self._added if b not in buckets]:
                del self._added[bucket]

    def passing(self, buckets: list[int], fps: Fingerprints) -> tuple[np.ndarray, list[bool]]:
        """Which of these queries may be held, and which of these buckets that answer holds
        for (the others' queries must all be searched). The buckets are read with the filter
        they are covered by: a filter replaced meanwhile leaves this one's bits as they were."""
        with self._lock:
            key_filter = self._filter
            covered = [bucket in self._added for bucket in buckets]
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


# Segments of fewer keys stay private to a process: a file and a map each cost more than the
# few bytes they would share. At 4,096 the many small segments of a window's tasks (a few
# thousand keys a bucket each) stayed private, and four task slots held four copies of them
# (bench/RESULTS.md, "scale_out.py").
SHARE_FROM_KEYS = 512


def _shared(segment: Segment) -> bool:
    return segment.count >= SHARE_FROM_KEYS


# A process sweeps the machine's shared copies of dropped segments at most this often.
_SWEEP_EVERY_SECONDS = 60.0


class BucketManager:
    """Answers "is this key remembered?" for one committed manifest, through the cache."""

    def __init__(
        self,
        store: BucketStore,
        cache: BucketCache,
        stamp_dtype: np.dtype | None,
        shared: SharedSegments | None = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.stamp_dtype = stamp_dtype
        self.shared = shared
        self.manifest: Manifest | None = None
        self.filter = BucketsFilter()
        self._lock = threading.Lock()
        self._touched: set[int] = set()  # buckets looked up at this manifest's version
        self._task_buckets: set[int] = set()
        self._loaded = self._fetched = 0
        self._swept_at = 0.0

    def use(self, manifest: Manifest) -> BucketManager:
        with self._lock:
            previous = self.manifest
            self.manifest = manifest
            if previous is None or manifest.version != previous.version:
                self._touched = set()
                self.filter.keep_only(manifest.buckets)
        if self.shared is not None and time.monotonic() - self._swept_at > _SWEEP_EVERY_SECONDS:
            self._swept_at = time.monotonic()
            self.shared.sweep(set(manifest.files))
        return self

    @property
    def bounds(self) -> tuple[int, int | None, Path | None]:
        root = None if self.shared is None else self.shared.root
        return self.cache.capacity, self.cache.max_bytes, root

    def begin_task(self) -> None:
        """Start counting a task's use of the state (``task_use``)."""
        with self._lock:
            self._task_buckets = set()
            self._loaded = self._fetched = 0

    def task_use(self) -> StateUse:
        """The state the task since ``begin_task`` used, and what this process holds once it
        let go of the buckets no task of this version used: with a key-partitioned input a
        process keeps its partitions' share, and maps again, cheaply, what a later window's
        partitions need (their copies stay on the machine's disk). A process whose tasks of
        this version looked nothing up (an empty split of the input) keeps what it holds: it
        learnt nothing of what the next windows need, and dropping everything made its next
        task open the whole state again."""
        with self._lock:
            touched = set(self._touched)
        if touched:
            self.cache.retain(touched)
        info = self.cache.info()
        with self._lock:
            return StateUse(self._loaded, self._loaded, self._fetched, info.nbytes, info.mapped)

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
        """The committed keys of these buckets: the sets cached for segments the manifest still
        lists, and the others opened (mapped from the machine's copies, built from the store
        where there is none). ``forget_at_or_below`` is applied by the searches."""
        if self.manifest is None:
            raise RuntimeError("BucketManager.use(manifest) must come before lookups")
        held: dict[int, dict[tuple[str, int], KeySet]] = {}
        wanted: list[tuple[int, Segment]] = []
        for bucket in buckets:
            entry = self.cache.get(bucket)
            held[bucket] = {} if entry is None else dict(entry.parts)
            for segment in self.manifest.buckets.get(bucket, []):
                if segment_ident(segment) not in held[bucket]:
                    wanted.append((bucket, segment))
        for (bucket, segment), keys in zip(wanted, self._open(wanted), strict=True):
            held[bucket][segment_ident(segment)] = keys
        result = {
            bucket: CachedBucket(
                tuple(
                    (segment_ident(s), held[bucket][segment_ident(s)])
                    for s in self.manifest.buckets.get(bucket, [])
                )
            )
            for bucket in buckets
        }
        self.filter.cover(result, lambda: self.cache.keys_held(FILTER_FROM_KEYS))
        self.cache.reserve(self.filter.nbytes)
        for bucket, entry in result.items():
            self.cache.put(bucket, entry)
        self._count_loaded(result)
        return result

    def _count_loaded(self, loaded: dict[int, CachedBucket]) -> None:
        with self._lock:
            self._touched.update(loaded)
            for bucket, entry in loaded.items():
                if bucket not in self._task_buckets:
                    self._task_buckets.add(bucket)
                    self._loaded += entry.nbytes + entry.mapped_bytes

    def _open(self, wanted: list[tuple[int, Segment]]) -> list[KeySet]:
        """These segments' keys: mapped from the machine's shared copies, the missing (or
        damaged) copies built from the store first, read in one parallel fetch."""
        opened: list[KeySet | None] = [None] * len(wanted)
        if self.shared is not None:
            opened = [
                self.shared.open(segment) if _shared(segment) else None for _, segment in wanted
            ]
        missing = [i for i, keys in enumerate(opened) if keys is None]
        segments = [wanted[i][1] for i in missing]
        for i, segment, raw in zip(missing, segments, self.store.fetch(segments), strict=True):
            keys = self._decode(raw, segment)
            with self._lock:
                self._fetched += len(raw)
            if self.shared is not None and _shared(segment):
                keys = self.shared.publish(segment, keys)
            opened[i] = keys
        return [keys for keys in opened if keys is not None]

    def share_written(self, segment: Segment, keys: DecodedSegment) -> None:
        """Make the shared copy of a segment this process has just written, from its keys with
        their final stamps: the machine's other processes then map it in the next window
        instead of reading it from the store (a round trip on an object store), and this one
        instead of decoding it. A copy of a window that never commits is never opened (its
        name is its window file's) and is swept as any copy of an unlisted file."""
        if self.shared is None or not _shared(segment):
            return
        stamps = keys.stamps
        if stamps is not None and self.stamp_dtype is not None:
            stamps = stamps.astype(self.stamp_dtype, copy=False)
        self.shared.publish(segment, KeySet.build(keys.h1, keys.h2, stamps))

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


def _ascending(values: np.ndarray) -> bool:
    return bool((values[1:] >= values[:-1]).all())


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
    state_cache_dir: str | None = None,
) -> BucketManager:
    """This process's manager for a store (keyed by the store's unique id, not just its URL),
    its sets mapped from the machine's shared copies under ``state_cache_dir`` (by default
    the executor's local dir: ``shared.default_root``)."""
    key = (store.url, manifest.store_id)
    root = default_root(state_cache_dir)
    with _managers_lock:
        manager = _managers.get(key)
        bounds = (capacity, max_bytes, root)
        if manager is None or manager.bounds != bounds:
            shared = SharedSegments(root, manifest.store_id)
            cache = BucketCache(capacity, max_bytes)
            manager = BucketManager(store, cache, stamp_dtype, shared)
            _managers[key] = manager
    return manager.use(manifest)


def segment_stamps(store: BucketStore, stamp_dtype: np.dtype) -> Callable[..., np.ndarray]:
    """A reader of committed segments' final stamps at a version, outside any cache: what the
    commit counts expired keys awaiting a fold with (``transaction.CountExpiredUnfolded``)."""

    def read(manifest: Manifest, segments: list[Segment]) -> np.ndarray:
        manager = BucketManager(store, BucketCache(1), stamp_dtype).use(manifest)
        stamps = manager.read_segments(segments).stamps
        return np.empty(0, stamp_dtype) if stamps is None else stamps

    return read
