"""The bucket store's contract, on the local disk and on fsspec's ``memory://`` filesystem.

Every test of the contract suite runs against both fixtures (a fresh root each): creating and
reopening a store with its settings, refusing changed settings, committing and re-reading
manifests, older versions staying readable, the window-file format and its checksums, corrupt
files named in ``StoreCorruptError``, and expired window files dropped from the index and
deleted after their grace. Windows are written the way the sink writes them, with
``sink.task.run_task`` over plain Arrow record batches and the driver's ``sink.commit``, no
Spark. The crash-injection tests use ``tests/faultfs.py`` to fail every write, rename and
delete step of a commit (and of a task) in turn.
"""

from __future__ import annotations

import copy
import errno
import random
import re
import shutil
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from typing import Any

import fsspec
import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from faultfs import FAULTS, count_steps, fault_url
from manifests import recorded_without
from reference import ReferenceDedup
from streams import later_resends

from dedupsink.engine.classify import PORTS, stamp_dtype
from dedupsink.engine.keyset import KeySet
from dedupsink.engine.placement import key_fingerprints, key_shards
from dedupsink.engine.settings import Settings, resolve
from dedupsink.errors import StoreConflictError, StoreCorruptError, StoreSettingsError
from dedupsink.options import DedupOptions
from dedupsink.runtime import RUNTIME
from dedupsink.sink import settle as settle_module
from dedupsink.sink import task as task_module
from dedupsink.sink.commit import CommitReport, commit_window
from dedupsink.sink.plan import SinkPlan, TaskIdentity
from dedupsink.sink.task import TaskSummary, run_task
from dedupsink.store import compaction as compaction_module
from dedupsink.store import transaction as transaction_module
from dedupsink.store.cache import BucketCache, BucketManager, segment_stamps
from dedupsink.store.format import (
    STAMP_COUNTS_CAP,
    WINDOW_MAGIC,
    Manifest,
    PortState,
    Segment,
    WindowFile,
    concat_segments,
    count_stamps,
    decode_segment,
    encode_segments,
    group_by_bucket,
)
from dedupsink.store.records import (
    LogEntry,
    Move,
    Owner,
    Publication,
    StoreSettings,
    StoreTotals,
    WindowCounts,
    WindowRecord,
)
from dedupsink.store.store import (
    GARBAGE_EVERY,
    KEEP_MANIFESTS,
    TOMBSTONE_GRACE_VERSIONS,
    BucketStore,
)

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64())])
ORDERED = {"keys": "id", "expiryKey": "n", "expiryPeriod": "10", "bucketSpan": "5"}
ORDERED_HASHABLE = {"keys": "id", "expiryKey": "n", "expiryPeriod": "10"}  # no bucketSpan
QUERY = "query-1"


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh output root: a local directory or a ``memory://`` one."""
    if request.param == "local":
        yield str(tmp_path / "out")
        return
    url = f"memory://dedup-{uuid.uuid4().hex}/out"
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


RUN = "run-1"


def make_plan(root: str, **raw: str) -> SinkPlan:
    options = DedupOptions.parse({"path": root, **(raw or ORDERED)})
    return SinkPlan(options, resolve(options, SCHEMA), SCHEMA, RUN)


def counts(unique: int = 0, duplicate: int = 0, expired: int = 0, error: int = 0) -> WindowCounts:
    return WindowCounts(unique, duplicate, expired, error)


def rows(ids: Sequence[int | None], ns: Sequence[int | None]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(ns, pa.int64())], schema=SCHEMA)


def run_tasks(
    plan: SinkPlan, batch_id: int, partitions: Sequence[Sequence[pa.RecordBatch]]
) -> list[TaskSummary]:
    return [
        run_task(plan, TaskIdentity(QUERY, RUN, batch_id, partition, 0), iter(batches))
        for partition, batches in enumerate(partitions)
    ]


def run_window(
    plan: SinkPlan, batch_id: int, *partitions: Sequence[pa.RecordBatch]
) -> CommitReport:
    report = commit_window(plan, run_tasks(plan, batch_id, partitions), batch_id)
    assert report is not None
    return report


def all_keys(store: BucketStore, manifest: Manifest, settings: Settings) -> dict[int, KeySet]:
    """Every committed key of a version, read afresh (no cache shared with anything else)."""
    manager = BucketManager(store, BucketCache(1 << 20), stamp_dtype(settings)).use(manifest)
    return {b: entry.merged() for b, entry in manager.load(sorted(manifest.buckets), None).items()}


def key_summary(keys: dict[int, KeySet]) -> dict[int, list[tuple[int, int, float | None]]]:
    out = {}
    for bucket, keyset in keys.items():
        stamps = [None] * len(keyset) if keyset.stamps is None else keyset.stamps.tolist()
        out[bucket] = sorted(zip(keyset.h1.tolist(), keyset.h2.tolist(), stamps, strict=True))
    return out


def data_files(store: BucketStore) -> set[str]:
    return set(store.storage.entries(store.path("data")))


def flip_byte(store: BucketStore, path: str, position: int) -> None:
    data = bytearray(store.storage.read(path))
    data[position] ^= 0x40
    store.storage.fs.pipe_file(path, bytes(data))


def truncate(store: BucketStore, path: str, keep: int) -> None:
    store.storage.fs.pipe_file(path, store.storage.read(path)[:keep])


# -- creating, opening, settings ----------------------------------------------------------


def test_open_creates_version_zero_with_the_settings(root: str) -> None:
    plan = make_plan(root)
    store = plan.store
    assert store.read() is None and store.versions() == []
    manifest = store.open(plan.settings)
    assert manifest.version == 0
    assert store.versions() == [0]
    assert manifest.settings.to_wire() == plan.settings.identity()
    assert store.read() == manifest


def test_reopen_returns_the_same_store(root: str) -> None:
    plan = make_plan(root)
    first = plan.store.open(plan.settings)
    again = BucketStore(plan.options.store_path).open(plan.settings)
    assert again.store_id == first.store_id
    assert again.version == 0


def test_a_version_this_process_wrote_is_read_back_without_decoding(root: str) -> None:
    plan = make_plan(root)
    written = plan.store.open(plan.settings)
    read = plan.store.read()
    assert read == written
    assert read is not None and read.files is written.files  # the same objects: not decoded
    # The same version number of a store deleted and created again has other bytes.
    plan.store.storage.fs.rm(plan.store.url, recursive=True)
    again = BucketStore(plan.options.store_path).open(plan.settings)
    fresh = BucketStore(plan.options.store_path).read()
    assert fresh is not None and fresh.version == 0
    assert fresh.store_id == again.store_id != written.store_id


@pytest.mark.parametrize(
    ("changed", "option"),
    [
        ({**ORDERED, "keys": "n"}, "keys"),
        ({**ORDERED, "expiryPeriod": "20"}, "expiryPeriod"),
        ({**ORDERED, "bucketSpan": "2"}, "bucketSpan"),
        ({"keys": "id"}, "expiryMode"),
        ({**ORDERED, "expiryKey": "id", "keys": "n"}, "keys"),
    ],
)
def test_changed_settings_are_refused_naming_the_option(
    root: str, changed: dict[str, str], option: str
) -> None:
    plan = make_plan(root)
    plan.store.open(plan.settings)
    other = make_plan(root, **changed)
    with pytest.raises(StoreSettingsError) as caught:
        other.store.open(other.settings)
    assert caught.value.option == option
    assert option in str(caught.value)
    assert "was created with" in str(caught.value)


@pytest.mark.parametrize(("created", "reopened"), [("true", "false"), ("false", "true")])
def test_changed_assume_same_expiry_is_refused_naming_the_recorded_value(
    root: str, created: str, reopened: str
) -> None:
    """Named as such, not as the bucket span or count that follow from it."""
    plan = make_plan(root, **ORDERED_HASHABLE, assumeSameExpiry=created)
    plan.store.open(plan.settings)
    other = make_plan(root, **ORDERED_HASHABLE, assumeSameExpiry=reopened)
    with pytest.raises(StoreSettingsError) as caught:
        other.store.open(other.settings)
    assert (caught.value.option, caught.value.value) == ("assumeSameExpiry", reopened)
    assert f"expected {created}, the value the store at" in str(caught.value)


def test_a_store_recorded_before_assume_same_expiry_existed_reads_as_true(root: str) -> None:
    plan = make_plan(root, **ORDERED_HASHABLE)
    manifest = plan.store.open(plan.settings)
    old = Manifest.from_bytes(manifest.to_bytes(), "m")
    old.version = 1
    plan.store.storage.create(
        plan.store.manifest_path(1), recorded_without(old, "assume_same_expiry")
    )
    assert plan.store.open(plan.settings).version == 1
    other = make_plan(root, **ORDERED_HASHABLE, assumeSameExpiry="false")
    with pytest.raises(StoreSettingsError, match="expected true, the value"):
        other.store.open(other.settings)


def test_changed_bucket_count_is_refused_in_basic_mode(root: str) -> None:
    plan = make_plan(root, keys="id", numBuckets="16")
    plan.store.open(plan.settings)
    other = make_plan(root, keys="id", numBuckets="32")
    with pytest.raises(StoreSettingsError) as caught:
        other.store.open(other.settings)
    assert (caught.value.option, caught.value.value) == ("numBuckets", 32)


