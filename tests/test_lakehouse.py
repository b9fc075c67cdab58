"""Ports as Delta Lake and Iceberg tables (SPEC §7), read back with each format's own reader.

For ``outputFormat=delta`` and ``iceberg`` alike:

* every mode's stream (basic, tupleTime, ordered, categorical, systemTime), over two
  partitions and restarted from its checkpoint half-way, leaves port tables equal to the
  reference model, with one table commit per window that sent the port rows, tied to a distinct
  store version (``lakehouse.check_tables``);
* a batch write, then a stream, a batch re-run after its sink commit, more input through the
  same checkpoint and a fresh checkpoint on the existing store commit no window twice;
* the same on moto's S3 server (Iceberg with a SQL catalog in a local SQLite file);
* bad options fail before any output, naming what is wrong (mostly without Spark, through
  ``plan_for``);
* DuckDB, an independent reader, reads every port table with the same rows as delta-rs and
  pyiceberg, and skips files by their statistics; Iceberg snapshots carry their summary totals
  and data files their column metrics.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from lakehouse import (
    FORMATS,
    DuckDB,
    PortTables,
    batch_write,
    check_tables,
    per_window,
    rows_of,
    store_of,
)
from pyspark.errors import StreamingQueryException
from servers import S3Server, free_port
from streams import PORT_NAMES, output_listing, run_stream, start_stream, windows_of, write_batches

from dedupsink.errors import DedupOptionError
from dedupsink.sink.local import LocalSink
from dedupsink.sink.plan import plan_for

HOUR_MICROS = 3_600_000_000
START = datetime(2024, 1, 1, tzinfo=UTC)


def body_of(ids: list[int | None]) -> list[str]:
    """A body that is a function of the key: re-sent copies are identical rows, so which copy of
    a window is unique never changes the ports' rows, whatever the partitions."""
    return [f"event {i}" for i in ids]


def at(*minutes: int | None) -> pa.Array:
    values = [None if m is None else START + timedelta(minutes=m) for m in minutes]
    return pa.array(values, pa.timestamp("us", tz="UTC"))


def ints(*values: int | None) -> pa.Array:
    return pa.array(values, pa.int64())


# Per mode: the options, the reference model's mode, expiry key and period, and the windows.
# Each stream has windows that send no rows to some ports (so a table's commits are fewer than
# the windows), copies within and across windows, nulls that go to error.
def basic_stream() -> list[pa.Table]:
    schema = pa.schema([("id", pa.int64()), ("body", pa.string())])

    def window(*ids: int | None) -> pa.Table:
        return pa.table({"id": ints(*ids), "body": body_of(list(ids))}, schema)

    return [
        window(1, 2, 2, 3, None),
        window(4, 5, 6),
        window(1, 4, 4, 7),
        schema.empty_table(),
        window(8, None, 2, 9, 9),
        window(10, 11),
    ]


def time_stream() -> list[pa.Table]:
    def window(ids: list[int | None], minutes: list[int | None]) -> pa.Table:
        return pa.table({"id": ints(*ids), "at": at(*minutes), "body": body_of(ids)})

    return [
        window([1, 2, 2, 3], [0, 5, 5, 10]),
        window([4, 1, 5, None], [30, 0, 40, 45]),
        window([6, 2, 7, 8], [70, 5, 75, None]),
        window([9, 10, 3, 6], [100, 120, 10, 70]),
        window([11, 12, 11], [150, 160, 150]),
        window([13, 1], [200, 0]),
    ]


def ordered_stream() -> list[pa.Table]:
    def window(ids: list[int | None], seqs: list[int | None]) -> pa.Table:
        return pa.table({"id": ints(*ids), "seq": ints(*seqs), "body": body_of(ids)})

    return [
        window([1, 2, 2, 3], [10, 11, 11, 12]),
        window([4, 1, 5, None], [15, 10, 16, 17]),
        window([6, 2, 7, 7], [20, 11, 22, 22]),
        window([8, 3, 9, 10], [25, 12, 26, None]),
        window([11, 6, 12, 9], [30, 20, 31, 26]),
        window([13, 14, 13, 1], [33, 34, 33, 10]),
    ]


