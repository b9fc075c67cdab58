"""The LRU bucket cache and the bucket manager in front of a real bucket store.

A store is filled window by window the way the sink fills it (``run_task`` and the driver's
``commit_window`` over Arrow record batches, two key-partitioned tasks a window, enough windows
for buckets to be compacted). Each window is then classified again against the version it was
committed on, through managers with room for one bucket, two buckets and every bucket: the
answers must be identical, match the reference model and what the sink committed, and the cache
counters must behave. A window file that no manifest references must never be served.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from reference import ReferenceDedup

from dedupsink.engine.classify import (
    PORTS,
    CommittedState,
    WindowClassifier,
    stamp_dtype,
)
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.keyset import KeyFilter, KeySet
from dedupsink.engine.placement import bucket_of, key_fingerprints
from dedupsink.engine.settings import Settings, resolve
from dedupsink.options import DedupOptions
from dedupsink.sink.commit import commit_window
from dedupsink.sink.plan import SinkPlan, TaskIdentity
from dedupsink.sink.task import TaskSummary, run_task
from dedupsink.store import cache as cache_module
from dedupsink.store.cache import BucketCache, BucketManager, CachedBucket, manager_for
from dedupsink.store.format import Manifest, Segment, encode_segments
from dedupsink.store.shared import SharedSegments
from dedupsink.store.store import BucketStore, window_file_name

QUERY = "cache-query"
RUN = "cache-run"
UNBOUNDED = 1 << 16
WINDOWS = 12
# A store created now places keys by Spark's hash: fingerprints as the store keeps them.
SPARK_PLACED = Settings(
    "basic", ("id",), ("int64",), None, None, "int", None, None, 64, key_hash="spark"
)

MODES: dict[str, dict[str, Any]] = {
    "basic": {
        "schema": pa.schema([("id", pa.int64()), ("v", pa.string())]),
        "options": {"keys": "id", "numBuckets": "64"},
        "row": lambda i, w: {"id": i, "v": f"payload-{i}"},
        "reference": ("basic", None),
        "value": lambda r: None,
    },
    "ordered": {
        "schema": pa.schema([("id", pa.int64()), ("n", pa.int64())]),
        "options": {"keys": "id", "expiryKey": "n", "expiryPeriod": "60", "bucketSpan": "6"},
        "row": lambda i, w: {"id": i, "n": i * 2},
        "reference": ("ordered", 60),
        "value": lambda r: r["n"],
    },
    "categorical": {
        "schema": pa.schema([("id", pa.string()), ("cohort", pa.string())]),
        "options": {"keys": "id", "expiryKey": "cohort", "expiryPeriod": "3", "numBuckets": "16"},
        "row": lambda i, w: {"id": f"k{i}", "cohort": f"c{i // 8}"},
        "reference": ("categorical", 3),
        "value": lambda r: r["cohort"],
    },
    # Most ids carry the time of the window that sends them (Assumption 1 does not hold), a
    # third the time of the window their id belongs to (late when re-sent long after).
    "own-time": {
        "schema": pa.schema([("id", pa.int64()), ("t", pa.int64())]),
        "options": {
            "keys": "id",
            "expiryKey": "t",
            "expiryPeriod": "400",
            "assumeSameExpiry": "false",
            "numBuckets": "16",
        },
        "row": lambda i, w: {"id": i, "t": (i // 40 if i % 3 == 0 else w) * 80 + i % 40},
        "reference": ("ordered", 400),
        "value": lambda r: r["t"],
    },
}


CAPACITIES = (1, 2, UNBOUNDED)


@dataclass
class FilledStore:
    """A store after WINDOWS committed windows, and how managers of each capacity classified
    every window against the version it was committed on (one long-lived manager per
    capacity, moving forward version by version as in an executor process)."""

    plan: SinkPlan
    managers: dict[int, BucketManager]
    windows: list[list[list[dict[str, Any]]]] = field(default_factory=list)  # window, task, rows
    answers: dict[int, list[list[str]]] = field(default_factory=dict)  # capacity -> ports
    committed_counts: list[dict[str, int]] = field(default_factory=list)
    compacted_buckets: int = 0

    @property
    def store(self) -> BucketStore:
        return self.plan.store

    @property
    def settings(self) -> Settings:
        return self.plan.settings

    @property
    def mode(self) -> str:
        return next(m for m, spec in MODES.items() if spec["schema"] == self.plan.schema)

    def latest(self) -> Manifest:
        manifest = self.store.read()
        assert manifest is not None
        return manifest


def make_plan(root: Path, schema: pa.Schema, **raw: str) -> SinkPlan:
    options = DedupOptions.parse({"path": str(root), **raw})
    return SinkPlan(options, resolve(options, schema), schema, RUN)


def window_ids(rng: random.Random, window: int) -> list[int]:
    """Mostly current ids, some re-sent ones and some late (old) ones."""
    ids = []
    for _ in range(rng.randint(120, 200)):
        draw = rng.random()
        if draw < 0.7:
            ids.append(rng.randrange(window * 40, window * 40 + 60))
        else:
            ids.append(rng.randrange(0, window * 40 + 1))
    return ids


def batch_of(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(list(rows), schema=schema)


def new_manager(plan: SinkPlan, capacity: int) -> BucketManager:
    return BucketManager(plan.store, BucketCache(capacity), stamp_dtype(plan.settings))


def classify(
    plan: SinkPlan, manager: BucketManager, manifest: Manifest, tasks: Sequence[Sequence[dict]]
) -> list[str]:
    """One window's rows, task after task, against a committed version through ``manager``."""
    state = CommittedState(manifest.latest, manifest.category_ordinals())
    classifier = WindowClassifier(plan.settings, state, manager.use(manifest))
    ports: list[str] = []
    for rows in tasks:
        if rows:
            result = classifier.classify(batch_of(rows, plan.schema))
            ports.extend(PORTS[p] for p in result.ports.tolist())
    return ports


