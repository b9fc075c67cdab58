"""State that scales out: key placement, a share per task, one shared copy per machine.

Windows go through the sink's own task and commit code (``run_task``, ``commit_window``) on the
local filesystem, split over partitions either by the key shard the store places each key in
(as ``partition_for_dedup`` partitions a Spark input) or round-robin (an input partitioned any
other way). Every mode must give the reference model's answer either way, whatever the number
of partitions and when it changes between windows of one store; a key-partitioned task loads
only its share; the machine's shared copies survive damage and concurrent readers; and a store
written before placement existed opens and is read as before.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reference import ReferenceDedup
from test_cache import MODES, batch_of, window_ids

from dedupsink.engine.classify import PORTS, stamp_dtype
from dedupsink.engine.placement import key_fingerprints, key_shards, shard_of_bucket
from dedupsink.engine.settings import column
from dedupsink.options import DedupOptions
from dedupsink.runtime import RUNTIME
from dedupsink.sink.commit import commit_window
from dedupsink.sink.plan import SinkPlan, TaskIdentity, plan_for
from dedupsink.sink.task import TaskSummary, run_task
from dedupsink.store import cache as cache_module
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.shared import SharedSegments
from dedupsink.store.store import BucketStore

QUERY = "scale-query"


@pytest.fixture(autouse=True)
def share_every_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stores here are small: share their segments whatever their size."""
    monkeypatch.setattr(cache_module, "SHARE_FROM_KEYS", 0)


OLD_STORES = Path(__file__).parent / "data" / "stores_before_placement"
# Partitions per window: one store sees its partition count change between windows.
PARTITION_COUNTS = (1, 2, 4, 4, 2, 1, 3, 4, 2, 4, 1, 4)


def start(root: Path, schema: pa.Schema, run: str, **raw: str) -> SinkPlan:
    return plan_for({"path": str(root), "stateCacheDir": str(root / "_local"), **raw}, schema, run)


def split(
    plan: SinkPlan, rows: Sequence[dict[str, Any]], partitions: int, by_key: bool
) -> list[list[dict[str, Any]]]:
    """The rows of each partition: by key shard (``shard % partitions``, as
    ``partition_for_dedup`` deals them) or round-robin."""
    if not by_key:
        return [list(rows[p::partitions]) for p in range(partitions)]
    manifest = plan.store.read()
    assert manifest is not None
    settings = plan.settings.laid_out_as(manifest.settings)
    batch = batch_of(rows, plan.schema)
    fps = key_fingerprints(settings, [column(batch, name) for name in settings.keys])
    shards = key_shards(settings, fps) % partitions
    return [
        [row for row, s in zip(rows, shards.tolist(), strict=True) if s == p]
        for p in range(partitions)
    ]


def run_window(plan: SinkPlan, number: int, parts: list[list[dict[str, Any]]]) -> list[TaskSummary]:
    summaries = [
        run_task(
            plan, TaskIdentity(QUERY, plan.run, number, p, 0), iter([batch_of(rows, plan.schema)])
        )
        for p, rows in enumerate(parts)
    ]
    report = commit_window(plan, summaries, number)
    assert report is not None
    return summaries


def ports_of_version(root: Path, version: int) -> Counter[tuple[Any, str]]:
    """(key, port) of every row a committed version published."""
    found: Counter[tuple[Any, str]] = Counter()
    for port in PORTS:
        for path in sorted((root / port).glob(f"part-{version:010d}-*.parquet")):
            for key in pq.read_table(path, columns=["id"]).column("id").to_pylist():
                found[(key, str(port))] += 1
    return found


