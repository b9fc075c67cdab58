"""Batch writes (``df.write.format("dedup")``): one window of the same store and ports as a stream.

A backfill of two batch writes followed by a stream on the same path, a job run twice, a write
whose keys repeat across four partitions, a refused overwrite (and Spark's own refusal of the
other save modes), a write while a stream owns the store, and, in a child process with task
retries (``local[2,2]``), a task that fails after staging its output and is retried, and a job
whose every attempt fails: each against the reference model of the windows in commit order,
every row in exactly one port once, nothing visible of a failed job.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import TaskContext
from pyspark.sql.types import StructType
from streams import (
    PORT_NAMES,
    arrow_counts,
    assert_matches_reference,
    check_ports,
    output_listing,
    reference_outputs,
    run_script,
    run_stream,
    write_batches,
)

from dedupsink.sink.datasource import DedupBatchWriter, DedupCommitMessage, DedupDataSource
from dedupsink.sink.plan import SinkPlan
from dedupsink.store.store import BucketStore

COLUMNS = ["id", "seq", "body"]
OPTIONS = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "1000"}


def rows(ids: list[int | None], seqs: list[int | None]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "seq": pa.array(seqs, pa.int64()),
            "body": [f"event {i}" for i in ids],
        }
    )


def history(first: int, count: int, repeat: int = 10) -> pa.Table:
    """``count`` events from id ``first``, every ``repeat``-th re-sent once, and a null key."""
    ids = list(range(first, first + count))
    ids += [*ids[::repeat], None]
    return rows(ids, [i if i is not None else 0 for i in ids])


def frame_of(spark: Any, table: pa.Table, folder: Path) -> Any:
    """A DataFrame of ``table``'s rows, read from a Parquet file of its own."""
    path = folder / f"input-{uuid.uuid4().hex[:8]}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return spark.read.parquet(str(path))


def write(spark: Any, table: pa.Table, output: Path, partitions: int = 4, **options: str) -> None:
    frame = frame_of(spark, table, output.parent / "inputs").repartition(partitions)
    writer = frame.write.format("dedup").mode("append")
    for key, value in {**OPTIONS, **options}.items():
        writer = writer.option(key, value)
    writer.save(str(output))


def expected(windows: list[pa.Table]) -> dict[str, Any]:
    return reference_outputs(windows, "ordered", ["id"], "seq", 1000)


@pytest.mark.spark
def test_a_backfill_of_two_writes_then_a_stream_share_one_memory_of_keys(
    spark: Any, workdir: Path
) -> None:
    output = workdir / "out"
    first, second = history(0, 300), history(250, 300)
    write(spark, first, output)
    write(spark, second, output)
    stream = [rows([100, 700, 701], [100, 700, 701]), rows([700, 550, 800], [700, 550, 800])]
    write_batches(workdir / "in", stream)
    run_stream(spark, workdir / "in", output, OPTIONS, workdir / "chk")
    assert_matches_reference(output, expected([first, second, *stream]), COLUMNS)
    check_ports(spark, output, COLUMNS, 4)
    manifest = BucketStore(str(output / "_store")).read()
    assert manifest is not None and manifest.owner is not None  # the stream holds it now


@pytest.mark.spark
def test_the_same_job_run_twice_puts_every_row_in_duplicate_the_second_time(
    spark: Any, workdir: Path
) -> None:
    output, table = workdir / "out", history(0, 200)
    write(spark, table, output)
    before = arrow_counts(output)
    write(spark, table, output)
    after = arrow_counts(output)
    assert after["unique"] == before["unique"]
    assert after["duplicate"] - before["duplicate"] == table.num_rows - before["error"]
    assert after["error"] == 2 * before["error"]
    assert_matches_reference(output, expected([table, table]), COLUMNS)
    check_ports(spark, output, COLUMNS, 2)


@pytest.mark.spark
def test_keys_repeated_across_four_partitions_leave_one_unique_each(
    spark: Any, workdir: Path
) -> None:
    """Every key comes three times, dealt over four partitions: one copy is unique, settled by
    the tasks themselves (the lowest partition keeps), the commit moving no row."""
    ids = list(range(400)) * 3
    table = rows(ids, ids)
    output = workdir / "out"
    write(spark, table, output, partitions=4)
    unique = sorted(pa.concat_tables([_port(output, "unique")]).column("id").to_pylist())
    assert unique == list(range(400))
    assert_matches_reference(output, expected([table]), COLUMNS)
    manifest = BucketStore(str(output / "_store")).read()
    assert manifest is not None and manifest.last_window is not None
    assert manifest.last_window.cross_partition_duplicates > 0
    assert manifest.remembered_keys == 400  # each key remembered once, by its keeper


def _port(output: Path, port: str) -> pa.Table:
    from streams import read_port

    return read_port(output, port)


@pytest.mark.spark
def test_overwrite_is_refused_before_anything_is_written(spark: Any, workdir: Path) -> None:
    output = workdir / "out"
    write(spark, history(0, 50), output)
    before = output_listing(output)
    frame = frame_of(spark, history(0, 50), workdir / "inputs")
    with pytest.raises(Exception, match="DedupOptionError") as caught:
        frame.write.format("dedup").options(**OPTIONS).mode("overwrite").save(str(output))
    assert "option mode='overwrite' is invalid: expected append" in str(caught.value)
    assert output_listing(output) == before
    for mode in ("error", "ignore"):  # Spark refuses these itself, naming the mode
        with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE") as refused:
            frame.write.format("dedup").options(**OPTIONS).mode(mode).save(str(output))
        assert {"error": "ErrorIfExists", "ignore": "Ignore"}[mode] in str(refused.value)
    assert output_listing(output) == before