def key_number(row: dict[str, Any]) -> int:
    key = row["id"]
    return key if isinstance(key, int) else int(key[1:])


def fill(root: Path, mode: str, seed: int = 3) -> FilledStore:
    spec = MODES[mode]
    plan = make_plan(root, spec["schema"], maxCachedBuckets="2", **spec["options"])
    plan.store.open(plan.settings)
    filled = FilledStore(plan, {cap: new_manager(plan, cap) for cap in CAPACITIES})
    filled.answers = {cap: [] for cap in CAPACITIES}
    rng = random.Random(seed)
    for window in range(WINDOWS):
        rows = [spec["row"](i, window) for i in window_ids(rng, window)]
        # Two tasks, partitioned by key as `repartition(n, key)` would: no key in both.
        tasks = [[r for r in rows if key_number(r) % 2 == p] for p in (0, 1)]
        manifest = filled.latest()
        for capacity, manager in filled.managers.items():
            filled.answers[capacity].append(classify(plan, manager, manifest, tasks))
        summaries = [
            run_task(plan, TaskIdentity(QUERY, RUN, window, p, 0), iter([batch_of(t, plan.schema)]))
            for p, t in enumerate(tasks)
        ]
        filled.compacted_buckets += sum(len(s.written.supersedes) for s in summaries if s.written)
        report = commit_window(plan, summaries, window)
        assert report is not None and report.version == window + 1
        filled.windows.append(tasks)
        filled.committed_counts.append(report.counts.as_dict())
    return filled


@pytest.fixture(scope="module", params=sorted(MODES))
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> FilledStore:
    return fill(tmp_path_factory.mktemp(f"cache-{request.param}"), request.param)


# -- small caches answer like an unbounded one --------------------------------------------


def test_the_filled_store_spans_many_buckets(filled: FilledStore) -> None:
    last = filled.latest()
    assert len(last.buckets) > 2
    assert last.totals.windows == WINDOWS
    if filled.mode in ("basic", "own-time"):
        # Every window adds a segment to nearly every hash bucket: crowded ones got compacted.
        assert filled.compacted_buckets > 0