def test_changed_key_type_is_refused(root: str) -> None:
    plan = make_plan(root)
    plan.store.open(plan.settings)
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    settings = resolve(plan.options, schema)
    with pytest.raises(StoreSettingsError) as caught:
        plan.store.open(settings)
    assert caught.value.option == "keys"
    assert "id: int64 -> string" in str(caught.value)


def test_a_changed_time_period_is_named_as_people_write_it(root: str) -> None:
    """Periods and spans appear as option values (``48 hours``), not the store's microseconds;
    a missing expiry key as Basic Dedup, not an internal mode name."""
    schema = pa.schema([("id", pa.int64()), ("t", pa.timestamp("us", tz="UTC"))])

    def opened(**raw: str) -> None:
        options = DedupOptions.parse({"path": root, "keys": "id", **raw})
        plan = SinkPlan(options, resolve(options, schema), schema, RUN)
        plan.store.open(plan.settings)

    opened(expiryKey="t", expiryPeriod="24 hours")
    with pytest.raises(StoreSettingsError) as caught:
        opened(expiryKey="t", expiryPeriod="2 days")
    assert "option expiryPeriod='48 hours' is invalid: expected 24 hours, the value" in str(
        caught.value
    )
    with pytest.raises(StoreSettingsError) as caught:
        opened()
    assert "expiryMode='none (Basic Dedup: no expiryKey)' is invalid: expected tupleTime" in str(
        caught.value
    )


def test_max_expiry_jump_may_change_on_reopen(root: str) -> None:
    plan = make_plan(root)
    plan.store.open(plan.settings)
    jumpy = make_plan(root, **ORDERED, maxExpiryJump="100")
    assert jumpy.store.open(jumpy.settings).version == 0


# -- manifests and versions ---------------------------------------------------------------


def rich_manifest(version: int, settings: Settings) -> Manifest:
    segment = Segment("w0000000001-p00000-abc.keys", 8, 48, 2, 12345)
    return Manifest(
        version=version,
        store_id="s" * 32,
        settings=StoreSettings.of(settings),
        committed_ms=1_700_000_000_000,
        latest=42.0,
        categories=["a", "b"],
        files={
            segment.file: WindowFile(segment.file, 1, 0, 2, 56, [3], 41.0, ["b"]),
        },
        buckets={3: [segment]},
        owner=Owner(QUERY, RUN, 1, 10_000, 1),
        queries={QUERY: 7},
        tombstones=[("w0000000000-p00001-def.keys", version)],
        ports={"unique": PortState(3, 2, 10)},
        publication=Publication(
            version,
            "_staging/w1-q-7",
            5,
            (Move("a", "b", 10),),
            (LogEntry("unique", 2, ("b",), 2),),
        ),
        last_window=WindowRecord(version, QUERY, 7, counts(unique=1)),
        totals=StoreTotals(remembered=2),
    )


def test_manifest_round_trips_through_bytes(root: str) -> None:
    manifest = rich_manifest(1, make_plan(root).settings)
    assert Manifest.from_bytes(manifest.to_bytes(), "m") == manifest


def test_a_window_file_entry_holds_stamp_counts_only_when_they_are_known() -> None:
    plain = WindowFile("w0000000001-p00000-abc.keys", 1, 0, 3, 56, [3], 41.0)
    entry = msgpack.unpackb(plain.packed, raw=False)
    # Absent when unknown: an entry written before they were recorded re-encodes unchanged.
    assert "stamp_counts" not in entry and "min_stamp" not in entry
    assert WindowFile.from_wire(entry).packed == plain.packed
    counted = replace(plain, min_stamp=40.0, stamp_counts=((40.0, 1), (41.0, 2)))
    entry = msgpack.unpackb(counted.packed, raw=False)
    assert entry["stamp_counts"] == [[40.0, 1], [41.0, 2]]
    assert WindowFile.from_wire(entry) == counted
    assert [counted.expired_keys(p) for p in (39.0, 40.0, 40.5, 41.0)] == [0, 1, 1, 3]


def test_manifest_encodes_a_changed_window_file_anew(root: str) -> None:
    """A window file's entry is packed once and spliced into every manifest listing it: a
    file is frozen, and a changed one is a new object, packed with its new values."""
    manifest = rich_manifest(1, make_plan(root).settings)
    manifest.to_bytes()
    name = next(iter(manifest.files))
    with pytest.raises(FrozenInstanceError):
        manifest.files[name].keys = 5  # type: ignore[misc]
    manifest.files[name] = replace(manifest.files[name], keys=5, max_stamp=43.0)
    decoded = Manifest.from_bytes(manifest.to_bytes(), "m")
    assert decoded == manifest
    assert (decoded.files[name].keys, decoded.files[name].max_stamp) == (5, 43.0)


def commit_rich_manifest(root: str) -> tuple[SinkPlan, Manifest]:
    """A new store at ``root`` with ``rich_manifest(1)`` committed on top of version 0."""
    plan = make_plan(root)
    plan.store.open(plan.settings)
    manifest = rich_manifest(1, plan.settings)
    plan.store.commit(manifest)
    return plan, manifest


def test_committed_manifest_reads_back_equal(root: str) -> None:
    plan, manifest = commit_rich_manifest(root)
    reopened = BucketStore(plan.options.store_path)
    assert reopened.versions() == [0, 1]
    assert reopened.read() == manifest
    assert reopened.read(0) is not None and reopened.read(0).version == 0  # type: ignore[union-attr]
    assert reopened.read(5) is None


def test_fields_set_on_a_read_manifest_do_not_reach_the_next_read(root: str) -> None:
    plan, committed = commit_rich_manifest(root)
    committed.owner = None  # the committer's object, after the commit
    first = plan.store.read()
    assert first is not None
    first.version, first.publication = 7, None
    assert plan.store.read() == rich_manifest(1, plan.settings)


def test_committing_an_existing_version_is_a_conflict(root: str) -> None:
    plan = make_plan(root)
    store = plan.store
    store.open(plan.settings)
    store.commit(rich_manifest(1, plan.settings))
    other = rich_manifest(1, plan.settings)
    other.committed_ms += 1
    with pytest.raises(StoreConflictError, match=f"already has version 1: query {QUERY}"):
        store.commit(other)
    assert store.read() == rich_manifest(1, plan.settings)


def test_a_create_repeated_after_its_reply_was_lost_is_not_a_conflict(root: str) -> None:
    """A retried create finds the version present; if the bytes are its own, it committed."""
    plan = make_plan(root)
    store = plan.store
    store.open(plan.settings)
    store.commit(rich_manifest(1, plan.settings))
    store.commit(rich_manifest(1, plan.settings))
    assert store.read() == rich_manifest(1, plan.settings)


def test_commit_leaves_no_temporary_files(root: str) -> None:
    plan = make_plan(root)
    plan.store.open(plan.settings)
    run_window(plan, 0, [rows([1, 2], [1, 2])])
    names = list(plan.store.storage.entries(plan.store.path("_log")))
    assert not [n for n in names if n.endswith(".tmp")]


def test_windows_commit_versions_and_reopen_with_their_keys(root: str) -> None:
    plan = make_plan(root)
    report = run_window(plan, 0, [rows([1, 2, 2, None], [1, 2, 2, 3])])
    assert report.counts == counts(unique=2, duplicate=1, error=1)
    run_window(plan, 1, [rows([1, 3], [1, 4])])
    store = BucketStore(plan.options.store_path)
    manifest = store.read()
    assert manifest is not None
    assert (manifest.version, manifest.latest, manifest.queries) == (2, 4, {QUERY: 1})
    assert manifest.totals.remembered == 3
    assert sum(len(k) for k in all_keys(store, manifest, plan.settings).values()) == 3
    assert store.versions() == [0, 1, 2]


def test_an_older_version_stays_readable_after_the_next_commit(root: str) -> None:
    plan = make_plan(root)
    store = plan.store
    run_window(plan, 0, [rows([1, 2, 3], [0, 1, 7])])
    v1 = store.read()
    assert v1 is not None
    before = key_summary(all_keys(store, v1, plan.settings))
    raw_before = store.storage.read(store.manifest_path(1))
    # Version 2 moves the latest point far ahead, which drops version 1's window file.
    run_window(plan, 1, [rows([4, 5], [40, 41])])
    v2 = store.read()
    assert v2 is not None and v2.version == 2
    assert not set(v1.files) & set(v2.files)
    assert store.storage.read(store.manifest_path(1)) == raw_before
    again = store.read(1)
    assert again == v1
    assert key_summary(all_keys(store, again, plan.settings)) == before


def test_old_manifests_beyond_the_kept_number_are_deleted_in_batches(root: str) -> None:
    plan = make_plan(root)
    store = plan.store
    manifest = store.open(plan.settings)
    last = 2 * GARBAGE_EVERY + 1
    for version in range(1, last + 1):
        manifest = Manifest.from_bytes(manifest.to_bytes(), "m")
        manifest.version = version
        store.commit(manifest)
        store.collect_garbage(manifest)
        if version == GARBAGE_EVERY + 1:
            # Version 16's collection deleted version 0 only; nothing since.
            assert store.versions() == list(range(1, version + 1)), "deleted between batches"
    # The collection at version 32 kept the last KEEP_MANIFESTS (17 to 32).
    assert store.versions() == list(range(2 * GARBAGE_EVERY - KEEP_MANIFESTS + 1, last + 1))
    assert store.read() == manifest


