"""The smoke set of the compatibility suite, run by ``make test-compat`` against each PySpark
release the package accepts, each in a venv of its own (``tools/compat.py``).

Against the real release, as a user runs it: a stream with ``availableNow`` and its restart from
the checkpoint, then a batch write to the same store, each row in one port once; the history
read back with ``spark.read.format("dedup")``; a stream with Delta Lake ports, read back with
delta-rs; a bad option's one line, before any output; and the Arrow schema the sink derives
from Spark's, which goes through PySpark's private helper (``dedupsink.sink.compat``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from streams import (
    check_ports,
    output_listing,
    read_port,
    run_stream,
    start_stream,
    write_batches,
)

pytestmark = [pytest.mark.compat, pytest.mark.spark]

COLUMNS = ["id", "ts", "body"]
OPTIONS = {"keys": "id"}
START = datetime(2026, 1, 1, tzinfo=UTC)
UTC_MICROS = pa.timestamp("us", tz="UTC")


def ids(out: Path, port: str) -> list[int]:
    return sorted(read_port(out, port).column("id").to_pylist())


def events(numbers: list[int]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(numbers, pa.int64()),
            "ts": pa.array([START + timedelta(seconds=i) for i in numbers], UTC_MICROS),
            "body": [f"event {i}" for i in numbers],
        }
    )


def test_the_release_is_the_one_under_test() -> None:
    import pyspark

    assert pyspark.__version__ == __import__("os").environ["DEDUPSINK_COMPAT_PYSPARK"]


def test_the_arrow_schema_of_a_spark_schema_is_the_same_on_every_release() -> None:
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    from dedupsink.sink.compat import arrow_schema

    inner = StructType([StructField("at", TimestampType()), StructField("n", LongType(), False)])
    spark_schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("ts", TimestampType()),
            StructField("local", TimestampNTZType()),
            StructField("amount", DecimalType(12, 2)),
            StructField("tags", ArrayType(StringType())),
            StructField("attributes", MapType(StringType(), LongType())),
            StructField("inner", inner),
        ]
    )
    inner_arrow = pa.struct([pa.field("at", UTC_MICROS), pa.field("n", pa.int64(), False)])
    assert arrow_schema(spark_schema) == pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("ts", UTC_MICROS),
            pa.field("local", pa.timestamp("us")),
            pa.field("amount", pa.decimal128(12, 2)),
            pa.field("tags", pa.list_(pa.field("element", pa.string()))),
            pa.field("attributes", pa.map_(pa.field("key", pa.string(), False), pa.int64())),
            pa.field("inner", inner_arrow),
        ]
    )


@pytest.fixture(scope="module")
def parquet_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two windows of a stream, a third after its restart from the checkpoint, then a batch
    write of ids 25 to 34 to the same path."""
    root = tmp_path_factory.mktemp("parquet")
    out, inputs, checkpoint = root / "out", root / "in", root / "cp"
    write_batches(inputs, [events(list(range(10))), events([*range(10, 20), 7, 8, 9])])
    run_stream(spark, inputs, out, OPTIONS, checkpoint)
    write_batches(inputs, [events([*range(20, 30), 17, 18, 19])], start=2)
    run_stream(spark, inputs, out, OPTIONS, checkpoint)
    pa.parquet.write_table(events(list(range(25, 35))), root / "backfill.parquet")
    frame = spark.read.parquet(str(root / "backfill.parquet"))
    frame.write.format("dedup").options(**OPTIONS).mode("append").save(str(out))
    return out


def test_a_restarted_stream_and_a_batch_write_give_each_row_once(
    spark: Any, parquet_run: Path
) -> None:
    assert ids(parquet_run, "unique") == list(range(35))
    assert ids(parquet_run, "duplicate") == [7, 8, 9, 17, 18, 19, *range(25, 30)]
    assert read_port(parquet_run, "unique").schema.field("ts").type == UTC_MICROS
    check_ports(spark, parquet_run, COLUMNS, windows=4)


def test_the_history_reader_gives_a_row_a_window(spark: Any, parquet_run: Path) -> None:
    frame = spark.read.format("dedup").load(str(parquet_run)).orderBy("version")
    rows = [row.asDict() for row in frame.collect()]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert [r["batch_id"] for r in rows] == [0, 1, 2, 0]
    assert len({r["query_id"] for r in rows[:3]}) == 1, "one query, restarted"
    assert rows[3]["query_id"].startswith("batch-")
    assert [(r["unique"], r["duplicate"]) for r in rows] == [(10, 0), (10, 3), (10, 3), (5, 5)]


def test_delta_ports_are_read_back_by_delta_rs(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    out, inputs = tmp_path / "out", tmp_path / "in"
    write_batches(inputs, [events(list(range(10))), events([*range(10, 20), 3, 4])])
    run_stream(spark, inputs, out, {**OPTIONS, "outputFormat": "delta"}, tmp_path / "cp")
    unique = DeltaTable(str(out / "unique"))
    duplicate = DeltaTable(str(out / "duplicate"))
    assert sorted(unique.to_pyarrow_table().column("id").to_pylist()) == list(range(20))
    assert sorted(duplicate.to_pyarrow_table().column("id").to_pylist()) == [3, 4]
    assert unique.schema().to_arrow().field("ts").type == UTC_MICROS
    assert unique.version() >= 2  # the table's creation and a commit a window


STREAM_FAILED = re.compile(
    r"\[STREAM_FAILED\] Query \[id = [-0-9a-f]+, runId = [-0-9a-f]+\] terminated with "
    r"exception: (.*)"
)
NOPE = (
    "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "
    "dedupsink.errors.DedupOptionError: option keys='id,nope' is invalid: expected columns of "
    "the stream; 'nope' is not one of ['id', 'ts', 'body']"
)


def test_a_bad_option_is_refused_in_one_line_before_any_output(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    out, inputs = tmp_path / "out", tmp_path / "in"
    write_batches(inputs, [events(list(range(10)))])
    query = start_stream(spark, inputs, {"path": str(out), "keys": "id,nope"}, tmp_path / "cp")
    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination()
    found = STREAM_FAILED.fullmatch(str(caught.value).splitlines()[0])
    assert found is not None, str(caught.value)
    assert found.group(1) == NOPE
    assert "Traceback" not in str(caught.value)
    assert output_listing(out) == {}