@pytest.mark.parametrize("capacity", [1, 2])
def test_small_cache_classifies_like_an_unbounded_one(filled: FilledStore, capacity: int) -> None:
    assert filled.answers[capacity] == filled.answers[UNBOUNDED]


@pytest.mark.parametrize("capacity", [1, UNBOUNDED])
def test_the_managers_filter_answers_as_the_searches_did(
    filled: FilledStore, capacity: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every window again, each bucket covered by the filter from its second key: a warm manager,
    and one that evicts a bucket at every load (its filter keeps the evicted keys' bits and
    takes the reloaded ones again), answer as the searches alone did."""
    monkeypatch.setattr(cache_module, "FILTER_FROM_KEYS", 2)
    manager = new_manager(filled.plan, capacity)
    for number, tasks in enumerate(filled.windows):
        manifest = filled.store.read(number)
        assert manifest is not None
        assert classify(filled.plan, manager, manifest, tasks) == filled.answers[UNBOUNDED][number]
    assert manager.filter.nbytes > 0


def test_manager_answers_match_the_reference_and_the_commits(filled: FilledStore) -> None:
    spec = MODES[filled.mode]
    reference = ReferenceDedup(*spec["reference"])
    for number, tasks in enumerate(filled.windows):
        got = filled.answers[1][number]
        rows = [row for task in tasks for row in task]
        assert got == reference.window(rows, lambda r: r["id"], spec["value"]), f"window {number}"
        counts = {port: got.count(port) for port in PORTS}
        assert counts == filled.committed_counts[number], f"window {number}"


def test_every_port_is_exercised(filled: FilledStore) -> None:
    seen = {port for window in filled.answers[UNBOUNDED] for port in window}
    assert {"unique", "duplicate"} <= seen
    if filled.mode != "basic":
        assert "expired" in seen


# -- counters -----------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 2])
def test_cache_counters_with_a_small_capacity(filled: FilledStore, capacity: int) -> None:
    tiny = filled.managers[capacity].cache.info()
    full = filled.managers[UNBOUNDED].cache.info()
    # The same lookups happen whatever the capacity; only where they are served differs.
    assert tiny.hits + tiny.misses == full.hits + full.misses
    assert tiny.size <= capacity == tiny.capacity
    assert tiny.evictions > 0 and full.evictions == 0
    assert tiny.misses > full.misses
    # Unbounded: a bucket is missed once, and again only after a window that did not use it
    # (a process keeps the buckets its last window's tasks used).
    assert full.size <= full.misses < tiny.misses


def test_a_warm_cache_serves_a_repeated_window_from_memory(filled: FilledStore) -> None:
    warm = new_manager(filled.plan, UNBOUNDED)
    manifest, tasks = filled.latest(), filled.windows[-1]
    first = classify(filled.plan, warm, manifest, tasks)
    before = warm.cache.info()
    assert before.misses > 0 and before.evictions == 0
    assert classify(filled.plan, warm, manifest, tasks) == first
    after = warm.cache.info()
    assert after.misses == before.misses
    assert after.hits - before.hits == before.hits + before.misses


def test_lru_evicts_the_least_recently_used_bucket() -> None:
    cache = BucketCache(2)
    entry = CachedBucket.of(KeySet.empty(None))
    cache.put(1, entry)
    cache.put(2, entry)
    assert cache.get(1) is entry  # 1 is now the most recent
    cache.put(3, entry)  # evicts 2
    assert cache.get(2) is None
    assert cache.get(3) is entry and cache.get(1) is entry
    assert cache.info() == (3, 1, 1, 2, 2, 0, 0)
    cache.clear()
    assert cache.info().size == 0 and cache.nbytes == 0


def _bucket_of(keys: int) -> CachedBucket:
    h = np.arange(keys, dtype=np.uint64)
    return CachedBucket.of(KeySet.build(h, h, None))


def test_byte_bound_evicts_least_recent_buckets_until_under_it() -> None:
    cache = BucketCache(capacity=64, max_bytes=3 * 1000 * 16)  # three buckets of 1,000 keys
    for bucket in range(5):
        cache.put(bucket, _bucket_of(1000))
    info = cache.info()
    assert (info.size, info.evictions, info.nbytes) == (3, 2, 3 * 1000 * 16)
    assert cache.get(0) is None and cache.get(1) is None and cache.get(2) is not None


def test_byte_bound_keeps_a_bucket_larger_than_itself() -> None:
    cache = BucketCache(capacity=64, max_bytes=1000)
    cache.put(1, _bucket_of(10))
    cache.put(2, _bucket_of(5000))  # 80,000 bytes: the older bucket goes, this one stays
    assert cache.get(1) is None and cache.get(2) is not None
    assert cache.info().size == 1 and cache.nbytes == 5000 * 16


def test_replacing_a_bucket_counts_its_bytes_once() -> None:
    cache = BucketCache(capacity=4, max_bytes=10**9)
    cache.put(1, _bucket_of(100))
    cache.put(1, _bucket_of(300))
    assert cache.nbytes == 300 * 16 and cache.info().size == 1


def random_keys(rng: np.random.Generator, n: int, stamp: int) -> KeySet:
    lanes = (rng.integers(0, 2**64 - 1, n, dtype=np.uint64) for _ in range(2))
    return KeySet.build(*lanes, np.full(n, stamp, np.int64))


def test_the_managers_filter_covers_large_buckets_through_each_windows_keys() -> None:
    """The filter covers the large buckets of a load, then takes each window's new keys: every
    key a covered bucket holds passes, absent keys mostly do not, and a small bucket is left to
    its searches. Once the keys added would pass its capacity the filter is replaced, sized
    for the large buckets cached, and covers again only the buckets it is given."""
    rng = np.random.default_rng(5)
    shared = cache_module.BucketsFilter()
    entries = {0: CachedBucket.of(random_keys(rng, 20_000, 1)), 1: _bucket_of(100)}
    shared.cover(entries, lambda: 20_000)
    first = shared.nbytes
    absent = Fingerprints(*(rng.integers(0, 2**64 - 1, 5_000, dtype=np.uint64),) * 2)
    for window in range(2, 40):
        new = random_keys(rng, 60, window)
        entries = {0: CachedBucket.of(*entries[0].sets, new), 1: entries[1]}
        shared.cover(entries, lambda: 22_280)
        every = entries[0].merged()
        passing, covered = shared.passing([0, 1], Fingerprints(every.h1, every.h2))
        assert covered == [True, False] and passing.all()
    assert shared.nbytes == first, "22,280 keys fit the first filter"
    assert shared.passing([0], absent)[0].mean() < 0.03

    grown = {2: CachedBucket.of(random_keys(rng, 30_000, 40))}
    shared.cover(grown, lambda: 52_280)
    keys = grown[2].sets[0]
    passing, covered = shared.passing([0, 2], Fingerprints(keys.h1, keys.h2))
    assert covered == [False, True] and passing.all()
    assert shared.nbytes == KeyFilter(52_280 * 3 // 2).bits.nbytes == 2**17


def test_a_covered_bucket_loaded_again_adds_only_the_segments_committed_since(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A covered bucket dropped from a process's cache (the byte bound, a task of a version
    that did not use it) and loaded again, as a new entry of the same segments and one more,
    adds that one segment's keys to the filter, not its every key again: at 27 M keys that
    re-adding cost a second and more of a batch. Every key it holds still passes."""
    added: list[int] = []
    add_all = cache_module._add_all

    def counting(key_filter: KeyFilter, sets: list[KeySet]) -> None:
        added.append(sum(len(keys) for keys in sets))
        add_all(key_filter, sets)

    monkeypatch.setattr(cache_module, "_add_all", counting)
    rng = np.random.default_rng(7)
    shared = cache_module.BucketsFilter()
    sets = [random_keys(rng, 20_000, 1)]
    shared.cover({0: CachedBucket.of(*sets)}, lambda: 20_000)
    size = shared.nbytes
    for window in range(2, 12):
        sets.append(random_keys(rng, 100, window))
        reloaded = CachedBucket.of(*sets)  # built afresh, as a load after the cache let it go
        shared.cover({0: reloaded}, partial(len, reloaded))
        every = reloaded.merged()
        passing, covered = shared.passing([0], Fingerprints(every.h1, every.h2))
        assert covered == [True] and passing.all()
    assert added == [20_000] + [100] * 10
    assert shared.nbytes == size, "the filter was never replaced"


def test_the_filter_forgets_the_buckets_a_store_no_longer_lists() -> None:
    """A time bucket forgotten by the store leaves the filter's covered buckets (its record of
    segments would otherwise grow with every bucket a long stream ever had); a bucket still
    listed stays covered."""
    rng = np.random.default_rng(3)
    shared = cache_module.BucketsFilter()
    entries = {
        0: CachedBucket.of(random_keys(rng, 9_000, 1)),
        1: CachedBucket.of(random_keys(rng, 9_000, 2)),
    }
    shared.cover(entries, lambda: 18_000)
    probe = Fingerprints(*(rng.integers(0, 2**64 - 1, 10, dtype=np.uint64),) * 2)
    assert shared.passing([0, 1], probe)[1] == [True, True]
    shared.keep_only({1: []})
    assert shared.passing([0, 1], probe)[1] == [False, True]


def test_a_task_without_rows_keeps_the_buckets_its_process_holds(tmp_path: Path) -> None:
    """Spark splits a file of one row group into a split holding every row and an empty one.
    The empty split's task leaves its process's cache as it is: it learnt nothing of what the
    next windows need (before, it let go of every bucket, and the process's next task opened
    and filtered the whole state again)."""
    plan = make_plan(tmp_path, SCHEMA, keys="id", numBuckets="8")
    options = plan.options

    def process_manager() -> BucketManager:
        manifest = plan.store.read()
        assert manifest is not None
        return manager_for(
            plan.store,
            manifest,
            options.max_cached_buckets,
            stamp_dtype(plan.settings),
            options.max_cache_memory.nbytes,
            options.state_cache_dir,
        )

    one_window(plan, 0, range(0, 2000))
    one_window(plan, 1, range(2000, 4000))  # its task loads the 8 buckets of version 1
    assert process_manager().cache.info().size == 8
    one_window(plan, 2, [])  # a task of version 2 that looks nothing up
    assert process_manager().cache.info().size == 8
    one_window(plan, 3, range(4000, 4002))  # a task that looks up two keys keeps their buckets
    assert 0 < process_manager().cache.info().size <= 2


def test_the_managers_filter_counts_against_the_cache_bound() -> None:
    cache = BucketCache(8, max_bytes=3 * 1000 * 16 + 4096)
    for bucket in range(3):
        cache.put(bucket, _bucket_of(1000))
    cache.reserve(4096)
    assert cache.nbytes == 3 * 1000 * 16 + 4096 and cache.info().evictions == 0
    cache.reserve(8192)  # a larger filter leaves room for two buckets
    assert cache.info().size == 2 and cache.nbytes == 2 * 1000 * 16 + 8192
    cache.clear()
    assert cache.nbytes == 8192


def test_a_large_buckets_search_of_its_newest_segments_first_answers_as_every_set_does() -> None:
    """A large bucket searches its segments, newest first, and older ones only for the queries
    no newer one holds: a key a newer set holds expired and an older alive, or the other way
    round, is still found; an absent key, or one every set holds expired, is not."""
    rng = np.random.default_rng(11)
    h1 = np.sort(rng.choice(2**62, 12_000, replace=False).astype(np.uint64))
    h2 = rng.integers(0, 2**64 - 1, len(h1), dtype=np.uint64)
    stamps = rng.choice(np.array([10, 100], np.int64), len(h1))

    def keys(rows: np.ndarray, values: np.ndarray) -> KeySet:
        return KeySet.build(h1[rows], h2[rows], values)

    bulk_rows = np.arange(10_000)
    run_rows = np.arange(9_000, 11_000)  # its first 1,000 keys have the bulk's other stamp
    newest_rows = np.arange(10_500, 12_000)
    sets = [
        keys(bulk_rows, stamps[bulk_rows]),
        keys(run_rows, np.where(run_rows < 10_000, 110 - stamps[run_rows], stamps[run_rows])),
        keys(newest_rows, stamps[newest_rows]),
    ]
    entry = CachedBucket.of(*sets)
    absent = rng.integers(2**62, 2**63, 2_000, dtype=np.uint64)
    q1 = np.concatenate([h1[rng.choice(len(h1), 3_000, replace=False)], absent])
    q2 = np.concatenate([h2[np.searchsorted(h1, q1[:3_000])], absent])
    order = np.argsort(q1)
    queries = Fingerprints(q1[order], q2[order])
    for point in (None, 50):
        every = np.zeros(len(queries), dtype=bool)
        for one in sets:
            every |= one.contains(queries, point, presorted=True)
        assert entry.contains(queries, point).tolist() == every.tolist()
        assert every.sum() > 1_000 and not every.all()


def test_capacity_one_keeps_only_the_last_bucket() -> None:
    cache = BucketCache(1)
    entry = CachedBucket.of(KeySet.empty(None))
    for bucket in range(10):
        cache.put(bucket, entry)
    assert cache.info().evictions == 9
    assert cache.get(9) is entry and cache.get(8) is None


# -- uncommitted window files are never served --------------------------------------------


SCHEMA = MODES["basic"]["schema"]


def fps_of(ids: Sequence[int]) -> Fingerprints:
    return key_fingerprints(SPARK_PLACED, [pa.array(ids, pa.int64())])


def remembered(manager: BucketManager, manifest: Manifest, ids: Sequence[int]) -> list[bool]:
    fps = fps_of(ids)
    buckets = bucket_of(manifest.settings.engine_settings(), fps, None)
    return manager.use(manifest).remembered(buckets, fps, None).tolist()


def one_window(plan: SinkPlan, batch_id: int, ids: Sequence[int], commit: bool = True) -> None:
    rows = [MODES["basic"]["row"](i, batch_id) for i in ids]
    identity = TaskIdentity(QUERY, RUN, batch_id, 0, 0)
    summary = run_task(plan, identity, iter([batch_of(rows, SCHEMA)]))
    if commit:
        assert commit_window(plan, [summary], batch_id) is not None


def test_keys_of_an_uncommitted_task_are_not_served(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, SCHEMA, keys="id", numBuckets="64", maxCachedBuckets="2")
    one_window(plan, 0, range(0, 100))
    one_window(plan, 1, range(100, 200), commit=False)  # its window file is written, not committed
    store = plan.store
    v1 = store.read()
    assert v1 is not None and v1.version == 1
    assert len(store.storage.entries(store.path("data"))) == 2
    # The process's own manager (the one the task used) and a fresh one agree.
    process = manager_for(store, v1, 2, None)
    for candidate in (process, BucketManager(store, BucketCache(64), None)):
        assert remembered(candidate, v1, range(100, 200)) == [False] * 100
        assert remembered(candidate, v1, range(0, 100)) == [True] * 100


def test_a_stray_window_file_is_invisible_until_a_manifest_references_it(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, SCHEMA, keys="id", numBuckets="64")
    one_window(plan, 0, range(10))
    store = plan.store
    v1 = store.read()
    assert v1 is not None
    warm = BucketManager(store, BucketCache(64), None)
    assert remembered(warm, v1, range(10)) == [True] * 10
    # A window file of the next window, complete and valid, that no manifest references yet.
    stray, name = fps_of(range(500, 600)), window_file_name(2, 0)
    buckets = (stray.h1 % np.uint64(64)).astype(np.int64)
    data, _ = encode_segments(buckets, stray.h1, stray.h2, None, name)
    store.write_window_file(name, data)
    for manager in (warm, BucketManager(store, BucketCache(64), None)):
        assert remembered(manager, v1, range(500, 600)) == [False] * 100
        assert remembered(manager, v1, range(10)) == [True] * 10


def test_a_warm_manager_sees_keys_once_their_window_commits(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, SCHEMA, keys="id", numBuckets="64")
    one_window(plan, 0, range(50))
    store = plan.store
    warm = BucketManager(store, BucketCache(64), None)
    v1 = store.read()
    assert v1 is not None
    assert remembered(warm, v1, range(50, 100)) == [False] * 50
    one_window(plan, 1, range(50, 100))
    v2 = store.read()
    assert v2 is not None
    assert remembered(warm, v2, range(100)) == [True] * 100
    # Going back to the older version serves only what that version had committed.
    assert (
        remembered(BucketManager(store, BucketCache(64), None), v1, range(50, 100)) == [False] * 50
    )


def expiry_answers(manager: BucketManager, manifest: Manifest, ids: Sequence[int]) -> list[bool]:
    """Which ids the manager remembers above the manifest's expiry point (one bucket)."""
    fps = fps_of(ids)
    point = manifest.latest - manifest.settings.period
    return manager.use(manifest).remembered(np.zeros(len(ids), np.int64), fps, point).tolist()


def own_time_window(plan: SinkPlan, number: int, ids: Sequence[int]) -> TaskSummary:
    """One committed window of ``ids``, each stamped with a time of the window's own."""
    rows = [{"id": i, "t": number * 100 + i % 50} for i in ids]
    batch = batch_of(rows, plan.schema)
    summary = run_task(plan, TaskIdentity(QUERY, RUN, number, 0, 0), iter([batch]))
    assert commit_window(plan, [summary], number) is not None
    return summary


@pytest.mark.parametrize("filter_from", [cache_module.FILTER_FROM_KEYS, 64])
def test_a_bucket_compacted_under_a_warm_cache_answers_as_one_built_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filter_from: int
) -> None:
    """A warm bucket whose segments are folded into one drops the folded sets and opens the
    fold: it answers as a bucket built afresh from the store, through expiry and re-sends."""
    spec = MODES["own-time"]
    options = {**spec["options"], "numBuckets": "1", "expiryPeriod": "2000"}
    plan = make_plan(tmp_path, spec["schema"], **options)
    # At 64 keys the managers' filter covers the bucket: it must answer as searches do.
    monkeypatch.setattr(cache_module, "FILTER_FROM_KEYS", filter_from)
    folds = 0
    own_time_window(plan, 0, range(2000))
    warm = BucketManager(plan.store, BucketCache(4), stamp_dtype(plan.settings))
    rng = random.Random(5)
    probe = list(range(0, 3000, 7))
    for number in range(1, 40):
        manifest = plan.store.read()
        assert manifest is not None
        fresh = BucketManager(plan.store, BucketCache(4), stamp_dtype(plan.settings))
        assert expiry_answers(warm, manifest, probe) == expiry_answers(fresh, manifest, probe)
        # New ids, and re-sent ones: forgotten ones come back with a later value.
        new = range(2000 + 20 * number, 2020 + 20 * number)
        summary = own_time_window(plan, number, [*new, *rng.sample(range(2000 + 20 * number), 5)])
        folds += bool(summary.written and summary.written.supersedes)
    assert folds >= 3, f"{folds} folds: the test proves little"
    covered = warm.filter.passing([0], fps_of(probe))[1]
    assert covered == [filter_from < 2000], "the filter covers the bucket when it is large"