@pytest.mark.parametrize("by_key", [True, False], ids=["key-partitioned", "round-robin"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_answers_as_the_model_whatever_the_partitioning(
    tmp_path: Path, mode: str, by_key: bool
) -> None:
    spec = MODES[mode]
    plan = start(tmp_path, spec["schema"], "run-1", **spec["options"])
    reference = ReferenceDedup(*spec["reference"])
    rng = random.Random(11)
    for number, partitions in enumerate(PARTITION_COUNTS):
        if number == len(PARTITION_COUNTS) // 2:
            plan = start(tmp_path, spec["schema"], "run-2", **spec["options"])  # a restart
        rows = [spec["row"](i, number) for i in window_ids(rng, number)]
        parts = split(plan, rows, partitions, by_key)
        # The model reads a window's rows in partition order: of a key's copies the lowest
        # partition's is unique, and new categories are numbered in that order too.
        in_order = [row for part in parts for row in part]
        ports = reference.window(in_order, lambda r: r["id"], spec["value"])
        run_window(plan, number, parts)
        expected = Counter((row["id"], port) for row, port in zip(in_order, ports, strict=True))
        manifest = plan.store.read()
        assert manifest is not None
        assert ports_of_version(tmp_path, manifest.version) == expected, f"window {number}"
    assert manifest.settings.key_hash == "spark"


def filled_store(root: Path, options: dict[str, str], keys: int) -> SinkPlan:
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    plan = start(root, schema, "fill", **options)
    rows = [{"id": f"key-{i:08d}", "n": i % 1000} for i in range(keys)]
    run_window(plan, 0, split(plan, rows, 2, by_key=False))
    return plan


@pytest.mark.parametrize(
    "options",
    [
        {"keys": "id", "numBuckets": "64"},
        {"keys": "id", "expiryKey": "n", "expiryPeriod": "2000", "bucketSpan": "500"},
    ],
    ids=["hash-buckets", "time-buckets"],
)
def test_a_key_partitioned_task_loads_its_share_of_the_state(
    tmp_path: Path, options: dict[str, str]
) -> None:
    """Partition p of N looks up only the buckets of the shards ``s % N == p``: at most 1.2 x
    the state's bytes / N; a round-robin task needs nearly all of it."""
    plan = filled_store(tmp_path, options, 40_000)
    manifest = plan.store.read()
    assert manifest is not None
    state = sum(s.count for segments in manifest.buckets.values() for s in segments) * (
        24 if plan.settings.stores_stamps else 16
    )
    rows = [{"id": f"key-{i:08d}", "n": i % 1000} for i in range(20_000, 60_000)]
    partitions = 4
    summaries = run_window(plan, 1, split(plan, rows, partitions, by_key=True))
    loaded = [s.state.loaded for s in summaries]
    assert max(loaded) <= 1.2 * state / partitions, (loaded, state)
    assert min(loaded) > 0
    summaries = run_window(plan, 2, split(plan, rows, partitions, by_key=False))
    assert min(s.state.loaded for s in summaries) > 0.8 * state


def test_the_window_record_and_history_carry_the_state_used(tmp_path: Path) -> None:
    plan = filled_store(tmp_path, {"keys": "id", "numBuckets": "16"}, 5_000)
    rows = [{"id": f"key-{i:08d}", "n": 0} for i in range(2_000, 8_000)]
    run_window(plan, 1, split(plan, rows, 2, by_key=True))
    manifest = plan.store.read()
    assert manifest is not None and manifest.last_window is not None
    state = manifest.last_window.state
    assert state.loaded > 0 and state.mapped > 0 and state.loaded_max <= state.loaded
    from dedupsink.store.history import load_history

    history = load_history(str(tmp_path), None, None).to_pylist()
    assert history[-1]["state_loaded_bytes"] == state.loaded
    assert history[-1]["state_mapped_bytes"] == state.mapped


# -- the machine's shared copies ------------------------------------------------------------


def answers(manager: BucketManager, plan: SinkPlan, ids: list[str]) -> list[bool]:
    manifest = plan.store.read()
    assert manifest is not None
    manager.use(manifest)
    settings = plan.settings.laid_out_as(manifest.settings)
    batch = pa.record_batch({"id": pa.array(ids)})
    fps = key_fingerprints(settings, [batch.column(0)])
    from dedupsink.engine.placement import bucket_of

    return manager.remembered(bucket_of(settings, fps, None), fps, None).tolist()


@pytest.mark.parametrize("damage", ["flipped", "truncated", "deleted", "folder-deleted"])
def test_a_damaged_or_missing_shared_copy_is_rebuilt_never_read_as_no_keys(
    tmp_path: Path, damage: str
) -> None:
    plan = filled_store(tmp_path, {"keys": "id", "numBuckets": "4"}, 2_000)
    manifest = plan.store.read()
    assert manifest is not None
    shared_root = tmp_path / "_local"
    probe = [f"key-{i:08d}" for i in range(0, 4_000, 7)]
    expected = [int(key[4:]) < 2_000 for key in probe]

    def manager() -> BucketManager:
        shared = SharedSegments(shared_root, manifest.store_id)
        return BucketManager(plan.store, BucketCache(8), stamp_dtype(plan.settings), shared)

    assert answers(manager(), plan, probe) == expected
    files = sorted(SharedSegments(shared_root, manifest.store_id).folder.glob("*.keys"))
    assert files
    RUNTIME.reset("store.shared_checked")  # a fresh process checks every file it maps
    for path in files:
        if damage == "flipped":
            data = bytearray(path.read_bytes())
            data[-3] ^= 0x5A
            path.write_bytes(bytes(data))
        elif damage == "truncated":
            path.write_bytes(path.read_bytes()[:-8])
        elif damage == "deleted":
            path.unlink()
    if damage == "folder-deleted":
        shutil.rmtree(shared_root)
    again = manager()
    assert answers(again, plan, probe) == expected
    assert again.task_use().fetched > 0  # rebuilt from the store
    rebuilt = sorted(SharedSegments(shared_root, manifest.store_id).folder.glob("*.keys"))
    assert [p.name for p in rebuilt] == [p.name for p in files]
    RUNTIME.reset("store.shared_checked")
    assert answers(manager(), plan, probe) == expected


READER = """
import sys, time
import pyarrow as pa
from pathlib import Path
from dedupsink.engine.classify import stamp_dtype
from dedupsink.engine.placement import bucket_of, key_fingerprints
from dedupsink.options import DedupOptions
from dedupsink.engine.settings import resolve
from dedupsink.store import cache
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.shared import SharedSegments
from dedupsink.store.store import BucketStore

cache.SHARE_FROM_KEYS = 0  # the store is small: share its segments whatever their size
root, rounds = Path(sys.argv[1]), int(sys.argv[2])
store = BucketStore(str(root / "_store"))
checked = 0
deadline = time.monotonic() + 120
while checked < rounds and time.monotonic() < deadline:
    manifest = store.read()
    settings = manifest.settings.engine_settings()
    shared = SharedSegments(root / "_local", manifest.store_id)
    manager = BucketManager(store, BucketCache(64), stamp_dtype(settings), shared).use(manifest)
    windows = manifest.totals.windows
    ids = [f"key-{i:08d}" for i in range(0, (windows + 1) * 1000)]
    fps = key_fingerprints(settings, [pa.array(ids)])
    found = manager.remembered(bucket_of(settings, fps, None), fps, None).tolist()
    want = [i < windows * 1000 for i in range(len(ids))]
    if found != want:
        print(f"wrong at version {manifest.version}")
        sys.exit(1)
    checked += 1
print(f"checked {checked}")
"""


def test_two_processes_read_the_shared_copies_while_a_third_adds_segments(
    tmp_path: Path,
) -> None:
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    plan = start(tmp_path, schema, "writer", keys="id", numBuckets="8")
    rows = [{"id": f"key-{i:08d}", "n": 0} for i in range(1000)]
    run_window(plan, 0, split(plan, rows, 2, by_key=True))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(tmp_path), "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for number in range(1, 12):
        ids = range(number * 1000, number * 1000 + 1000)
        rows = [{"id": f"key-{i:08d}", "n": 0} for i in ids]
        run_window(plan, number, split(plan, rows, 2, by_key=True))
    for reader in readers:
        out, _ = reader.communicate(timeout=180)
        assert reader.returncode == 0, out
        assert "checked" in out


# -- placement is the store's ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["basic", "ordered"])
def test_a_store_written_before_placement_opens_and_reads_as_before(
    tmp_path: Path, name: str
) -> None:
    """Stores written by the release before key placement (tests/data): their keys stay where
    the fingerprint put them, the query adopts that placement, and a window of old and new
    keys is classified as the model says."""
    root = tmp_path / name
    shutil.copytree(OLD_STORES / name, root)
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    options = {
        "basic": {"keys": "id", "numBuckets": "8"},
        "ordered": {"keys": "id", "expiryKey": "n", "expiryPeriod": "400", "bucketSpan": "50"},
    }[name]
    plan = start(root, schema, "after", **options)
    before = plan.store.read()
    assert before is not None and before.settings.key_hash == "fingerprint"
    assert plan.settings.key_hash == "spark"  # the query's default, which the store overrides
    rows = [{"id": i, "n": i} for i in range(250, 420)]  # 250..349 were stored, 350.. are new
    run_window(plan, 3, split(plan, rows, 2, by_key=True))
    after = plan.store.read()
    assert after is not None and after.settings.key_hash == "fingerprint"
    expected = Counter((i, "duplicate" if i < 350 else "unique") for i in range(250, 420))
    assert ports_of_version(root, after.version) == expected


def test_a_new_store_records_its_placement_and_shards_time_buckets(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    plan = start(tmp_path, schema, "r", keys="id", expiryKey="n", expiryPeriod="400")
    manifest = plan.store.read()
    assert manifest is not None
    assert (manifest.settings.key_hash, manifest.settings.key_shards) == ("spark", 16)
    rows = [{"id": i, "n": i % 300} for i in range(5_000)]
    run_window(plan, 0, split(plan, rows, 4, by_key=True))
    manifest = plan.store.read()
    assert manifest is not None
    shards = {shard_of_bucket(plan.settings, b) for b in manifest.buckets}
    assert shards == set(range(16))


def test_keys_spark_cannot_hash_alike_are_placed_by_fingerprint(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.uint64())])
    options = DedupOptions.parse({"path": str(tmp_path), "keys": "id"})
    from dedupsink.engine.settings import resolve

    assert resolve(options, schema).key_hash == "fingerprint"
    store = BucketStore(str(tmp_path / "_store"))
    assert store.read() is None


def test_shard_of_a_key_is_in_range_and_spread() -> None:
    from dedupsink.engine.settings import resolve

    schema = pa.schema([("id", pa.int64())])
    settings = resolve(DedupOptions.parse({"path": "/x", "keys": "id", "numBuckets": "32"}), schema)
    fps = key_fingerprints(settings, [pa.array(np.arange(100_000), pa.int64())])
    shards = key_shards(settings, fps)
    counts = np.bincount(shards, minlength=32)
    assert shards.min() >= 0 and shards.max() < 32
    assert counts.max() < 1.1 * counts.mean()


# -- partition_for_dedup on Spark ------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("partitions", [3, 4])
def test_partition_for_dedup_puts_each_key_shard_in_its_partition(
    spark: Any, tmp_path: Path, partitions: int
) -> None:
    from pyspark.sql import functions as F

    import dedupsink

    rows = [(i, f"user-{i % 997}", i % 5 == 0) for i in range(6_000)]
    df = spark.createDataFrame(rows, "id BIGINT, name STRING, flag BOOLEAN")
    options = {"path": str(tmp_path / "out"), "keys": "id,name,flag", "numBuckets": "32"}
    parted = dedupsink.partition_for_dedup(df, options, partitions=partitions)
    table = parted.withColumn("pid", F.spark_partition_id()).toArrow()
    settings = plan_for(options, table.select(["id", "name", "flag"]).schema, "r", "never").settings
    fps = key_fingerprints(
        settings, [table.column(c).combine_chunks() for c in ("id", "name", "flag")]
    )
    shards = key_shards(settings, fps)
    assert settings.key_hash == "spark" and table.num_rows == len(rows)
    assert (shards % partitions == table.column("pid").to_numpy()).all()
    assert parted.rdd.getNumPartitions() == partitions


@pytest.mark.spark
def test_a_key_partitioned_stream_matches_the_model_and_records_each_tasks_share(
    spark: Any, tmp_path: Path
) -> None:
    from streams import PORT_NAMES, read_port, reference_outputs, write_batches

    import dedupsink

    rng = random.Random(3)
    windows = [
        pa.table(
            {
                "id": pa.array([rng.randrange(0, 3_000) for _ in range(2_000)], pa.int64()),
                "v": pa.array([f"v{w}" for _ in range(2_000)]),
            }
        )
        for w in range(4)
    ]
    write_batches(tmp_path / "in", windows)
    output = tmp_path / "out"
    options = {"path": str(output), "keys": "id", "numBuckets": "16"}
    frame = spark.readStream.schema("id BIGINT, v STRING").option("maxFilesPerTrigger", 1)
    parted = dedupsink.partition_for_dedup(frame.parquet(str(tmp_path / "in")), options, 4)
    query = (
        parted.writeStream.format("dedup")
        .options(**options)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    expected = reference_outputs(windows, "basic", ["id"])
    for port in PORT_NAMES:
        got = Counter(tuple(row.values()) for row in read_port(output, port).to_pylist())
        assert got == expected[port], port
    history = dedupsink.history(str(output)).to_pylist()
    assert len(history) == 4
    manifest = BucketStore(str(output / "_store")).read()
    assert manifest is not None
    state = 16 * manifest.remembered_keys
    for row in history[1:]:
        assert row["state_loaded_max_bytes"] <= 1.2 * state / 4 + 16 * 2_000


def test_inspect_says_where_keys_are_placed(tmp_path: Path) -> None:
    from dedupsink.cli.inspect import placement_text

    old = BucketStore(str(OLD_STORES / "ordered" / "_store")).read()
    assert old is not None
    assert placement_text(old.settings).startswith("by fingerprint")
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    plan = start(tmp_path, schema, "r", keys="id", expiryKey="n", expiryPeriod="400")
    new = plan.store.read()
    assert new is not None
    assert "Spark's hash(keys), 16 key shards a time bucket" in placement_text(new.settings)