def categorical_stream() -> list[pa.Table]:
    def window(ids: list[int], cities: list[str | None]) -> pa.Table:
        return pa.table({"id": ints(*ids), "city": cities, "body": body_of(ids)})

    return [
        window([1, 2, 2], ["Austin", "Austin", "Austin"]),
        window([3, 1, 4], ["Boston", "Austin", None]),
        window([5, 6, 7, 3], ["Chicago", "Austin", "Chicago", "Boston"]),
        window([8, 5, 3], ["Denver", "Chicago", "Boston"]),
        window([9, 9, 1], ["Denver", "Denver", "Austin"]),
    ]


def system_time_stream() -> list[pa.Table]:
    def window(*ids: int | None) -> pa.Table:
        return pa.table({"id": ints(*ids), "body": body_of(list(ids))})

    return [window(1, 2, 2), window(3, 1, None), window(2, 3, 4), window(5, 6), window(6, 1, None)]


MODES: dict[str, tuple[dict[str, str], str, str | None, float | None, Any]] = {
    "basic": ({"keys": "id"}, "basic", None, None, basic_stream),
    "tupleTime": (
        {"keys": "id", "expiryKey": "at", "expiryPeriod": "1 hour", "bucketSpan": "10 minutes"},
        "tupleTime",
        "at",
        HOUR_MICROS,
        time_stream,
    ),
    "ordered": (
        {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10"},
        "ordered",
        "seq",
        10,
        ordered_stream,
    ),
    "categorical": (
        {"keys": "id", "expiryKey": "city", "expiryPeriod": "1"},
        "categorical",
        "city",
        1,
        categorical_stream,
    ),
    # Windows are far less than a day apart: with a day's period nothing expires (the reference
    # model puts windows a second apart, in milliseconds).
    "systemTime": (
        {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 day"},
        "systemTime",
        None,
        1e18,
        system_time_stream,
    ),
}


@pytest.mark.spark
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_mode_restarted_half_way_gives_tables_equal_to_the_reference(
    spark: Any, workdir: Path, fmt: str, mode: str
) -> None:
    """Over two partitions, the stream stopped after half its files and restarted from its
    checkpoint with the rest: each port table equals the reference, one commit per window with
    rows, each carrying that window's rows and a distinct store version."""
    options, model, expiry_key, period, stream = MODES[mode]
    batches = stream()
    tables = PortTables(fmt, workdir / "out")
    source, checkpoint = workdir / "in", workdir / "chk"
    half = len(batches) // 2
    sink = {**tables.sink_options(), **options}
    write_batches(source, batches[:half])
    run_stream(spark, source, workdir / "out", sink, checkpoint, repartition=2)
    expected = per_window(windows_of(batches[:half]), model, ["id"], expiry_key, period)
    check_tables(tables, expected, batches[0].schema.names)

    write_batches(source, batches[half:], start=half)
    run_stream(spark, source, workdir / "out", sink, checkpoint, repartition=2)
    expected = per_window(windows_of(batches), model, ["id"], expiry_key, period)
    check_tables(tables, expected, batches[0].schema.names)
    # The store's windows are the stream's: version N is window N - 1 (version 0 created it).
    manifest = store_of(workdir / "out").read()
    assert manifest is not None and manifest.version == len(batches)


# -- a batch write, a stream, a re-run, a restart and a fresh checkpoint on one store ----------

ORDERED = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10", "ownerTimeout": "1 second"}
COLUMNS = ["id", "seq", "body"]


def history_table() -> pa.Table:
    """A backfill before ``ordered_stream``: some of its first keys (with their expiry values:
    Assumption 1 holds across the backfill and the stream), keys of its own, copies, a null."""
    ids = [0, 1, 2, 3, 20, 21, 2, 21, None]
    seqs = [5, 10, 11, 12, 8, 9, 11, 9, 7]
    return pa.table({"id": ints(*ids), "seq": ints(*seqs), "body": body_of(ids)})


def unlink_commit(checkpoint: Path, batch: int) -> None:
    """Spark forgets that ``batch`` finished: the sink committed it, the checkpoint did not."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def backfill_then_stream(spark: Any, workdir: Path, tables: PortTables) -> None:
    """Batch write; stream 3 files; batch 2 re-run after its sink commit; 2 more files through
    the same checkpoint; then all 5 files again from a fresh checkpoint (no release: the
    ownerTimeout of 1 s lapses). After each step the tables equal the reference."""
    source, first = workdir / "in", workdir / "chk-1"
    data = ordered_stream()[:5]
    sink = {**tables.sink_options(), **ORDERED}
    backfill = history_table()
    batch_write(spark, backfill, workdir / "batches", sink)
    windows = [backfill]

    def check() -> None:
        check_tables(tables, per_window(windows, "ordered", ["id"], "seq", 10), COLUMNS)

    check()
    write_batches(source, data[:3])
    run_stream(spark, source, tables.output, sink, first, repartition=2)
    windows += data[:3]
    check()

    heads = tables.heads()
    unlink_commit(first, 2)
    query = start_stream(spark, source, sink, first, repartition=2)
    query.awaitTermination()
    assert query.lastProgress["batchId"] == 2, "Spark should have run batch 2 again"
    assert tables.heads() == heads, "the re-run batch committed to a table again"
    check()

    write_batches(source, data[3:], start=3)
    run_stream(spark, source, tables.output, sink, first, repartition=2)
    windows += data[3:]
    check()

    run_stream(spark, source, tables.output, sink, workdir / "chk-2", repartition=2)
    windows += data
    check()
    # No attempt failed: every Parquet file in a port folder is one its table references, and
    # nothing of Spark's file sink (its log) or of the staging is left.
    for port in PORT_NAMES:
        assert tables.folder_files(port) == tables.table_files(port), port
    leftovers = [
        name
        for name in output_listing(tables.output)
        if "_spark_metadata" in name or name.startswith("_staging/")
    ]
    assert not leftovers, leftovers


@pytest.mark.spark
@pytest.mark.parametrize("fmt", FORMATS)
def test_backfill_rerun_restart_and_fresh_checkpoint_commit_each_window_once(
    spark: Any, workdir: Path, fmt: str
) -> None:
    backfill_then_stream(spark, workdir, PortTables(fmt, workdir / "out"))


@pytest.mark.spark
@pytest.mark.slow  # on S3, about 9 s a format: CI runs it with `make test-slow`
@pytest.mark.parametrize("fmt", FORMATS)
def test_on_s3_a_backfill_a_stream_and_its_restart_commit_each_window_once(
    spark: Any, workdir: Path, s3: S3Server, fmt: str
) -> None:
    """The store, the tables (and Iceberg's warehouse) on S3; Iceberg's SQL catalog in a local
    SQLite file; Spark's checkpoint and input local."""
    tables = PortTables(fmt, s3.remote("lake"), catalog_db=workdir / "catalog.db")
    source, checkpoint = workdir / "in", workdir / "chk"
    sink = {**tables.sink_options(), **ORDERED}
    backfill, data = history_table(), ordered_stream()
    batch_write(spark, backfill, workdir / "batches", sink)
    write_batches(source, data[:3])
    run_stream(spark, source, tables.output, sink, checkpoint, repartition=2)
    write_batches(source, data[3:], start=3)
    run_stream(spark, source, tables.output, sink, checkpoint, repartition=2)
    expected = per_window([backfill, *data], "ordered", ["id"], "seq", 10)
    check_tables(tables, expected, COLUMNS)
    staged = [name for name in output_listing(tables.output) if name.startswith("_staging/")]
    assert not staged, staged


def test_iceberg_namespace_and_table_options_name_the_tables(workdir: Path) -> None:
    out = workdir / "out"
    options = {"path": str(out), "keys": "id", "outputFormat": "iceberg"}
    LocalSink({**options, "iceberg.namespace": "lake", "iceberg.table": "orders"}, SCHEMA).window(
        0, pa.table({"id": ints(1, 1), "seq": ints(1, 1), "body": ["a", "a"]}, SCHEMA)
    )
    catalog = PortTables("iceberg", out).catalog()
    assert sorted(catalog.list_tables("lake")) == [
        ("lake", f"orders_{port}") for port in sorted(PORT_NAMES)
    ]
    assert catalog.load_table("lake.orders_duplicate").scan().to_arrow().num_rows == 1


@pytest.mark.parametrize("name", ["out#1", "out?1"])
def test_an_iceberg_path_with_a_url_delimiter_works_or_is_refused_before_any_output(
    workdir: Path, name: str
) -> None:
    """'#' and '?' are legal in a local folder's name but cut a URL short: pyiceberg, given the
    tables' locations as file:// URLs, would write their metadata to a folder outside the
    output. Either the tables work, or the sink refuses the path before writing anything."""
    out = workdir / name
    sink = LocalSink({"path": str(out), "keys": "id", "outputFormat": "iceberg"}, SCHEMA)
    try:
        sink.window(0, pa.table({"id": ints(1, 1), "seq": ints(1, 1), "body": ["a", "a"]}, SCHEMA))
    except DedupOptionError as exc:
        assert "path" in str(exc), exc
        assert not (out / "_store").exists()
    else:
        assert PortTables("iceberg", out).read("duplicate").num_rows == 1
    assert sorted(p.name for p in workdir.iterdir()) in ([], [name]), "written outside the output"


def test_iceberg_options_are_refused_with_another_format(workdir: Path) -> None:
    out = workdir / "out"
    message = refused(
        {"path": str(out), "keys": "id", "outputFormat": "delta", "iceberg.table": "orders"}
    )
    assert "iceberg.table" in message and "outputFormat=iceberg" in message, message
    assert not out.exists()


# -- bad input: refused before any output ------------------------------------------------------

SCHEMA = pa.schema([("id", pa.int64()), ("seq", pa.int64()), ("body", pa.string())])


def refused(options: dict[str, str], schema: pa.Schema = SCHEMA) -> str:
    with pytest.raises(DedupOptionError) as caught:
        plan_for(options, schema, "run-1")
    return str(caught.value)


def test_an_unknown_output_format_is_refused_naming_the_accepted_ones(workdir: Path) -> None:
    out = workdir / "out"
    message = refused({"path": str(out), "keys": "id", "outputFormat": "orc"})
    assert "outputFormat" in message and "orc" in message
    assert all(name in message for name in ("parquet", "delta", "iceberg")), message
    assert not out.exists()


def test_iceberg_on_s3_without_a_catalog_is_refused_naming_the_catalog_options(
    s3: S3Server,
) -> None:
    tables = PortTables("iceberg", s3.remote("nocat"))
    options = {"path": tables.remote.url, **tables.remote.sink_options, "keys": "id"}
    message = refused({**options, "outputFormat": "iceberg"})
    assert "iceberg.catalog." in message
    assert "test-secret" not in message
    assert output_listing(tables.output) == {}


def test_an_unreachable_iceberg_catalog_is_refused_before_any_output(workdir: Path) -> None:
    out = workdir / "out"
    uri = f"http://127.0.0.1:{free_port()}"
    options = {"path": str(out), "keys": "id", "outputFormat": "iceberg"}
    message = refused({**options, "iceberg.catalog.type": "rest", "iceberg.catalog.uri": uri})
    assert "iceberg.catalog." in message and uri in message
    assert not out.exists() or PortTables("iceberg", out).port_folders() == []
    assert not (out / "_store").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_store_made_with_parquet_refuses_another_format(workdir: Path, fmt: str) -> None:
    out = workdir / "out"
    sink = LocalSink({"path": str(out), "keys": "id"}, SCHEMA)
    sink.window(0, pa.table({"id": ints(1, 2), "seq": ints(1, 2), "body": ["a", "b"]}, SCHEMA))
    before = output_listing(out)
    message = refused({"path": str(out), "keys": "id", "outputFormat": fmt})
    assert "outputFormat" in message and fmt in message and "parquet" in message, message
    assert output_listing(out) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_table_store_refuses_the_other_table_format_and_parquet(workdir: Path, fmt: str) -> None:
    out = workdir / "out"
    tables = PortTables(fmt, out)
    sink = LocalSink({**tables.sink_options(), "keys": "id"}, SCHEMA)
    sink.window(0, pa.table({"id": ints(1, 2), "seq": ints(1, 2), "body": ["a", "b"]}, SCHEMA))
    before = output_listing(out)
    for other in {"parquet", *FORMATS} - {fmt}:
        message = refused({"path": str(out), "keys": "id", "outputFormat": other})
        assert other in message and fmt in message, message
    assert output_listing(out) == before


@pytest.mark.parametrize(
    ("column", "schema"),
    [
        ("body", pa.schema([("id", pa.int64()), ("seq", pa.int64()), ("body", pa.int64())])),
        ("extra", SCHEMA.append(pa.field("extra", pa.string()))),
        ("body", pa.schema([("id", pa.int64()), ("seq", pa.int64())])),
    ],
    ids=["type-changed", "column-added", "column-dropped"],
)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_table_store_refuses_an_input_whose_columns_differ_naming_the_column(
    workdir: Path, fmt: str, column: str, schema: pa.Schema
) -> None:
    out = workdir / "out"
    tables = PortTables(fmt, out)
    options = {**tables.sink_options(), "keys": "id"}
    LocalSink(options, SCHEMA).window(
        0, pa.table({"id": ints(1, 1), "seq": ints(1, 1), "body": ["a", "a"]}, SCHEMA)
    )
    before, heads = output_listing(out), tables.heads()
    message = refused(options, schema)
    # A new or missing column would be taken with mergeSchema=true; a string becoming a number
    # never is.
    option = "outputFormat" if column == "body" and len(schema) == 3 else "mergeSchema"
    assert column in message and f"option {option}" in message, message
    assert output_listing(out) == before and tables.heads() == heads


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_second_query_of_one_process_with_a_new_column_is_refused_before_any_output(
    workdir: Path, fmt: str
) -> None:
    """The checks made once a process are made again for another input schema: a Delta table
    would otherwise take files with a column its schema does not declare, hidden from readers."""
    out = workdir / "out"
    tables = PortTables(fmt, out)
    options = {**tables.sink_options(), "keys": "id"}
    LocalSink(options, SCHEMA).window(
        0, pa.table({"id": ints(1, 1), "seq": ints(1, 1), "body": ["a", "a"]}, SCHEMA)
    )
    plan_for(options, SCHEMA, "run-2", "once")
    before, heads = output_listing(out), tables.heads()
    with pytest.raises(DedupOptionError) as caught:
        plan_for(options, SCHEMA.append(pa.field("region", pa.string())), "run-3", "once")
    assert "region is new" in str(caught.value), caught.value
    assert output_listing(out) == before and tables.heads() == heads


MISSING_EXTRA = """
import sys
sys.modules[sys.argv[2]] = None  # as if the package were not installed
import pyarrow as pa
from dedupsink.errors import DedupOptionError
from dedupsink.sink.plan import plan_for
try:
    plan_for({"path": sys.argv[1], "keys": "id", "outputFormat": sys.argv[3]},
             pa.schema([("id", pa.int64())]), "run-1")
except DedupOptionError as exc:
    print(exc)
else:
    sys.exit("no error")
"""


@pytest.mark.parametrize(("fmt", "package"), [("delta", "deltalake"), ("iceberg", "pyiceberg")])
def test_a_missing_extra_is_refused_naming_the_pip_install(
    workdir: Path, fmt: str, package: str
) -> None:
    out = workdir / "out"
    done = subprocess.run(
        [sys.executable, "-c", MISSING_EXTRA, str(out), package, fmt],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"pip install 'dedupsink[{fmt}]'" in done.stdout, done.stdout
    assert "outputFormat" in done.stdout
    assert not out.exists() or PortTables(fmt, out).port_folders() == []
    assert not (out / "_store").exists()


@pytest.mark.spark
def test_a_stream_switching_a_parquet_store_to_delta_fails_before_any_output(
    spark: Any, workdir: Path
) -> None:
    """Through Spark: the query fails at its start, naming both formats, and writes nothing."""
    out = workdir / "out"
    LocalSink({"path": str(out), "keys": "id"}, SCHEMA).window(
        0, pa.table({"id": ints(1, 2), "seq": ints(1, 2), "body": ["a", "b"]}, SCHEMA)
    )
    write_batches(workdir / "in", [pa.table({"id": ints(3), "seq": ints(3), "body": ["c"]})])
    before = output_listing(out)
    options = {"path": str(out), "keys": "id", "outputFormat": "delta"}
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(spark, workdir / "in", options, workdir / "chk").awaitTermination()
    message = str(caught.value)
    assert "outputFormat" in message and "delta" in message and "parquet" in message, message
    assert output_listing(out) == before


@pytest.mark.spark
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_new_column_in_a_second_stream_of_one_session_fails_before_any_output(
    spark: Any, workdir: Path, fmt: str
) -> None:
    """Two queries of one Spark session on one output, the second with a fresh checkpoint and
    a column the tables lack: refused at its start, the tables as the first left them."""
    out = workdir / "out"
    tables = PortTables(fmt, out)
    options = {**tables.sink_options(), "keys": "id"}
    write_batches(workdir / "in1", [pa.table({"id": ints(1, 2), "body": ["a", "b"]})])
    start_stream(spark, workdir / "in1", options, workdir / "chk1").awaitTermination()
    write_batches(workdir / "in2", [pa.table({"id": ints(3), "body": ["c"], "region": ["eu"]})])
    before, heads = output_listing(out), tables.heads()
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(spark, workdir / "in2", options, workdir / "chk2").awaitTermination()
    assert "region is new" in str(caught.value), caught.value
    assert output_listing(out) == before and tables.heads() == heads
    assert tables.read("unique").column_names == ["id", "body"]


# -- DuckDB and the tables' statistics -----------------------------------------------------------


def ordered_tables(workdir: Path, fmt: str, windows: list[pa.Table]) -> PortTables:
    """The ordered stream's windows through the sink (in this process, two partitions)."""
    output = workdir / "out"
    tables = PortTables(fmt, output)
    options = {**tables.sink_options(), **MODES["ordered"][0]}
    sink = LocalSink(options, windows[0].schema)
    for batch_id, window in enumerate(windows):
        sink.window(batch_id, window, partitions=2)
    return tables


@pytest.mark.parametrize("fmt", FORMATS)
def test_duckdb_reads_every_port_table_as_the_formats_own_reader(workdir: Path, fmt: str) -> None:
    tables = ordered_tables(workdir, fmt, ordered_stream())
    duckdb = DuckDB()
    for port in PORT_NAMES:
        own = tables.read(port)
        seen = duckdb.read(tables, port)
        assert own.num_rows > 0, port  # the stream sends rows to every port
        assert seen.schema.names == own.schema.names, port
        assert rows_of(seen, own.schema.names) == rows_of(own, own.schema.names), port


@pytest.mark.parametrize("fmt", FORMATS)
def test_duckdb_skips_the_files_a_filter_on_the_expiry_column_rules_out(
    workdir: Path, fmt: str
) -> None:
    """Each window's unique rows are one file of their own range of the expiry key: a filter
    on it reads only the files whose statistics (Delta's add stats, Iceberg's bounds) overlap."""
    windows = [
        pa.table({"id": ints(*ids), "seq": ints(*ids), "body": body_of(list(ids))})
        for ids in ([1, 2, 3], [11, 12, 13], [21, 22, 23], [31, 32, 33])
    ]
    tables = ordered_tables(workdir, fmt, windows)
    duckdb = DuckDB()
    files = len(tables.table_files("unique"))
    assert files >= len(windows)
    assert duckdb.files_read(tables, "unique", "seq > 0") == files
    assert duckdb.files_read(tables, "unique", "seq > 25") == 2  # the last window: one a partition
    assert duckdb.files_read(tables, "unique", "seq > 100") == 0
    assert sorted(duckdb.read(tables, "unique", "seq > 25").column("id").to_pylist()) == [
        31,
        32,
        33,
    ]


def test_iceberg_snapshots_carry_totals_and_data_files_their_column_metrics(
    workdir: Path,
) -> None:
    tables = ordered_tables(workdir, "iceberg", ordered_stream())
    for port in PORT_NAMES:
        table = tables.iceberg(port)
        snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
        assert snapshots, port
        records = files = size = 0
        for snapshot in snapshots:
            summary = snapshot.summary
            assert summary is not None
            added = snapshot.manifests(table.io)
            entries = [e for m in added for e in m.fetch_manifest_entry(table.io)]
            new = [e.data_file for e in entries if e.snapshot_id == snapshot.snapshot_id]
            assert int(summary["added-data-files"]) == len(new), port
            assert int(summary["added-records"]) == sum(f.record_count for f in new), port
            assert int(summary["added-files-size"]) == sum(f.file_size_in_bytes for f in new)
            records += int(summary["added-records"])
            files += len(new)
            size += int(summary["added-files-size"])
            assert int(summary["total-records"]) == records, port
            assert int(summary["total-data-files"]) == files, port
            assert int(summary["total-files-size"]) == size, port
        field_ids = {table.schema().find_field(name).field_id for name in ("id", "seq")}
        for task in table.scan().plan_files():
            data = task.file
            for field_id in field_ids:
                assert data.value_counts[field_id] == data.record_count, port
                nulls = data.null_value_counts[field_id]
                if nulls < data.record_count:  # a column of nulls only has no bounds
                    assert field_id in data.lower_bounds and field_id in data.upper_bounds, port