@pytest.mark.parametrize("filter_from", [cache_module.FILTER_FROM_KEYS, 64])
def test_the_machines_shared_copies_are_decoded_once_and_answer_as_a_cache_built_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filter_from: int
) -> None:
    """Every segment is decoded from the store once for the machine: a second process (a
    manager of its own over the same state folder) maps the copies the first built and
    decodes none, and both answer as a private cache built from the store, through folds,
    expiry and re-sends."""
    spec = MODES["own-time"]
    options = {**spec["options"], "numBuckets": "1", "expiryPeriod": "2500"}
    plan = make_plan(tmp_path, spec["schema"], stateCacheDir=str(tmp_path / "local"), **options)
    monkeypatch.setattr(cache_module, "FILTER_FROM_KEYS", filter_from)
    monkeypatch.setattr(cache_module, "SHARE_FROM_KEYS", 0)  # a window's few keys shared too
    decoded: list[tuple[BucketManager, tuple[str, int]]] = []
    decode = BucketManager._decode

    def counting(self: BucketManager, raw: Any, segment: Segment) -> KeySet:
        decoded.append((self, segment.ident))
        return decode(self, raw, segment)

    monkeypatch.setattr(BucketManager, "_decode", counting)
    folds = 0
    own_time_window(plan, 0, range(2000))
    rng = random.Random(7)
    probe = list(range(0, 3000, 7))
    shared_root = Path(plan.options.state_cache_dir or "")
    for number in range(1, 40):
        manifest = plan.store.read()
        assert manifest is not None
        first, second = (
            BucketManager(plan.store, BucketCache(4), stamp_dtype(plan.settings), shared)
            for shared in (
                SharedSegments(shared_root, manifest.store_id),
                SharedSegments(shared_root, manifest.store_id),
            )
        )
        fresh = BucketManager(plan.store, BucketCache(4), stamp_dtype(plan.settings))
        expected = expiry_answers(fresh, manifest, probe)
        assert expiry_answers(first, manifest, probe) == expected
        assert expiry_answers(second, manifest, probe) == expected
        assert [s for manager, s in decoded if manager is second] == []
        held = second.cache.info()
        assert held.mapped > 0 and held.nbytes == second.filter.nbytes  # its filter alone
        new = range(2000 + 20 * number, 2020 + 20 * number)
        summary = own_time_window(plan, number, [*new, *rng.sample(range(2000 + 20 * number), 5)])
        folds += bool(summary.written and summary.written.supersedes)
    assert folds >= 5, f"{folds} folds: the test proves little"
    built = [s for manager, s in decoded if manager.shared is not None]
    assert len(built) == len(set(built)), "a segment was decoded twice on one machine"