# -- window files -------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [12, 70_000])  # a radix sort up to 65,535, else not
def test_grouping_by_bucket_keeps_the_given_order_inside_each_bucket(largest: int) -> None:
    rng = np.random.default_rng(3)
    buckets = rng.integers(0, largest + 1, 400)
    within = rng.permutation(400)
    for given, order in ((np.arange(400), None), (within, within)):
        groups = group_by_bucket(buckets, within=order)
        assert [b for b, _, _ in groups.spans] == sorted(set(buckets.tolist()))
        for bucket, start, end in groups.spans:
            expected = [position for position in given.tolist() if buckets[position] == bucket]
            assert groups.order[start:end].tolist() == expected
    assert group_by_bucket(np.empty(0, np.int64)).spans == []


@pytest.mark.parametrize("stamps_kind", ["none", "int", "float"])
def test_window_file_round_trips_every_segment(root: str, stamps_kind: str) -> None:
    rng = np.random.default_rng(7)
    n = 500
    buckets = rng.integers(0, 13, n)
    h1 = rng.integers(0, 2**64, n, dtype=np.uint64)
    h2 = rng.integers(0, 2**64, n, dtype=np.uint64)
    dtype = {"none": None, "int": np.dtype(np.int64), "float": np.dtype(np.float64)}[stamps_kind]
    stamps = None if dtype is None else (rng.standard_normal(n) * 1e6).astype(dtype)
    name = "w0000000001-p00000-000000000000.keys"
    data, segments = encode_segments(buckets, h1, h2, stamps, name)
    assert bytes(data).startswith(WINDOW_MAGIC)
    assert len(data) == len(WINDOW_MAGIC) + n * 8 * (2 + (stamps is not None))
    store = make_plan(root).store
    store.write_window_file(name, data)
    fetched = store.fetch(list(segments.values()))
    for (bucket, segment), raw in zip(segments.items(), fetched, strict=True):
        decoded = decode_segment(raw, segment, dtype, store.data_path(name))
        mine = buckets == bucket
        assert segment.count == int(mine.sum())
        assert decoded.h1.tolist() == h1[mine].tolist()
        assert decoded.h2.tolist() == h2[mine].tolist()
        if stamps is None:
            assert decoded.stamps is None
        else:
            assert decoded.stamps is not None
            assert decoded.stamps.tolist() == stamps[mine].tolist()
        assert segment.crc == zlib.crc32(raw)


def test_segment_with_a_flipped_bit_is_corrupt() -> None:
    buckets = np.array([0, 0, 1])
    h = np.arange(3, dtype=np.uint64)
    data, segments = encode_segments(buckets, h, h, None, "f.keys")
    segment = segments[0]
    raw = bytearray(data[segment.offset : segment.offset + segment.length])
    raw[3] ^= 1
    with pytest.raises(StoreCorruptError) as caught:
        decode_segment(bytes(raw), segment, None, "/store/data/f.keys")
    assert caught.value.path == "/store/data/f.keys"
    assert "checksum" in str(caught.value)


def test_segment_of_the_wrong_length_is_corrupt() -> None:
    data, segments = encode_segments(
        np.array([0]), np.ones(1, np.uint64), np.ones(1, np.uint64), None, "f"
    )
    segment = segments[0]
    short = data[segment.offset : segment.offset + segment.length - 1]
    with pytest.raises(StoreCorruptError, match="index says"):
        decode_segment(short, segment, None, "f")


def committed_with_keys(root: str) -> tuple[SinkPlan, BucketStore, Manifest, str]:
    plan = make_plan(root)
    run_window(plan, 0, [rows(list(range(1, 9)), [1, 2, 3, 4, 6, 7, 8, 9])])
    store = plan.store
    manifest = store.read()
    assert manifest is not None
    (name,) = manifest.files
    return plan, store, manifest, store.data_path(name)


def url(store: BucketStore, path: str) -> str:
    return store.storage.full_url(path)


def test_bit_flipped_window_file_is_corrupt_naming_the_path(root: str) -> None:
    plan, store, manifest, path = committed_with_keys(root)
    flip_byte(store, path, len(WINDOW_MAGIC) + 5)
    with pytest.raises(StoreCorruptError) as caught:
        all_keys(store, manifest, plan.settings)
    assert caught.value.path == url(store, path)
    assert url(store, path) in str(caught.value)


def test_truncated_window_file_is_corrupt_naming_the_path(root: str) -> None:
    plan, store, manifest, path = committed_with_keys(root)
    truncate(store, path, len(WINDOW_MAGIC) + 30)
    with pytest.raises(StoreCorruptError) as caught:
        all_keys(store, manifest, plan.settings)
    assert caught.value.path == url(store, path)


def test_missing_window_file_is_corrupt_not_empty(root: str) -> None:
    plan, store, manifest, path = committed_with_keys(root)
    store.storage.fs.rm_file(path)
    with pytest.raises(StoreCorruptError, match="missing") as caught:
        all_keys(store, manifest, plan.settings)
    assert caught.value.path == url(store, path)


def test_a_corrupt_window_file_stops_the_next_task(root: str) -> None:
    plan, store, _, path = committed_with_keys(root)
    flip_byte(store, path, len(WINDOW_MAGIC) + 1)
    # The process's bucket cache, warmed by the first window, must not hide the damage.
    with pytest.raises(StoreCorruptError):
        run_tasks(plan, 1, [[rows(list(range(1, 9)), [1, 2, 3, 4, 6, 7, 8, 9])]])


@pytest.mark.parametrize("keep", [0, 3, 16, 40])
def test_truncated_manifest_is_corrupt_naming_the_path(root: str, keep: int) -> None:
    _, store, manifest, _ = committed_with_keys(root)
    path = store.manifest_path(manifest.version)
    truncate(store, path, keep)
    with pytest.raises(StoreCorruptError) as caught:
        store.read()
    assert caught.value.path == url(store, path)
    assert url(store, path) in str(caught.value)


@pytest.mark.parametrize("position", [0, 5, 20, -1])
def test_bit_flipped_manifest_is_corrupt_naming_the_path(root: str, position: int) -> None:
    _, store, manifest, _ = committed_with_keys(root)
    path = store.manifest_path(manifest.version)
    size = len(store.storage.read(path))
    flip_byte(store, path, position % size)
    with pytest.raises(StoreCorruptError) as caught:
        store.read(manifest.version)
    assert caught.value.path == url(store, path)


# -- expiry and garbage -------------------------------------------------------------------


def test_expired_window_files_are_dropped_then_deleted_after_the_grace(root: str) -> None:
    plan = make_plan(root)
    store = plan.store
    run_window(plan, 0, [rows([1, 2], [0, 1])])
    first = store.read()
    assert first is not None
    (old,) = first.files
    run_window(plan, 1, [rows([3], [20])])  # latest 20, E = 10: the first file is expired
    dropped = store.read()
    assert dropped is not None
    assert old not in dropped.files
    assert all(s.file != old for segments in dropped.buckets.values() for s in segments)
    assert (old, 2) in dropped.tombstones
    assert dropped.totals.remembered == 1
    # Deleted by the first collection (every GARBAGE_EVERY versions) after its grace.
    for batch_id in range(2, GARBAGE_EVERY):
        assert old in data_files(store), f"deleted early, at version {batch_id}"
        run_window(plan, batch_id, [rows([10 + batch_id], [20 + batch_id])])
    assert store.read().version == GARBAGE_EVERY  # type: ignore[union-attr]
    assert GARBAGE_EVERY >= 2 + TOMBSTONE_GRACE_VERSIONS
    assert old not in data_files(store)
    run_window(plan, 99, [rows([99], [99])])
    latest = store.read()
    assert latest is not None
    assert all(name != old for name, _ in latest.tombstones), "a deleted file stays listed"


def test_collect_garbage_deletes_only_tombstones_past_their_grace(root: str) -> None:
    plan = make_plan(root)
    store = plan.store
    manifest = store.open(plan.settings)
    for name in ("a.keys", "b.keys"):
        store.write_window_file(name, WINDOW_MAGIC)
    manifest.version = GARBAGE_EVERY
    manifest.tombstones = [("a.keys", GARBAGE_EVERY - 2), ("b.keys", GARBAGE_EVERY - 1)]
    assert store.collect_garbage(manifest) == ["a.keys"]
    assert data_files(store) == {"b.keys"}
    manifest.version += 1
    assert store.collect_garbage(manifest) == [], "collected between batches"


