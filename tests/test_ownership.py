"""Who may commit to a store (store/ownership.py): redeploys without waiting, two queries at
once, fences.

The rules first, on a real store on the local disk (no Spark): an owner's own run and a restart
of its query commit at once; another query waits for the owner's lease and takes the store
when it lapses, or fails naming the owner if it commits meanwhile; a run that lost the store is
fenced. Then real streams: a fresh query right after an ``availableNow`` run ends continues
within the owner's ``ownerTimeout``, with no release; a second query started while the first
runs fails naming it, and a fresh query afterwards processes everything, each key unique once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from streams import (
    assert_matches_reference,
    check_ports,
    read_port,
    reference_outputs,
    run_stream,
    start_stream,
    write_batches,
)

from dedupsink.errors import StoreOwnershipError
from dedupsink.sink.local import LocalSink
from dedupsink.store.ownership import Writer, claim, next_owner, release, wait_ms
from dedupsink.store.records import now_ms
from dedupsink.store.store import BucketStore

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64())])
OPTIONS = {"keys": "id", "expiryKey": "n", "expiryPeriod": "100", "ownerTimeout": "2 s"}


def table(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "n": pa.array(ids, pa.int64())})


def sink(root: Path, query: str, **options: str) -> LocalSink:
    return LocalSink({"path": str(root / "out"), **OPTIONS, **options}, SCHEMA, query)


def store_of(root: Path) -> BucketStore:
    return BucketStore(str(root / "out" / "_store"))


# -- the rules, without Spark -----------------------------------------------------------------


def test_the_owner_and_a_restart_of_its_query_commit_at_once(tmp_path: Path) -> None:
    first = sink(tmp_path, "q1")
    first.window(0, table([1, 2]))
    owner = store_of(tmp_path).read().owner  # type: ignore[union-attr]
    assert owner is not None and (owner.query, owner.run) == ("q1", first.plan.run)
    assert owner.since == 1
    first.window(1, table([3]))
    again = store_of(tmp_path).read().owner  # type: ignore[union-attr]
    assert again is not None and again.since == 1 and again.heartbeat_ms >= owner.heartbeat_ms
    restarted = first.start()  # the query restarted from its checkpoint: a new run
    started = time.monotonic()
    first.window(2, table([4]))
    assert time.monotonic() - started < 1.5, "a restart of the owner's query does not wait"
    manifest = store_of(tmp_path).read()
    assert manifest is not None and manifest.owner is not None
    assert (manifest.owner.run, manifest.owner.since) == (restarted.run, 3)
    assert [(f.query, f.run, f.by) for f in manifest.fenced] == [("q1", owner.run, "q1")]


def test_a_newcomer_waits_for_the_owners_lease_then_takes_the_store(tmp_path: Path) -> None:
    sink(tmp_path, "owner").window(0, table([1, 2]))
    base = store_of(tmp_path).read()
    assert base is not None and base.owner is not None
    newcomer = Writer("newcomer", "run-n", 10_000)
    assert 0 < wait_ms(base, newcomer, now_ms()) <= 2000
    assert wait_ms(base, newcomer, base.owner.heartbeat_ms + 2000) == 0
    started = time.monotonic()
    report = sink(tmp_path, "newcomer").window(0, table([2, 3]))
    waited = time.monotonic() - started
    assert report is not None and report.counts.unique == 1
    assert 0.5 < waited < 2.0 + 1.5, waited
    manifest = store_of(tmp_path).read()
    assert manifest is not None and manifest.owner is not None
    assert manifest.owner.query == "newcomer"
    assert [(f.query, f.by) for f in manifest.fenced] == [("owner", "newcomer")]


def test_a_newcomer_fails_naming_an_owner_that_commits_while_it_waits(tmp_path: Path) -> None:
    owner = sink(tmp_path, "owner")
    owner.window(0, table([1]))
    store = store_of(tmp_path)
    base = store.read()
    assert base is not None
    writer = Writer("newcomer", "run-n", 2000)

    def owner_commits_again(seconds: float) -> None:
        if not committed.is_set():
            owner.window(1, table([2]))
            committed.set()
        time.sleep(seconds)

    committed = threading.Event()
    with pytest.raises(StoreOwnershipError) as caught:
        claim(store, base, writer, sleep=owner_commits_again)
    message = str(caught.value)
    assert "is in use by streaming query owner" in message
    assert "committed version 2 while streaming query newcomer waited" in message


def test_tasks_split_by_an_owners_commit_fail_naming_the_owner(tmp_path: Path) -> None:
    owner = sink(tmp_path, "owner")
    owner.window(0, table([1]))
    newcomer = sink(tmp_path, "newcomer")
    first = newcomer.task(0, 0, table([10]).to_batches())
    owner.window(1, table([2]))  # the owner commits between the newcomer's two tasks
    second = newcomer.task(0, 1, table([11]).to_batches())
    with pytest.raises(StoreOwnershipError) as caught:
        newcomer.commit(0, [first, second])
    message = str(caught.value)
    assert "is in use by streaming query owner" in message
    assert "while the tasks of streaming query newcomer ran (they read versions 1, 2)" in message
    latest = store_of(tmp_path).read()
    assert latest is not None and latest.version == 2, "the newcomer committed nothing"


def test_a_fenced_run_cannot_commit_again_and_its_tasks_fail_at_once(tmp_path: Path) -> None:
    owner = sink(tmp_path, "owner")
    owner.window(0, table([1]))
    newcomer = sink(tmp_path, "newcomer")
    newcomer.window(0, table([2]))  # waits out the owner's lease, fences its run
    with pytest.raises(StoreOwnershipError) as caught:
        owner.window(1, table([3]))
    message = str(caught.value)
    assert f"streaming query owner (run {owner.plan.run}) no longer owns store" in message
    assert "query newcomer took it over" in message
    owner.start()  # restarted from its checkpoint: a new run, which may take the store back
    newcomer_manifest = store_of(tmp_path).read()
    assert newcomer_manifest is not None
    assert owner.window(1, table([3])) is not None


def test_release_frees_the_store_at_once_and_fences_the_released_run(tmp_path: Path) -> None:
    owner = sink(tmp_path, "owner")
    owner.window(0, table([1]))
    released = release(store_of(tmp_path))
    assert released is not None and released.owner is None
    assert [(f.query, f.by) for f in released.fenced] == [("owner", "release")]
    started = time.monotonic()
    sink(tmp_path, "newcomer").window(0, table([2]))
    assert time.monotonic() - started < 1.0
    with pytest.raises(StoreOwnershipError, match="an operator released it"):
        owner.window(1, table([3]))


def test_next_owner_of_a_batch_write_leaves_the_store_released(tmp_path: Path) -> None:
    sink(tmp_path, "stream").window(0, table([1]))
    base = store_of(tmp_path).read()
    assert base is not None
    batch = Writer("batch-1234", "batch-1234", 2000, "batch write", keeps_store=False)
    owner, fenced = next_owner(base, batch, base.version + 1, now_ms())
    assert owner is None
    assert [(f.query, f.by) for f in fenced] == [("stream", "batch-1234")]


# -- real streams -------------------------------------------------------------------------------


def events(start: int, count: int) -> list[pa.Table]:
    return [table([start + 2 * i, start + 2 * i + 1, start + 2 * i]) for i in range(count)]


@pytest.mark.spark
def test_a_fresh_query_right_after_an_available_now_run_continues_without_release(
    spark: Any, workdir: Path
) -> None:
    """A redeploy: the first query's ``availableNow`` run ends, a new query (fresh checkpoint)
    starts at once on the same store with no release; it waits at most the first query's
    ``ownerTimeout`` and continues from what the store remembers."""
    data = events(0, 3)
    write_batches(workdir / "in", data)
    output = workdir / "out"
    options = {**OPTIONS, "ownerTimeout": "3 s"}
    run_stream(spark, workdir / "in", output, options, workdir / "chk-1")
    first = store_of(workdir).read()
    assert first is not None and first.owner is not None
    started = time.monotonic()
    run_stream(spark, workdir / "in", output, options, workdir / "chk-2")
    elapsed = time.monotonic() - started
    second = store_of(workdir)
    versions = [second.read(v) for v in second.versions()]
    takeover = next(
        m
        for m in versions
        if m is not None and m.owner and m.owner.since == m.version and m.version > first.version
    )
    waited_ms = takeover.committed_ms - first.committed_ms
    assert 0 < waited_ms <= 3000 + 8000, waited_ms  # the lease, plus the first batch's time
    assert elapsed < 30
    assert_matches_reference(
        output, reference_outputs(data + data, "ordered", ["id"], "n", 100), ["id", "n"]
    )
    check_ports(spark, output, ["id", "n"], 2 * len(data))


@pytest.mark.spark
def test_a_second_query_started_while_the_first_runs_fails_naming_it(
    spark: Any, workdir: Path
) -> None:
    """Two queries on one store at once: the one that finds the other committing fails with an
    error naming it and publishes nothing; a fresh query afterwards processes its input, and
    each key is unique exactly once."""
    output = workdir / "out"
    options = {**OPTIONS, "ownerTimeout": "5 s"}
    write_batches(workdir / "first", events(0, 1))
    first = (
        spark.readStream.schema("id BIGINT, n BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(workdir / "first"))
        .writeStream.format("dedup")
        .option("path", str(output))
        .options(**options)
        .option("checkpointLocation", str(workdir / "chk-first"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        feed = 1
        while store_of(workdir).latest_version() in (None, 0):
            time.sleep(0.2)
        write_batches(workdir / "second", events(1000, 2))
        second = start_stream(
            spark, workdir / "second", {"path": str(output), **options}, workdir / "chk-second"
        )
        deadline = time.monotonic() + 60
        while second.isActive and time.monotonic() < deadline:
            # The first query keeps committing: a new file every few hundred milliseconds.
            write_batches(workdir / "first", events(100 * feed, 1), start=feed)
            feed += 1
            time.sleep(0.4)
        with pytest.raises(StreamingQueryException) as caught:
            second.awaitTermination()
        message = str(caught.value)
        assert "StoreOwnershipError" in message
        assert f"is in use by streaming query {first.id}" in message
    finally:
        first.stop()
    ours = [n for n in read_port(output, "unique").column("id").to_pylist() if n >= 1000]
    assert ours == [], "the failed query published rows"
    run_stream(spark, workdir / "second", output, options, workdir / "chk-third")
    unique = read_port(output, "unique").column("id").to_pylist()
    assert len(unique) == len(set(unique))
    expected = {i for t in events(1000, 2) for i in t.column("id").to_pylist()}
    assert expected <= set(unique)