# -- the memory a caching process gives back ------------------------------------------------

ONE_WINDOW_THEN_ARROW_POOL = """
import sys
import pyarrow as pa
from dedupsink.engine.settings import resolve
from dedupsink.options import DedupOptions
from dedupsink.sink.plan import SinkPlan, TaskIdentity
from dedupsink.sink.task import TaskSummary, run_task

batch = pa.record_batch({"id": pa.array(range(100), pa.int64())})
options = DedupOptions.parse({"path": sys.argv[1], "keys": "id"})
plan = SinkPlan(options, resolve(options, batch.schema), batch.schema, "r")
run_task(plan, TaskIdentity("q", "r", 0, 0, 0), iter([batch]))
print(pa.default_memory_pool().backend_name)
"""


@pytest.mark.parametrize(
    ("chosen", "expected"), [(None, "jemalloc"), ("system", "system"), ("mimalloc", "mimalloc")]
)
def test_a_process_running_tasks_serves_arrow_from_jemalloc_unless_told_otherwise(
    tmp_path: Path, chosen: str | None, expected: str
) -> None:
    if "jemalloc" not in pa.supported_memory_backends():
        pytest.skip("this pyarrow was built without jemalloc")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    run = subprocess.run(
        [sys.executable, "-c", ONE_WINDOW_THEN_ARROW_POOL, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.split() == [expected]