def stamps_after_compaction(tmp_path: Path, **raw: str) -> tuple[list[float], list[float]]:
    """One new key a window until a crowded bucket is compacted; then each key's stamp as
    stored at its own window and as the store holds it after compaction."""
    plan = make_plan(str(tmp_path / "out"), **raw)
    store = plan.store
    compacted = False
    window_stamps: list[float] = []
    ids = ids_of_one_shard(plan.settings, 12)  # one bucket, crowded
    for batch_id in range(12):
        summaries = run_tasks(plan, batch_id, [[rows([ids[batch_id]], [100 + batch_id])]])
        compacted = compacted or bool(summaries[0].written and summaries[0].written.supersedes)
        assert commit_window(plan, summaries, batch_id) is not None
        latest = store.read()
        assert latest is not None and latest.latest is not None
        system_time = plan.settings.mode == "systemTime"
        window_stamps.append(latest.latest if system_time else 100 + batch_id)
    manifest = store.read()
    assert manifest is not None
    assert compacted, "no compaction happened: the test proves nothing"
    assert sum(len(segments) for segments in manifest.buckets.values()) < 12
    buckets = list(all_keys(store, manifest, plan.settings).values())
    keys = buckets[0]
    for more in buckets[1:]:
        keys = keys.merge(more)
    assert keys.stamps is not None
    fps = key_fingerprints(plan.settings, [pa.array(ids, pa.int64())])
    held = [float(keys.stamps[np.flatnonzero(keys.h1 == h)[0]]) for h in fps.h1]
    return [float(s) for s in window_stamps], held


def ids_of_one_shard(settings: Settings, count: int) -> list[int]:
    """The first ``count`` ids that share a key shard with id 0 (so share its buckets)."""
    candidates = pa.array(range(100 * count * settings.shard_count), pa.int64())
    shards = key_shards(settings, key_fingerprints(settings, [candidates]))
    return np.flatnonzero(shards == shards[0])[:count].tolist()


def test_compaction_keeps_each_keys_expiry_value(tmp_path: Path) -> None:
    # Values 100..109 fill time bucket 10; once 110 starts bucket 11, bucket 10 is cold and
    # (with more than 8 segments) folded whole.
    raw = {"keys": "id", "expiryKey": "n", "expiryPeriod": "1000", "bucketSpan": "10"}
    stored, held = stamps_after_compaction(tmp_path, **raw)
    assert held == stored


def test_concatenated_segments_decode_to_the_keys_of_all_of_them() -> None:
    rng = np.random.default_rng(7)
    parts = []
    for n in (5, 0, 3):
        h1 = rng.integers(0, 2**63, n, dtype=np.uint64)
        h2 = rng.integers(0, 2**63, n, dtype=np.uint64)
        stamps = rng.integers(0, 1000, n).astype(np.int64)
        data, segments = encode_segments(np.zeros(n, np.int64), h1, h2, stamps, f"f{n}")
        parts.append((data, segments.get(0, Segment(f"f{n}", len(WINDOW_MAGIC), 0, 0, 0))))
    raws = [data[s.offset : s.offset + s.length] for data, s in parts]
    segments = [s for _, s in parts]
    chunks, folded, top, low = concat_segments(
        raws, segments, np.dtype(np.int64), ["f5", "f0", "f3"], "g", 8
    )
    body = b"".join(chunks)
    decoded = decode_segment(body, folded, np.dtype(np.int64), "g")
    expected = [
        decode_segment(r, s, np.dtype(np.int64), "x") for r, s in zip(raws, segments, strict=True)
    ]
    assert (folded.file, folded.offset, folded.count) == ("g", 8, 8)
    assert decoded.h1.tolist() == np.concatenate([e.h1 for e in expected]).tolist()
    assert decoded.stamps is not None
    stamps = [e.stamps for e in expected if e.stamps is not None]
    assert decoded.stamps.tolist() == np.concatenate(stamps).tolist()
    assert (top, low) == (max(decoded.stamps.tolist()), min(decoded.stamps.tolist()))


def test_concatenation_leaves_out_segments_whose_keys_all_expired() -> None:
    parts = []
    for name, stamps in (("old", [10, 40]), ("mixed", [45, 70]), ("new", [80, 90])):
        h = np.arange(len(stamps), dtype=np.uint64) + np.uint64(len(parts) * 10)
        data, segments = encode_segments(
            np.zeros(len(stamps), np.int64), h, h, np.array(stamps, np.int64), name
        )
        parts.append((data[segments[0].offset :], segments[0]))
    raws, segments = [r for r, _ in parts], [s for _, s in parts]
    paths = ["old", "mixed", "new"]
    chunks, folded, top, low = concat_segments(
        raws, segments, np.dtype(np.int64), paths, "g", 8, 50
    )
    assert folded is not None and folded.count == 4 and (top, low) == (90, 45)
    decoded = decode_segment(b"".join(chunks), folded, np.dtype(np.int64), "g")
    assert decoded.stamps is not None and sorted(decoded.stamps.tolist()) == [45, 70, 80, 90]
    nothing = concat_segments(raws[:1], segments[:1], np.dtype(np.int64), paths[:1], "g", 8, 50)
    assert nothing == ([], None, None, None)
    # A hash bucket's fold leaves out each expired key, not only whole segments.
    chunks, folded, top, low = concat_segments(
        raws, segments, np.dtype(np.int64), paths, "g", 8, 50, each_key=True
    )
    assert folded is not None and folded.count == 3 and (top, low) == (90, 70)
    decoded = decode_segment(b"".join(chunks), folded, np.dtype(np.int64), "g")
    assert decoded.stamps is not None and decoded.stamps.tolist() == [70, 80, 90]
    assert decoded.h1.tolist() == [11, 20, 21]


def test_concatenating_a_damaged_segment_is_refused() -> None:
    h = np.arange(4, dtype=np.uint64)
    data, segments = encode_segments(np.zeros(4, np.int64), h, h, None, "f")
    segment = segments[0]
    raw = bytearray(data[segment.offset : segment.offset + segment.length])
    raw[3] ^= 0xFF
    with pytest.raises(StoreCorruptError, match="checksum"):
        concat_segments([bytes(raw)], [segment], None, ["f"], "g", 8)


def segments_of(*counts: int) -> list[Segment]:
    return [Segment(f"f{i}", 8, 16 * n, n, 0) for i, n in enumerate(counts)]


@pytest.mark.parametrize(
    ("counts", "folded"),
    [
        ((3, 4, 5, 20, 100), 3),  # 3 + 4 + 5 = 12 < 20
        ((1, 50, 60, 200), 2),  # the two smallest always; 60 > 51
        ((7, 7, 7, 7, 7, 7, 7, 7, 56, 112, 500), 10),  # 56 <= 56, 112 <= 112, 500 > 224
        ((5, 5), 2),
    ],
)
def test_a_hash_bucket_folds_its_small_segments(counts: tuple[int, ...], folded: int) -> None:
    segments = segments_of(*counts)
    assert compaction_module.tiered_fold(segments) == segments[:folded]


def test_hash_bucket_folds_rewrite_a_key_a_logarithmic_number_of_times() -> None:
    """A simulated day of one-minute windows: each adds a segment of a few keys to a bucket
    that is compacted every 8 windows while it has more than 8 segments."""
    rng = np.random.default_rng(1)
    counts: list[int] = []
    rewritten = 0
    for window in range(1440):
        counts.append(int(rng.poisson(7)) + 1)
        if window % 8 == 7 and len(counts) > compaction_module.COMPACT_ABOVE_SEGMENTS:
            fold = [s.count for s in compaction_module.tiered_fold(segments_of(*sorted(counts)))]
            rewritten += sum(fold)
            counts = [*sorted(counts)[len(fold) :], sum(fold)]
        assert len(counts) <= 20
    assert rewritten / sum(counts) < 5  # folding all but the 4 largest: 18


def test_a_commit_replaces_folded_segments_and_drops_the_files_left_without_buckets() -> None:
    """Two buckets folded in one window: the file holding only their segments leaves the index
    (tombstoned once), and a file holding a third bucket keeps it."""
    shared = [Segment("shared", 8 + 10 * bucket, 10, 1, 0) for bucket in range(3)]
    only = [Segment("only", 8 + 10 * bucket, 10, 1, 0) for bucket in range(2)]
    folds = [Segment("fold", 8 + 20 * bucket, 20, 2, 0) for bucket in range(2)]
    manifest = Manifest(
        version=3,
        store_id="s",
        settings=StoreSettings("basic", ("id",), ("int64",), None, None, "int", None, None, 3),
        committed_ms=0,
        files={
            "shared": WindowFile("shared", 1, 0, 3, 38, [0, 1, 2]),
            "only": WindowFile("only", 2, 0, 2, 28, [0, 1]),
            "fold": WindowFile("fold", 3, 0, 4, 48, [0, 1]),
        },
        buckets={b: [shared[b], only[b], folds[b]] for b in range(2)} | {2: [shared[2]]},
    )
    supersedes = {b: [list(shared[b].ident), list(only[b].ident)] for b in range(2)}
    written = compaction_module.WrittenWindowFile(None, {}, supersedes, 0)
    transaction_module.apply_updates(manifest, [transaction_module.FoldSegments.of([written])])
    assert manifest.buckets == {0: [folds[0]], 1: [folds[1]], 2: [shared[2]]}
    assert manifest.files["shared"].buckets == [2]
    assert sorted(manifest.files) == ["fold", "shared"]
    assert manifest.tombstones == [("only", 3)]