@pytest.mark.spark
def test_a_batch_write_while_a_stream_owns_the_store_fails_naming_the_query(
    spark: Any, workdir: Path
) -> None:
    output = workdir / "out"
    options = {**OPTIONS, "ownerTimeout": "5 s"}
    write_batches(workdir / "in", [rows([1], [1])])
    stream = (
        spark.readStream.schema("id BIGINT, seq BIGINT, body STRING")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(workdir / "in"))
        .writeStream.format("dedup")
        .option("path", str(output))
        .options(**options)
        .option("checkpointLocation", str(workdir / "chk"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        while BucketStore(str(output / "_store")).latest_version() in (None, 0):
            time.sleep(0.2)
        feeding = {"stop": False, "next": 1}

        def feed() -> None:
            while not feeding["stop"]:
                n = feeding["next"]
                write_batches(workdir / "in", [rows([1000 + n], [1000 + n])], start=n)
                feeding["next"] += 1
                time.sleep(0.4)

        import threading

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            with pytest.raises(Exception, match="StoreOwnershipError") as caught:
                write(spark, history(5000, 50), output, **options)
        finally:
            feeding["stop"] = True
            feeder.join(5)
        assert f"is in use by streaming query {stream.id}" in str(caught.value)
    finally:
        stream.stop()
    unique = _port(output, "unique").column("id").to_pylist()
    assert not [i for i in unique if i is not None and 5000 <= i < 6000], "the write published"


# -- in a child process with task retries (local[2,2]) ---------------------------------------


class FlakyBatchWriter(DedupBatchWriter):
    """The sink's batch writer, failing partition 0 after its output is staged, ``fail_times``
    times (counted in ``fail_dir``; -1: every attempt)."""

    def __init__(self, plan: SinkPlan, fail_dir: str, fail_times: int) -> None:
        super().__init__(plan)
        self.fail_dir = fail_dir
        self.fail_times = fail_times

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        message = super().write(iterator)
        context = TaskContext.get()
        assert context is not None
        failures = Path(self.fail_dir)
        failed = len(list(failures.iterdir()))
        if context.partitionId() == 0 and (self.fail_times < 0 or failed < self.fail_times):
            (failures / f"attempt-{context.attemptNumber()}-{uuid.uuid4().hex}").touch()
            raise RuntimeError(f"injected failure of attempt {context.attemptNumber()}")
        return message


class FlakyBatchDataSource(DedupDataSource):
    """``format("dedup_flaky_batch")``: the dedup sink with options failDir and failTimes."""

    @classmethod
    def name(cls) -> str:
        return "dedup_flaky_batch"

    def writer(self, schema: StructType, overwrite: bool) -> FlakyBatchWriter:
        fail_dir = self.options.pop("failDir")
        fail_times = int(self.options.pop("failTimes"))
        return FlakyBatchWriter(super().writer(schema, overwrite).plan, fail_dir, fail_times)


def main(argument: str) -> None:
    """Child process: the batch writes of ``argument`` on a session with task retries."""
    from conftest import build_session

    job = json.loads(argument)
    spark = build_session(job["master"], "dedupsink-batch-retries")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FlakyBatchDataSource)
    try:
        for run in job["writes"]:
            frame = spark.read.parquet(run["input"]).repartition(4)
            writer = frame.write.format("dedup_flaky_batch").mode("append")
            for key, value in {**OPTIONS, **run["options"]}.items():
                writer = writer.option(key, value)
            try:
                writer.save(run["output"])
            except Exception:
                if not run.get("expect_failure"):
                    raise
            else:
                assert not run.get("expect_failure"), "the write should have failed"
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch-retries")
    write_batches(root / "in", [history(0, 300)])
    writes = []
    for name, times, expect_failure in (("once", 1, False), ("always", -1, True)):
        (root / name / "failures").mkdir(parents=True)
        options = {"failDir": str(root / name / "failures"), "failTimes": str(times)}
        writes.append(
            {
                "input": str(root / "in"),
                "output": str(root / name / "out"),
                "options": options,
                "expect_failure": expect_failure,
            }
        )
    run_script(Path(__file__), {"master": "local[2,2]", "writes": writes})
    return root


@pytest.mark.spark
@pytest.mark.slow  # the fixture runs a Spark of its own with task retries: 24 s
def test_a_task_failing_after_staging_is_retried_and_its_rows_land_once(
    spark: Any, retried: Path
) -> None:
    output = retried / "once" / "out"
    assert len(list((retried / "once" / "failures").iterdir())) == 1
    assert_matches_reference(output, expected([history(0, 300)]), COLUMNS)
    check_ports(spark, output, COLUMNS, 1)


@pytest.mark.spark
@pytest.mark.slow  # shares the fixture above
def test_a_job_that_fails_before_its_commit_leaves_nothing_visible(retried: Path) -> None:
    output = retried / "always" / "out"
    assert len(list((retried / "always" / "failures").iterdir())) == 2  # both attempts
    store = BucketStore(str(output / "_store"))
    manifest = store.read()
    assert manifest is not None and manifest.version == 0  # created, nothing committed
    visible = {p: n for p, n in output_listing(output).items() if p.split("/")[0] in PORT_NAMES}
    assert visible == {}


if __name__ == "__main__":
    main(sys.argv[1])