def test_compaction_keeps_each_system_time_keys_window_time(tmp_path: Path) -> None:
    raw = {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 hour", "numBuckets": "1"}
    stored, held = stamps_after_compaction(tmp_path, **raw)
    assert held == stored


HASH_BUCKET_MODES = [
    {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 hour", "numBuckets": "4"},
    {
        "keys": "id",
        "expiryKey": "n",
        "expiryMode": "categorical",
        "expiryPeriod": "3",
        "numBuckets": "4",
    },
]


def expired_by_reading_every_stamp(plan: SinkPlan, manifest: Manifest, point: float) -> int:
    """The keys at or below ``point`` in the store's window files, each stamp read."""
    segments = [s for bucket in sorted(manifest.buckets) for s in manifest.buckets[bucket]]
    stamps = segment_stamps(plan.store, stamp_dtype(plan.settings))(manifest, segments)
    return int((stamps <= point).sum())


def counted_at(plan: SinkPlan, manifest: Manifest, point: float) -> tuple[int, list[Segment]]:
    """What the commit's count says at an expiry point ``point``, and the segments it read."""
    read = segment_stamps(plan.store, stamp_dtype(plan.settings))
    reads: list[Segment] = []

    def counting(at: Manifest, segments: list[Segment]) -> np.ndarray:
        reads.extend(segments)
        return read(at, segments)

    assert plan.settings.period is not None
    at = replace(manifest, latest=point + plan.settings.period)
    next_version = transaction_module.NextVersion(at, at)
    transaction_module.CountExpiredUnfolded(plan.settings.expiry, counting).apply(next_version)
    return next_version.expired_unfolded_keys, reads


def check_counts_from_stamp_counts(plan: SinkPlan, manifest: Manifest) -> list[float]:
    """At the version's own expiry point and at each of its stamps (and between them), the
    count from stamp counts equals reading every stamp, and reads nothing. Returns the
    stamps."""
    assert all(f.stamp_counts is not None for f in manifest.files.values())
    point = plan.settings.expiry_point(manifest.latest)
    assert point is not None
    assert manifest.expired_unfolded_keys == expired_by_reading_every_stamp(plan, manifest, point)
    stamps = sorted({s for f in manifest.files.values() for s, _ in f.stamp_counts or ()})
    for point in [stamps[0] - 1, *stamps, *(s + 0.5 for s in stamps)]:
        counted, reads = counted_at(plan, manifest, point)
        assert counted == expired_by_reading_every_stamp(plan, manifest, point)
        assert reads == []
    return stamps


@pytest.mark.parametrize("raw", HASH_BUCKET_MODES, ids=["systemTime", "categorical"])
def test_expired_keys_awaiting_fold_are_counted_from_stamp_counts_without_a_read(
    tmp_path: Path, raw: dict[str, str]
) -> None:
    """Each window file records its stamps' counts (systemTime: one stamp a window; categorical:
    one a category), through folds that mix many windows' keys or take some of a file's
    segments: at every version, the count of expired keys at any expiry point equals reading
    every stamp, and reads none."""
    plan = make_plan(str(tmp_path / "out"), **raw)
    folded, mixed, left, first = False, False, False, 0
    for batch_id in range(16):
        size = 12 + 9 * (batch_id % 4)  # uneven windows: buckets' segments differ in size
        ids = list(range(first, first + size))
        first += size
        halves = [[rows(ids[part::2], [batch_id // 3] * len(ids[part::2]))] for part in (0, 1)]
        summaries = run_tasks(plan, batch_id, halves)
        folded = folded or any(s.written and s.written.supersedes for s in summaries)
        assert commit_window(plan, summaries, batch_id) is not None
        manifest = plan.store.read()
        assert manifest is not None
        stamps = check_counts_from_stamp_counts(plan, manifest)
        counts = [f.stamp_counts or () for f in manifest.files.values()]
        mixed = mixed or any(len(c) > 1 for c in counts)
        # A file a fold took some segments of: its counts are of the keys it has left.
        files = manifest.files.values()
        left = left or any(sum(n for _, n in f.stamp_counts or ()) < f.keys for f in files)
    assert folded and mixed and left, "no fold mixed or took part of files: this proves nothing"
    assert len(stamps) > 3
    middle = stamps[len(stamps) // 2]
    held = manifest.remembered_keys + manifest.expired_unfolded_keys
    assert 0 < expired_by_reading_every_stamp(plan, manifest, middle) < held


def test_a_file_without_stamp_counts_is_read_to_count_its_expired_keys(tmp_path: Path) -> None:
    plan = make_plan(str(tmp_path / "out"), **HASH_BUCKET_MODES[1])
    for batch_id in range(3):
        run_window(
            plan, batch_id, [rows(list(range(batch_id * 10, batch_id * 10 + 10)), [batch_id] * 10)]
        )
    manifest = plan.store.read()
    assert manifest is not None
    oldest = min(manifest.files.values(), key=lambda f: f.version)
    # As a file written before stamp counts were recorded.
    manifest.files[oldest.name] = replace(oldest, stamp_counts=None)
    counted, reads = counted_at(plan, manifest, 1)
    assert counted == expired_by_reading_every_stamp(plan, manifest, 1) == 20
    assert {segment.file for segment in reads} == {oldest.name}


OWN_TIME = {"keys": "id", "expiryKey": "n", "expiryPeriod": "30", "assumeSameExpiry": "false"}


def forget_cached_buckets() -> None:
    """What a restart does to the executors' bucket caches: nothing survives it."""
    RUNTIME.reset("store.bucket_managers")


def id_n_rows(output: Path) -> dict[str, Counter[tuple[int | None, int | None]]]:
    """Each port's rows as (id, n) pairs, as a reader of the published files sees them."""
    found: dict[str, Counter[tuple[int | None, int | None]]] = {}
    for port in PORTS:
        table = ds.dataset(str(output / port), format="parquet").to_table()
        pairs = zip(table.column("id").to_pylist(), table.column("n").to_pylist(), strict=True)
        found[port] = Counter(pairs)
    return found


def remembered_stamps(store: BucketStore, settings: Settings) -> dict[tuple[int, int], float]:
    """Every fingerprint the store remembers above its expiry point, with its stamp."""
    manifest = store.read()
    assert manifest is not None and manifest.latest is not None
    keys = KeySet.empty(stamp_dtype(settings))
    for bucket in all_keys(store, manifest, settings).values():
        keys = keys.merge(bucket)
    assert keys.stamps is not None and settings.period is not None
    alive = keys.alive(manifest.latest - settings.period)
    assert alive.stamps is not None
    return dict(
        zip(
            zip(alive.h1.tolist(), alive.h2.tolist(), strict=True),
            alive.stamps.tolist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("seed", [5, 6])
def test_later_resends_over_partitions_compaction_and_a_restart_match_the_reference(
    tmp_path: Path, seed: int
) -> None:
    """assumeSameExpiry=false through the sink's task and commit code: three partitions a
    window, hash buckets compacted and expired window files dropped as in the other hash modes,
    and the caches lost half-way. Every row's port and every remembered key's value (its unique
    row's) agree with the reference."""
    output = tmp_path / "out"
    plan = make_plan(str(output), **OWN_TIME, numBuckets="4")
    assert not plan.settings.buckets_by_time
    reference = ReferenceDedup("ordered", 30)
    expected: dict[str, Counter[tuple[int | None, int | None]]] = {p: Counter() for p in PORTS}
    rng = random.Random(seed)
    compactions = dropped = 0
    for batch_id, window in enumerate(later_resends(seed, 40)):
        if batch_id == 20:
            forget_cached_buckets()
        parts: list[list[tuple[int | None, int | None]]] = [[], [], []]
        for row in window:
            parts[rng.randrange(3)].append(row)
        summaries = run_tasks(
            plan, batch_id, [[rows([k for k, _ in part], [n for _, n in part])] for part in parts]
        )
        compactions += sum(bool(s.written and s.written.supersedes) for s in summaries)
        assert commit_window(plan, summaries, batch_id) is not None
        last = plan.store.read()
        assert last is not None and last.last_window is not None
        dropped += last.last_window.dropped_keys
        dicts = [{"id": k, "n": n} for k, n in window]
        ports = reference.window(dicts, lambda r: r["id"], lambda r: r["n"])
        for row, port in zip(window, ports, strict=True):
            expected[port][row] += 1
    assert id_n_rows(output) == expected
    assert compactions and dropped, "no compaction or no expired file: the test proves little"
    point = reference.latest - 30  # type: ignore[operator]
    alive = {k: v for k, v in reference.remembered.items() if v is not None and v > point}
    fps = key_fingerprints(plan.settings, [pa.array(list(alive), pa.int64())])
    wanted = dict(
        zip(zip(fps.h1.tolist(), fps.h2.tolist(), strict=True), alive.values(), strict=True)
    )
    assert remembered_stamps(plan.store, plan.settings) == wanted
    manifest = plan.store.read()
    assert manifest is not None
    assert max(len(segments) for segments in manifest.buckets.values()) <= 16


def test_first_copies_in_two_partitions_are_remembered_with_the_unique_rows_value(
    tmp_path: Path,
) -> None:
    """The lower partition keeps the key; the partition that yields stores it with the keeper's
    value, not its own row's, so the key is forgotten when the unique row's value expires."""
    output = tmp_path / "out"
    plan = make_plan(str(output), **{**OWN_TIME, "expiryPeriod": "10"})
    first = run_window(plan, 0, [rows([1], [0])], [rows([1], [5])])
    assert (first.counts.unique, first.counts.duplicate) == (1, 1)
    run_window(plan, 1, [rows([9], [12])])
    # E = 2: the unique row's value 0 is at or below it (the other copy's 5 is not).
    assert run_window(plan, 2, [rows([1], [13])]).counts.unique == 1
    assert id_n_rows(output)["unique"] == Counter({(1, 0): 1, (9, 12): 1, (1, 13): 1})


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (OWN_TIME, " | assumeSameExpiry=false"),
        (ORDERED, " | assumeSameExpiry=true"),
        ({"keys": "id"}, ""),
        ({"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 h"}, ""),
    ],
    ids=["false", "true", "basic", "systemTime"],
)
def test_the_log_line_of_a_window_shows_assume_same_expiry_where_it_applies(
    root: str, raw: dict[str, str], shown: str
) -> None:
    line = run_window(make_plan(root, **raw), 0, [rows([1, 2], [1, 2])]).line()
    retries = r" \| 0 store retries \(0\.0 s\)"
    assert re.fullmatch(
        r"dedup window 1 .* \| cache hits (\d+%|n/a)" + re.escape(shown) + retries, line
    )


def test_rerun_of_a_committed_batch_changes_nothing(root: str) -> None:
    plan = make_plan(root)
    run_window(plan, 0, [rows([1, 2], [1, 2])])
    before = plan.store.read()
    summaries = run_tasks(plan, 0, [[rows([1, 2], [1, 2])]])
    assert summaries[0].skipped
    report = commit_window(plan, summaries, 0)
    assert report is not None and report.already_committed
    assert plan.store.read() == before


def test_a_stream_s_rerun_is_recognised_after_more_batch_writes_than_the_queries_kept(
    root: str,
) -> None:
    """Batch writes are never re-run: however many follow, a stopped stream's last batch stays
    recorded, and its re-run at the stream's restart changes nothing."""
    plan = make_plan(root)
    run_window(plan, 7, [rows([1, 2], [1, 2])])  # committed; the stream's checkpoint lacks it
    for write in range(transaction_module.KEEP_QUERIES + 1):
        summary = run_task(
            plan, TaskIdentity(f"batch-{write}", RUN, 0, 0, 0), iter([rows([9], [3])])
        )
        assert commit_window(plan, [summary], 0) is not None
    queries = plan.store.read().queries
    assert queries.get(QUERY) == 7 and [q for q in queries if q.startswith("batch-")] == [
        f"batch-{transaction_module.KEEP_QUERIES}"
    ]
    summaries = run_tasks(plan, 7, [[rows([1, 2], [1, 2])]])
    assert summaries[0].skipped
    report = commit_window(plan, summaries, 7)
    assert report is not None and report.already_committed


# -- crash injection (local disk through faultfs) -----------------------------------------


@pytest.fixture(autouse=True)
def no_faults() -> Iterator[None]:
    FAULTS.reset()
    yield
    FAULTS.reset()


def port_rows(root: Path) -> dict[str, list[int]]:
    """The ids each port holds, as a reader of the published files sees them."""
    out = {}
    for port in PORTS:
        folder = root / port
        if not folder.exists():
            out[port] = []
            continue
        table = ds.dataset(str(folder), format="parquet").to_table()
        out[port] = sorted(table.column("id").to_pylist(), key=lambda v: (v is None, v or 0))
    return out


# -- keys found new by two partitions of one window ---------------------------------------------


def attempt(
    plan: SinkPlan, partition: int, number: int, batch: pa.RecordBatch, run: str = RUN
) -> TaskSummary:
    return run_task(plan, TaskIdentity(QUERY, run, 0, partition, number), iter([batch]))


def keys_file_of(summary: TaskSummary) -> str:
    """The name of the keys file a task staged, as another task's settlement records it."""
    assert summary.settlement.keys_file is not None
    return summary.settlement.keys_file.rpartition("/")[2]


def staged_files(summary: TaskSummary) -> list[tuple[str, str, int]]:
    return sorted((f.port, f.path, f.rows) for f in summary.files)


def test_the_higher_partition_yields_the_keys_a_lower_one_staged(tmp_path: Path) -> None:
    plan = make_plan(str(tmp_path / "out"))
    first = attempt(plan, 0, 0, rows([1, 2, 3, 4], [1, 1, 1, 1]))
    later = attempt(plan, 1, 0, rows([9, 3, 8, 1, 3], [1, 1, 1, 1, 1]))
    # keys 1 and 3; the second 3 is a duplicate
    assert (first.settlement.yielded, later.settlement.yielded) == (0, 2)
    assert later.settlement.complete and later.settlement.saw == {keys_file_of(first)}
    assert later.counts == counts(unique=2, duplicate=3)
    before = staged_files(later)
    report = commit_window(plan, [first, later], 0)
    assert report is not None
    assert staged_files(later) == before  # nothing left for the commit to rewrite
    assert report.cross_partition_duplicates == 2
    assert report.counts == counts(unique=6, duplicate=3)
    assert port_rows(tmp_path / "out") == {
        "unique": [1, 2, 3, 4, 8, 9],
        "duplicate": [1, 3, 3],
        "expired": [],
        "error": [],
    }


def test_a_task_waits_for_a_lower_partition_still_running(tmp_path: Path) -> None:
    plan = make_plan(str(tmp_path / "out"))
    waiting: dict[str, TaskSummary] = {}
    higher = threading.Thread(
        target=lambda: waiting.update(task=attempt(plan, 1, 0, rows([5, 6], [1, 1])))
    )
    higher.start()
    time.sleep(0.3)  # partition 1 has staged its keys and is waiting for partition 0's
    assert higher.is_alive()
    lower = attempt(plan, 0, 0, rows([6, 7], [1, 1]))
    higher.join(30)
    later = waiting["task"]
    assert later.settlement.complete and later.settlement.yielded == 1
    report = commit_window(plan, [lower, later], 0)
    assert report is not None and report.counts == counts(unique=3, duplicate=1)
    assert port_rows(tmp_path / "out")["unique"] == [5, 6, 7]


def test_a_wait_that_runs_out_leaves_the_settlement_to_the_commit(tmp_path: Path) -> None:
    plan = make_plan(str(tmp_path / "out"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settle_module, "SETTLE_WAIT_SECONDS", 0.1)
        later = attempt(plan, 1, 0, rows([5, 6], [1, 1]))  # partition 0 never came
    assert not later.settlement.complete and later.settlement.yielded == 0
    lower = attempt(plan, 0, 0, rows([6, 7], [1, 1]))
    report = commit_window(plan, [lower, later], 0)
    assert report is not None and report.cross_partition_duplicates == 1
    assert port_rows(tmp_path / "out")["unique"] == [5, 6, 7]
    assert port_rows(tmp_path / "out")["duplicate"] == [6]


def test_a_task_that_yielded_to_a_failed_attempt_is_checked_against_its_retry(
    tmp_path: Path,
) -> None:
    plan = make_plan(str(tmp_path / "out"))
    failed = attempt(plan, 0, 0, rows([1, 2, 3], [1, 1, 1]))  # fails after staging its keys
    other = attempt(plan, 1, 0, rows([3, 1, 7], [1, 1, 1]))
    retry = attempt(plan, 0, 1, rows([1, 2, 3], [1, 1, 1]))
    assert (retry.settlement.yielded, other.settlement.yielded) == (0, 2)
    assert other.settlement.saw == {keys_file_of(failed)}
    report = commit_window(plan, [retry, other], 0)
    assert report is not None
    assert report.cross_partition_duplicates == 2
    ports = port_rows(tmp_path / "out")
    assert ports["unique"] == [1, 2, 3, 7]
    assert ports["duplicate"] == [1, 3]


def test_a_key_yielded_to_a_failed_attempt_that_the_retry_lacks_is_promoted_back(
    tmp_path: Path,
) -> None:
    """A retry need not see the same rows (a non-deterministic upstream)."""
    plan = make_plan(str(tmp_path / "out"))
    attempt(plan, 0, 0, rows([1, 5], [1, 1]))
    other = attempt(plan, 1, 0, rows([5, 6], [1, 1]))
    retry = attempt(plan, 0, 1, rows([1, 2], [1, 1]))
    assert (retry.settlement.yielded, other.settlement.yielded) == (0, 1)
    report = commit_window(plan, [retry, other], 0)
    assert report is not None
    assert report.cross_partition_duplicates == 0
    assert report.counts == counts(unique=4)
    assert port_rows(tmp_path / "out")["unique"] == [1, 2, 5, 6]
    manifest = plan.store.read()
    assert manifest is not None  # each key counted once, in the file that holds it
    assert sum(wf.keys for wf in manifest.files.values()) == manifest.remembered_keys == 4
    again = run_window(plan, 1, [rows([5], [1])])  # the promoted key is remembered
    assert again.counts == counts(duplicate=1)


def test_a_key_yielded_to_a_failed_attempt_of_the_same_number_is_promoted_back(
    tmp_path: Path,
) -> None:
    """A stage that Spark runs again counts its tasks' attempts from 0 again: the commit tells
    the keys a task read from its final lower partition's by their file, not their numbers."""
    plan = make_plan(str(tmp_path / "out"))
    attempt(plan, 0, 0, rows([1, 5], [1, 1]))  # the first stage attempt's, then lost
    other = attempt(plan, 1, 0, rows([5, 6], [1, 1]))
    again = attempt(plan, 0, 0, rows([1, 2], [1, 1]))
    assert other.settlement.yielded == 1 and other.settlement.saw != {keys_file_of(again)}
    report = commit_window(plan, [again, other], 0)
    assert report is not None and report.counts == counts(unique=4)
    assert port_rows(tmp_path / "out")["unique"] == [1, 2, 5, 6]
    assert run_window(plan, 1, [rows([5], [1])]).counts == counts(duplicate=1)


def test_a_restarted_query_settles_its_batch_without_the_keys_the_dead_run_staged(
    tmp_path: Path,
) -> None:
    """The dead run's tasks saw the batch's rows partitioned otherwise (a source whose splits
    follow the cluster's size): its staged keys must not decide who keeps a key."""
    plan = make_plan(str(tmp_path / "out"))
    attempt(plan, 0, 0, rows([7], [1]), run="dead")  # the driver dies before the commit
    attempt(plan, 1, 0, rows([8], [1]), run="dead")
    lower = attempt(plan, 0, 0, rows([8], [1]), run="restarted")
    higher = attempt(plan, 1, 0, rows([7], [1]), run="restarted")
    assert higher.settlement.saw == {keys_file_of(lower)} and higher.settlement.yielded == 0
    report = commit_window(plan, [lower, higher], 0)
    assert report is not None and report.counts == counts(unique=2)
    assert port_rows(tmp_path / "out")["unique"] == [7, 8]
    # The new run's first commit sweeps what the dead run staged for the window.
    assert not list((tmp_path / "out" / "_staging").rglob("*.*"))


def test_a_task_settles_every_chunk_rewriting_its_own_earlier_unique_rows(
    tmp_path: Path,
) -> None:
    """A large window's earlier chunks are written before the task can settle: the task reads
    its staged unique file back and moves the yielded rows itself; the commit reads no row."""
    plan = make_plan(str(tmp_path / "out"))
    first = attempt(plan, 0, 0, rows(list(range(10)), [1] * 10))
    chunks = [rows([0, 1, 20], [1, 1, 1]), rows([2, 21], [1, 1])]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(task_module, "COALESCE_ROWS", 3)  # two chunks: only the last one is held
        later = run_task(plan, TaskIdentity(QUERY, RUN, 0, 1, 0), iter(chunks))
    assert later.settlement.yielded == 3 and later.settlement.complete
    assert len(later.settlement.superseded) == 2  # the first unique file and keys file
    before = staged_files(later)
    report = commit_window(plan, [first, later], 0)
    assert report is not None
    assert staged_files(later) == before
    assert report.cross_partition_duplicates == 3
    ports = port_rows(tmp_path / "out")
    assert ports["unique"] == [*range(10), 20, 21]
    assert ports["duplicate"] == [0, 1, 2]


def test_the_commit_moves_rows_out_of_whichever_unique_files_of_a_task_hold_them(
    tmp_path: Path,
) -> None:
    """A task of several chunks that left settling to the commit has a unique file per chunk:
    the commit rewrites only those holding a key a lower partition kept."""
    plan = make_plan(str(tmp_path / "out"))
    first = attempt(plan, 0, 0, rows(list(range(10)), [1] * 10))
    chunks = [rows([0, 20, 21], [1, 1, 1]), rows([22, 23, 24], [1, 1, 1]), rows([2, 25], [1, 1])]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(task_module, "COALESCE_ROWS", 3)
        patch.setattr(settle_module, "SETTLE_WITH_AT_MOST", 0)
        later = run_task(plan, TaskIdentity(QUERY, RUN, 0, 1, 0), iter(chunks))
    assert later.settlement.yielded == 0 and not later.settlement.complete
    unique_files = [f.path for f in later.files if f.port == "unique"]
    assert len(unique_files) == 3
    report = commit_window(plan, [first, later], 0)
    assert report is not None
    assert report.cross_partition_duplicates == 2
    assert unique_files[1] in {f.path for f in later.files}  # untouched: not rewritten
    ports = port_rows(tmp_path / "out")
    assert ports["unique"] == [*range(10), 20, 21, 22, 23, 24, 25]
    assert ports["duplicate"] == [0, 2]


def test_a_key_the_commit_takes_from_a_higher_partition_keeps_the_lower_ones_time(
    tmp_path: Path,
) -> None:
    """With assumeSameExpiry=false the copies of a key carry times of their own: the key is
    remembered with its unique row's, so a commit that moves a higher partition's row to
    duplicate also takes the key out of that task's window file."""
    plan = make_plan(str(tmp_path / "out"), **ORDERED_HASHABLE, assumeSameExpiry="false")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settle_module, "SETTLE_WITH_AT_MOST", 0)
        report = run_window(plan, 0, [rows([1], [5])], [rows([1, 2], [9, 9])])
    assert report.counts == counts(unique=2, duplicate=1)
    assert report.cross_partition_duplicates == 1
    manifest = plan.store.read()
    assert manifest is not None
    assert sum(wf.keys for wf in manifest.files.values()) == manifest.remembered_keys == 2
    remembered = key_summary(all_keys(plan.store, manifest, plan.settings))
    assert sorted(stamp for keys in remembered.values() for _, _, stamp in keys) == [5, 9]
    run_window(plan, 1, [rows([3], [16])])  # the expiry point is 6: key 1 (at 5) is forgotten
    assert run_window(plan, 2, [rows([1, 2], [20, 20])]).counts == counts(unique=1, duplicate=1)


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


CRASH_WINDOW = (
    # Partition 0: new keys, a re-sent key of window 3, an expired row and an error row.
    [rows([6, 7, 5, 1, None], [23, 24, 22, 0, 23])],
    # Partition 1: key 7 again (new in partition 0 too: settled at commit, as the scene stages
    # its tasks as if they had not seen each other's keys) and a new key.
    [rows([7, 8], [24, 25])],
)


# The faulted window is the one whose commit collects garbage (every GARBAGE_EVERY versions).
CRASH_BATCH = GARBAGE_EVERY - 1
BEFORE = CRASH_BATCH  # the version the faulted window is classified against
AFTER = BEFORE + 1


class CrashScene:
    """Committed windows (one dropping an expired window file, which the faulted window's
    commit is due to delete; then empty windows up to the version before a garbage collection)
    and the staged, uncommitted task output of the faulted window, on local disk, copied afresh
    per attempt."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.template = base / "template"
        plan = self.plan(self.template)
        run_window(plan, 0, [rows([1, 2], [0, 1])])
        run_window(plan, 1, [rows([3, 4], [20, 21])])  # drops window 1's file
        run_window(plan, 2, [rows([5], [22])])
        for batch in range(3, CRASH_BATCH):
            run_window(plan, batch, [rows([], [])])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(settle_module, "SETTLE_WITH_AT_MOST", 0)
            self.summaries = run_tasks(plan, CRASH_BATCH, CRASH_WINDOW)
        store = plan.store
        committed = store.read()
        assert committed is not None and committed.version == BEFORE
        self.before = committed
        self.before_keys = key_summary(all_keys(store, committed, plan.settings))
        self.before_ports = port_rows(self.template)
        # Window 1's file, dropped at version 2: the fourth commit is the one to delete it.
        self.doomed = {name for name, dropped in committed.tombstones if dropped == 2}
        assert self.doomed and self.doomed <= data_files(store)
        self.copies = 0

    @staticmethod
    def plan(root: Path) -> SinkPlan:
        return make_plan(fault_url(root))

    def fresh(self) -> Path:
        self.copies += 1
        target = self.base / f"attempt-{self.copies}"
        shutil.copytree(self.template, target)
        return target

    def commit(self, root: Path) -> CommitReport | None:
        return commit_window(self.plan(root), copy.deepcopy(self.summaries), CRASH_BATCH)

    def assert_before_intact(self, root: Path) -> None:
        plan = self.plan(root)
        store = plan.store
        assert store.storage.read(store.manifest_path(BEFORE)) == self.before.to_bytes()
        before = store.read(BEFORE)
        assert before == self.before
        assert key_summary(all_keys(store, before, plan.settings)) == self.before_keys


@pytest.fixture(scope="module")
def crash_scene(tmp_path_factory: pytest.TempPathFactory) -> CrashScene:
    return CrashScene(tmp_path_factory.mktemp("crash"))


@pytest.fixture(scope="module")
def golden(crash_scene: CrashScene) -> dict[str, Any]:
    """The outcome of the fourth window's commit when nothing fails."""
    root = crash_scene.fresh()
    report = crash_scene.commit(root)
    assert report is not None and not report.already_committed
    assert report.cross_partition_duplicates == 1
    store = crash_scene.plan(root).store
    manifest = store.read()
    assert manifest is not None and manifest.version == AFTER
    return {
        "ports": port_rows(root),
        "keys": key_summary(all_keys(store, manifest, crash_scene.plan(root).settings)),
        "latest": manifest.latest,
        "files": data_files(store),
        "counts": report.counts,
    }


def commit_steps(scene: CrashScene) -> int:
    return count_steps(lambda: scene.commit(scene.fresh()))


def test_crash_scene_commit_writes_renames_and_deletes(
    crash_scene: CrashScene, golden: dict[str, Any]
) -> None:
    root = crash_scene.fresh()
    with FAULTS.counting():
        crash_scene.commit(root)
        operations = {operation for _, operation, _ in FAULTS.log}
    assert {"link", "mv", "rm", "makedirs", "open(wb)"} <= operations
    assert golden["counts"] == counts(unique=3, duplicate=2, expired=1, error=1)
    assert golden["ports"] == {
        "unique": [1, 2, 3, 4, 5, 6, 7, 8],
        "duplicate": [5, 7],
        "expired": [1],
        "error": [None],
    }
    assert not crash_scene.doomed & golden["files"]


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_a_commit_failing_at_any_step_keeps_the_previous_version_and_retries(
    crash_scene: CrashScene, golden: dict[str, Any], error: int
) -> None:
    steps = commit_steps(crash_scene)
    assert steps > 10
    for k in range(1, steps + 1):
        root = crash_scene.fresh()
        with FAULTS.failing_at(k, error=error, torn=True), pytest.raises(OSError) as caught:
            crash_scene.commit(root)
        assert caught.value.errno == error
        (failed,) = FAULTS.failed
        where = f"step {k}: {failed[1]} {failed[2]}"
        crash_scene.assert_before_intact(root)
        store = crash_scene.plan(root).store
        if store.versions()[-1] == BEFORE:
            assert port_rows(root) == crash_scene.before_ports, where
        report = crash_scene.commit(root)
        assert report is not None, where
        manifest = store.read()
        assert manifest is not None and manifest.version == AFTER, where
        assert manifest.latest == golden["latest"], where
        assert (
            key_summary(all_keys(store, manifest, crash_scene.plan(root).settings))
            == golden["keys"]
        ), where
        assert port_rows(root) == golden["ports"], where
        crash_scene.assert_before_intact(root)


def test_a_dead_disk_from_any_step_on_keeps_the_previous_version(
    crash_scene: CrashScene, golden: dict[str, Any]
) -> None:
    steps = commit_steps(crash_scene)
    for k in range(1, steps + 1, 3):
        root = crash_scene.fresh()
        with FAULTS.failing_at(k, error=errno.EIO, persistent=True):
            try:
                crash_scene.commit(root)
            except OSError:
                pass
            else:  # only the best-effort clean-up after the commit point failed
                assert crash_scene.plan(root).store.read().version == AFTER  # type: ignore[union-attr]
        crash_scene.assert_before_intact(root)
        assert crash_scene.commit(root) is not None
        assert port_rows(root) == golden["ports"], f"step {k}"


def test_a_task_failing_at_any_step_is_retried_by_a_new_attempt(
    crash_scene: CrashScene, golden: dict[str, Any]
) -> None:
    def task(root: Path, attempt: int) -> TaskSummary:
        identity = TaskIdentity(QUERY, RUN, CRASH_BATCH, 1, attempt)
        return run_task(crash_scene.plan(root), identity, iter(CRASH_WINDOW[1]))

    steps = count_steps(lambda: task(crash_scene.fresh(), 1))
    assert steps >= 3
    for k in range(1, steps + 1):
        root = crash_scene.fresh()
        with FAULTS.failing_at(k, torn=True), pytest.raises(OSError):
            task(root, 1)
        crash_scene.assert_before_intact(root)
        summaries = [copy.deepcopy(crash_scene.summaries[0]), task(root, 2)]
        assert commit_window(crash_scene.plan(root), summaries, CRASH_BATCH) is not None
        store = crash_scene.plan(root).store
        manifest = store.read()
        assert manifest is not None and manifest.version == AFTER
        assert port_rows(root) == golden["ports"], f"step {k}"
        keys = key_summary(all_keys(store, manifest, crash_scene.plan(root).settings))
        assert keys == golden["keys"], f"step {k}"


def test_sorted_keys_find_the_rows_another_task_shares_even_with_h1_collisions() -> None:
    from dedupsink.engine.fingerprint import Fingerprints
    from dedupsink.sink.settle import SortedKeys, StagedKeys

    rng = np.random.default_rng(1)
    for _ in range(200):
        # Few distinct words: many keys share h1 and differ in h2 only.
        pairs = sorted({(int(a), int(b)) for a, b in rng.integers(0, 4, (40, 2))})
        order = rng.permutation(len(pairs))
        mine = Fingerprints(
            np.array([pairs[i][0] for i in order], np.uint64),
            np.array([pairs[i][1] for i in order], np.uint64),
        )
        theirs = Fingerprints(*(rng.integers(0, 4, (2, 30)).astype(np.uint64)))
        shared = set(zip(theirs.h1.tolist(), theirs.h2.tolist(), strict=True))
        found = sorted(set(SortedKeys.of(StagedKeys(mine, None)).rows_of(theirs).tolist()))
        mine_pairs = list(zip(mine.h1.tolist(), mine.h2.tolist(), strict=True))
        assert found == [i for i, pair in enumerate(mine_pairs) if pair in shared]


def test_sorted_keys_built_from_sorted_runs_equal_those_built_by_a_full_sort() -> None:
    from dedupsink.engine.fingerprint import Fingerprints
    from dedupsink.sink.settle import SortedKeys, StagedKeys

    rng = np.random.default_rng(11)
    words = rng.integers(0, 2**63, (2, 3000)).astype(np.uint64)
    stamps = rng.integers(0, 10**9, 3000)
    runs = np.concatenate(
        [start + np.argsort(words[0, start : start + 1000]) for start in (0, 1000, 2000)]
    )
    plain = SortedKeys.of(StagedKeys(Fingerprints(words[0], words[1]), stamps))
    merged = SortedKeys.of(StagedKeys(Fingerprints(words[0], words[1]), stamps, runs))
    for lane in ("h1", "h2", "rows", "stamps"):
        assert np.array_equal(getattr(plain, lane), getattr(merged, lane)), lane


@pytest.mark.parametrize("stamp_dtype", [None, np.dtype(np.int64), np.dtype(np.float64)])
def test_staged_keys_read_back_in_their_task_order(stamp_dtype: np.dtype | None) -> None:
    from dedupsink.engine.fingerprint import Fingerprints
    from dedupsink.sink.settle import SortedKeys, StagedKeys

    rng = np.random.default_rng(7)
    words = rng.integers(0, 2**63, (2, 1000)).astype(np.uint64)
    words[0, 500:510] = words[0, 0]  # some equal first words
    stamps = None if stamp_dtype is None else rng.integers(0, 10**9, 1000).astype(stamp_dtype)
    keys = StagedKeys(Fingerprints(words[0], words[1]), stamps)
    staged = SortedKeys.of(keys)
    data = b"".join(bytes(chunk) for chunk in staged.chunks())
    assert len(data) == 1000 * SortedKeys.width(stamp_dtype)
    back = SortedKeys.from_bytes(data, 1000, stamp_dtype, "keys").in_order()
    assert np.array_equal(back.fingerprints.h1, words[0])
    assert np.array_equal(back.fingerprints.h2, words[1])
    assert (back.stamps is None) if stamps is None else np.array_equal(back.stamps, stamps)


@pytest.mark.parametrize("size", [50, 200_000])  # read whole; read lane by lane
def test_a_task_yields_exactly_the_keys_a_lower_task_staged(tmp_path: Path, size: int) -> None:
    from dedupsink.engine.fingerprint import Fingerprints
    from dedupsink.ports.output import Output
    from dedupsink.sink.settle import (
        SortedKeys,
        StagedKeys,
        _listed_keys_files,
        _yielded_to,
        stage_keys,
    )

    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**64 - 1, (2, 2 * size), dtype=np.uint64)
    mine = Fingerprints(words[0, :size].copy(), words[1, :size].copy())
    theirs = Fingerprints(words[0, size:].copy(), words[1, size:].copy())
    shared = rng.choice(size, size // 10, replace=False)
    theirs.h1[: len(shared)] = mine.h1[shared]
    theirs.h2[: len(shared)] = mine.h2[shared]
    collide = np.setdiff1d(np.arange(size), shared)[:5]  # first word only: not the same key
    theirs.h1[len(shared) : len(shared) + 5] = mine.h1[collide]
    stamps = rng.integers(0, 100, size).astype(np.int64)
    output = Output(str(tmp_path / "out"))
    folder = "_staging/w0000000001-q-0"
    stage_keys(output, folder, 0, 0, SortedKeys.of(StagedKeys(theirs, stamps)))
    lower = _listed_keys_files(output, folder)
    yielded = _yielded_to(output, folder, lower, SortedKeys.of(StagedKeys(mine, stamps)))
    assert sorted(np.flatnonzero(yielded).tolist()) == sorted(shared.tolist())


def test_stamp_counts_are_exact_up_to_the_cap_and_absent_beyond_it() -> None:
    """A file's stamps counted exactly while they take at most the cap's distinct values,
    wherever those values come in the file; none recorded beyond it."""
    few = np.repeat(np.arange(STAMP_COUNTS_CAP, dtype=np.float64), 50)
    np.random.default_rng(3).shuffle(few)
    counted = count_stamps(few)
    assert counted == tuple((float(v), 50) for v in range(STAMP_COUNTS_CAP))
    # Few values first, then one too many far down the file: still none.
    late = np.concatenate([np.zeros(5000), np.arange(STAMP_COUNTS_CAP + 1, dtype=np.float64)])
    assert count_stamps(late) is None
    # Distinct from the start (event times): none.
    assert count_stamps(np.arange(100_000, dtype=np.float64)) is None
    assert count_stamps(None) is None
