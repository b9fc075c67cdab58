"""Bad and awkward input: every row goes to the right port, or the query stops with a clear
error before writing; the query never crashes on a value.

Most cases run the sink's batch code in this process (``InProcessSink``: ``streamWriter``,
``run_task`` per partition, the writer's ``commit``), where pyarrow can build values Spark
cannot (timestamps in seconds beyond the microsecond range, unsigned 64-bit numbers). Two Spark
streams carry what Spark can: null and empty keys, 1 MB keys, keys differing only in Unicode
normalisation, times before 1970 and after 9999, a far-future time against maxExpiryJump, an
empty batch, a batch of only errors, and nested struct keys with binary and decimal fields
against NaN and infinite ordered expiry values.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from faults import InProcessSink, write_inputs

from dedupsink.errors import StoreSettingsError
from dedupsink.store.store import BucketStore

PORTS = ("unique", "duplicate", "expired", "error")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MEGABYTE_KEY = "k" * (1 << 20)
NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")


def micros(when: datetime) -> int:
    return (when - EPOCH) // timedelta(microseconds=1)


def year_12000() -> int:
    """Microseconds since 1970 of 12000-01-01 (a datetime cannot hold it; int64 can)."""
    return micros(datetime(9999, 1, 1, tzinfo=UTC)) + 2001 * 365 * 86_400_000_000


def outcome(output: Path) -> dict[int, tuple[str, str | None]]:
    """Each row id's port, with the error reason for error rows."""
    found: dict[int, tuple[str, str | None]] = {}
    for port in PORTS:
        folder = output / port
        if not folder.exists():
            continue
        table = ds.dataset(str(folder), format="parquet").to_table()
        reasons = (
            table.column("_dedup_error").to_pylist() if port == "error" else [None] * len(table)
        )
        for rid, reason in zip(table.column("rid").to_pylist(), reasons, strict=True):
            assert rid not in found, f"row {rid} in {found[rid][0]} and {port}"
            found[rid] = (port, reason)
    return found


def ports_of(found: Mapping[int, tuple[str, str | None]]) -> dict[int, str]:
    return {rid: port for rid, (port, _) in found.items()}


def run_windows(
    root: Path,
    options: Mapping[str, str],
    windows: Sequence[pa.Table],
    partitions: int = 1,
) -> dict[int, tuple[str, str | None]]:
    sink = InProcessSink(str(root / "out"), options, windows[0].schema)
    for batch, table in enumerate(windows):
        sink.window(batch, table, partitions)
    return outcome(root / "out")


def rows(schema: pa.Schema, *records: tuple[Any, ...]) -> pa.Table:
    columns = list(zip(*records, strict=True)) if records else [[] for _ in schema]
    return pa.table(
        [pa.array(list(c), f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


# -- keys ---------------------------------------------------------------------------------------

STRING_KEYS = pa.schema([("rid", pa.int64()), ("k", pa.string())])
BINARY_KEYS = pa.schema([("rid", pa.int64()), ("k", pa.binary())])


def test_null_keys_are_errors_and_empty_keys_are_ordinary_keys(tmp_path: Path) -> None:
    windows = [
        rows(STRING_KEYS, (0, None), (1, ""), (2, ""), (3, " "), (4, "\x00"), (5, "\x00\x00")),
        rows(STRING_KEYS, (6, ""), (7, "\x00"), (8, None)),
    ]
    found = run_windows(tmp_path / "text", {"keys": "k"}, windows)
    assert ports_of(found) == {
        0: "error", 1: "unique", 2: "duplicate", 3: "unique", 4: "unique", 5: "unique",
        6: "duplicate", 7: "duplicate", 8: "error",
    }  # fmt: skip
    assert found[0][1] == found[8][1] == "null key column 'k'"
    binary = [
        rows(BINARY_KEYS, (0, None), (1, b""), (2, b""), (3, b"\x00"), (4, b"\x00\x00")),
        rows(BINARY_KEYS, (5, b"\x00"), (6, b"\x00\x00\x00")),
    ]
    found = run_windows(tmp_path / "binary", {"keys": "k"}, binary)
    assert ports_of(found) == {
        0: "error", 1: "unique", 2: "duplicate", 3: "unique", 4: "unique",
        5: "duplicate", 6: "unique",
    }  # fmt: skip


def test_keys_differing_only_in_unicode_normalisation_are_different_keys(tmp_path: Path) -> None:
    """Keys are compared byte for byte: NFC and NFD spellings of one text are two keys."""
    assert NFC != NFD and unicodedata.normalize("NFC", NFD) == NFC
    windows = [
        rows(STRING_KEYS, (0, NFC), (1, NFD), (2, "A"), (3, "a")),
        rows(STRING_KEYS, (4, NFD), (5, NFC), (6, "\uff21BC"), (7, "ABC")),
    ]
    assert ports_of(run_windows(tmp_path, {"keys": "k"}, windows)) == {
        0: "unique", 1: "unique", 2: "unique", 3: "unique",
        4: "duplicate", 5: "duplicate", 6: "unique", 7: "unique",
    }  # fmt: skip


@pytest.mark.slow  # 16 s of hashing and comparing megabyte keys
def test_one_megabyte_keys_are_compared_in_full(tmp_path: Path) -> None:
    last_byte_differs = MEGABYTE_KEY[:-1] + "j"
    one_byte_longer = MEGABYTE_KEY + "k"
    windows = [
        rows(STRING_KEYS, (0, MEGABYTE_KEY), (1, last_byte_differs), (2, MEGABYTE_KEY)),
        rows(STRING_KEYS, (3, one_byte_longer), (4, last_byte_differs), (5, MEGABYTE_KEY[:-1])),
    ]
    assert ports_of(run_windows(tmp_path, {"keys": "k"}, windows, partitions=2)) == {
        0: "unique", 1: "unique", 2: "duplicate", 3: "unique", 4: "duplicate", 5: "unique",
    }  # fmt: skip


def test_decimal_keys_compare_by_value(tmp_path: Path) -> None:
    schema = pa.schema([("rid", pa.int64()), ("d", pa.decimal128(38, 10))])
    big = Decimal("1234567890123456789012345678.0000000001")
    windows = [
        rows(schema, (0, Decimal("1.5")), (1, Decimal("1.50")), (2, big), (3, None)),
        rows(schema, (4, Decimal("-0")), (5, Decimal("0")), (6, -big), (7, big)),
    ]
    assert ports_of(run_windows(tmp_path, {"keys": "d"}, windows)) == {
        0: "unique", 1: "duplicate", 2: "unique", 3: "error",
        4: "unique", 5: "duplicate", 6: "unique", 7: "duplicate",
    }  # fmt: skip


STRUCT = pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.struct([("d", pa.binary())]))])
STRUCT_KEYS = pa.schema([("rid", pa.int64()), ("s", STRUCT)])


def test_nested_struct_keys_compare_every_leaf_and_null_leaves_are_errors(tmp_path: Path) -> None:
    one = {"a": 1, "b": "x", "c": {"d": b"\x01"}}
    other_leaf = {"a": 1, "b": "x", "c": {"d": b"\x02"}}
    null_leaf = {"a": 1, "b": None, "c": {"d": b"\x01"}}
    windows = [
        rows(STRUCT_KEYS, (0, one), (1, other_leaf), (2, one), (3, None), (4, null_leaf)),
        rows(STRUCT_KEYS, (5, other_leaf), (6, {"a": 1, "b": "x", "c": None})),
    ]
    found = run_windows(tmp_path / "whole", {"keys": "s"}, windows)
    assert ports_of(found) == {
        0: "unique", 1: "unique", 2: "duplicate", 3: "error", 4: "error",
        5: "duplicate", 6: "error",
    }  # fmt: skip
    assert found[4][1] == "null key column 's.b'"
    assert found[6][1] == "null key column 's.c.d'"
    found = run_windows(tmp_path / "leaf", {"keys": "s.c.d"}, windows)
    assert ports_of(found) == {
        0: "unique", 1: "unique", 2: "duplicate", 3: "error", 4: "duplicate",
        5: "duplicate", 6: "error",
    }  # fmt: skip


def test_nan_and_signed_zeros_as_key_values_are_one_key_each(tmp_path: Path) -> None:
    """Like Spark's grouping, every NaN is one key and -0.0 equals 0.0."""
    schema = pa.schema([("rid", pa.int64()), ("x", pa.float64())])
    nan = float("nan")
    windows = [rows(schema, (0, nan), (1, 0.0), (2, -0.0)), rows(schema, (3, nan), (4, 1e308))]
    assert ports_of(run_windows(tmp_path, {"keys": "x"}, windows)) == {
        0: "unique", 1: "unique", 2: "duplicate", 3: "duplicate", 4: "unique",
    }  # fmt: skip


# -- expiry values ------------------------------------------------------------------------------

ORDERED_FLOAT = pa.schema([("rid", pa.int64()), ("id", pa.int64()), ("x", pa.float64())])


def test_nan_and_infinities_in_an_ordered_expiry_key_are_errors_that_move_nothing(
    tmp_path: Path,
) -> None:
    options = {"keys": "id", "expiryKey": "x", "expiryPeriod": "10"}
    inf = float("inf")
    windows = [
        rows(ORDERED_FLOAT, (0, 1, 100.0), (1, 2, float("nan")), (2, 3, inf), (3, 4, -inf)),
        rows(ORDERED_FLOAT, (4, 5, None), (5, 6, 95.0), (6, 1, 100.0)),
    ]
    found = run_windows(tmp_path, options, windows)
    assert ports_of(found) == {
        0: "unique", 1: "error", 2: "error", 3: "error", 4: "error", 5: "unique", 6: "duplicate",
    }  # fmt: skip
    assert found[1][1] == found[2][1] == "expiry value in 'x' is not a valid ordered value"
    assert found[4][1] == "null expiry value in 'x'"
    manifest = BucketStore(str(tmp_path / "out" / "_store")).read()
    assert manifest is not None and manifest.latest == 100.0  # not +inf: nothing expired


def test_unsigned_ordered_values_beyond_int64_are_errors_not_a_crash(tmp_path: Path) -> None:
    """Spark has no unsigned types (its Arrow conversion refuses uint64), so this runs the
    tasks and commit on a plan built directly: a value beyond int64 is an error row."""
    from dedupsink.sink.local import LocalSink

    schema = pa.schema([("rid", pa.int64()), ("id", pa.int64()), ("n", pa.uint64())])
    options = {"path": str(tmp_path / "out"), "keys": "id", "expiryKey": "n", "expiryPeriod": "10"}
    sink = LocalSink(options, schema)
    windows = [rows(schema, (0, 1, 5), (1, 2, 2**64 - 1), (2, 3, 2**63)), rows(schema, (3, 1, 5))]
    for batch, table in enumerate(windows):
        sink.window(batch, table)
    found = outcome(tmp_path / "out")
    assert ports_of(found) == {0: "unique", 1: "error", 2: "error", 3: "duplicate"}
    assert found[1][1] == "expiry value in 'n' is not a valid ordered value"


TIMES = pa.schema([("rid", pa.int64()), ("k", pa.string()), ("t", pa.timestamp("us", "UTC"))])


def at(*parts: int) -> int:
    return micros(datetime(*parts, tzinfo=UTC))  # type: ignore[misc]


def test_times_before_1970_and_after_9999_are_ordinary_times(tmp_path: Path) -> None:
    """Without maxExpiryJump, one far-future row moves the latest point and expires the rest:
    that is the hazard maxExpiryJump guards against (next test)."""
    options = {"keys": "k", "expiryKey": "t", "expiryPeriod": "1 day"}
    windows = [
        rows(TIMES, (0, "a", at(1969, 12, 31, 23, 59, 59)), (1, "b", at(1900, 1, 1))),
        # Re-sent copies carry their original time (docs/SEMANTICS.md, rule 5).
        rows(TIMES, (2, "a", at(1969, 12, 31, 23, 59, 59)), (3, "b", at(1900, 1, 1))),
        rows(TIMES, (4, "c", year_12000())),
        rows(TIMES, (5, "d", at(2020, 1, 1)), (6, "c", year_12000())),
    ]
    assert ports_of(run_windows(tmp_path, options, windows)) == {
        0: "unique", 1: "unique", 2: "duplicate", 3: "expired", 4: "unique",
        5: "expired", 6: "duplicate",
    }  # fmt: skip


def test_a_far_future_time_beyond_max_expiry_jump_is_an_error_and_moves_nothing(
    tmp_path: Path,
) -> None:
    options = {"keys": "k", "expiryKey": "t", "expiryPeriod": "1 day", "maxExpiryJump": "30 days"}
    windows = [
        rows(TIMES, (0, "a", at(2020, 1, 1))),
        rows(TIMES, (1, "c", year_12000()), (2, "d", at(9999, 12, 31)), (3, "e", at(2020, 1, 20))),
        rows(TIMES, (4, "f", at(2020, 1, 20, 12)), (5, "a", at(2020, 1, 1))),
    ]
    found = run_windows(tmp_path, options, windows)
    assert ports_of(found) == {
        0: "unique", 1: "error", 2: "error", 3: "unique", 4: "unique", 5: "expired",
    }  # fmt: skip
    assert found[1][1] == "expiry value in 't' is more than maxExpiryJump ahead of the latest point"
    manifest = BucketStore(str(tmp_path / "out" / "_store")).read()
    assert manifest is not None and manifest.latest == at(2020, 1, 20, 12)


def test_times_beyond_the_microsecond_range_are_errors_not_wrapped_around(tmp_path: Path) -> None:
    """pyarrow holds seconds (and dates) far beyond what microseconds since 1970 can: such a
    value must be an error, not wrap around into some other time (Spark cannot make them)."""
    year_500000 = 500_000 * 365 * 86_400
    schema = pa.schema([("rid", pa.int64()), ("k", pa.string()), ("t", pa.timestamp("s"))])
    options = {"keys": "k", "expiryKey": "t", "expiryPeriod": "1 day"}
    windows = [
        rows(schema, (0, "a", 1_600_000_000), (1, "b", year_500000), (2, "c", -year_500000)),
        rows(schema, (3, "d", 1_600_000_100), (4, "a", 1_600_000_000)),
    ]
    found = run_windows(tmp_path / "seconds", options, windows)
    assert ports_of(found) == {0: "unique", 1: "error", 2: "error", 3: "unique", 4: "duplicate"}
    assert found[1][1] == "expiry value in 't' is not a valid tupleTime value"
    dates = pa.schema([("rid", pa.int64()), ("k", pa.string()), ("t", pa.date32())])
    windows = [rows(dates, (0, "a", 18000), (1, "b", 2**31 - 1), (2, "c", -(2**31)))]
    assert ports_of(run_windows(tmp_path / "dates", options, windows)) == {
        0: "unique", 1: "error", 2: "error",
    }  # fmt: skip


# -- batches ---------------------------------------------------------------------------------------

ORDERED = pa.schema([("rid", pa.int64()), ("id", pa.int64()), ("n", pa.int64())])
ORDERED_OPTIONS = {"keys": "id", "expiryKey": "n", "expiryPeriod": "10"}


def test_an_empty_window_and_a_window_of_only_errors_change_no_state(tmp_path: Path) -> None:
    windows = [
        rows(ORDERED, (0, 1, 50), (1, 2, 51)),
        rows(ORDERED),
        rows(ORDERED, (2, None, 500), (3, 9, None), (4, None, None)),
        rows(ORDERED, (5, 1, 50), (6, 3, 45)),
    ]
    sink = InProcessSink(str(tmp_path / "out"), ORDERED_OPTIONS, ORDERED)
    store = BucketStore(str(tmp_path / "out" / "_store"))
    states = []
    for batch, table in enumerate(windows):
        sink.window(batch, table, partitions=2)
        manifest = store.read()
        assert manifest is not None
        states.append((manifest.latest, manifest.remembered_keys, sorted(manifest.files)))
    assert states[1] == states[0]  # the empty window
    assert states[2] == states[0]  # only errors: a latest point of 500 would expire everything
    assert ports_of(outcome(tmp_path / "out")) == {
        0: "unique", 1: "unique", 2: "error", 3: "error", 4: "error", 5: "duplicate", 6: "unique",
    }  # fmt: skip
    for port in PORTS:  # one sink log entry per window, in every port
        entries = sorted(p.name for p in (tmp_path / "out" / port / "_spark_metadata").iterdir())
        assert entries == ["0", "1", "2", "3"], port


@pytest.mark.parametrize(
    ("column", "new_type", "option", "change"),
    [
        ("id", pa.string(), "keys", "id: int64 -> string"),
        ("n", pa.float64(), "expiryKey", "n: int64 -> double"),
    ],
)
def test_a_column_type_change_between_restarts_is_refused_naming_the_column(
    tmp_path: Path, column: str, new_type: pa.DataType, option: str, change: str
) -> None:
    sink = InProcessSink(str(tmp_path / "out"), ORDERED_OPTIONS, ORDERED)
    sink.window(0, rows(ORDERED, (0, 1, 5)))
    before = {p: p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file()}
    changed = ORDERED.set(ORDERED.get_field_index(column), pa.field(column, new_type))
    with pytest.raises(StoreSettingsError) as caught:
        InProcessSink(str(tmp_path / "out"), ORDERED_OPTIONS, changed).start()
    assert caught.value.option == option
    assert change in str(caught.value)
    assert {p: p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file()} == before


# -- through Spark ---------------------------------------------------------------------------------


def spark_counts_match(spark: Any, output: Path) -> None:
    for port in PORTS:
        expected = pq.ParquetDataset(str(output / port)).read(columns=["rid"]).num_rows
        assert spark.read.parquet(str(output / port)).count() == expected, port


def run_spark_stream(
    spark: Any, root: Path, windows: Sequence[pa.Table], options: Mapping[str, str]
) -> dict[int, tuple[str, str | None]]:
    write_inputs(root / "in", windows)
    schema = spark.read.parquet(str(root / "in")).schema
    frame = (
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(root / "in"))
    )
    writer = frame.writeStream.format("dedup").option("path", str(root / "out"))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(root / "chk")).trigger(availableNow=True)
    query.start().awaitTermination()
    spark_counts_match(spark, root / "out")
    return outcome(root / "out")


@pytest.mark.spark
@pytest.mark.slow  # four windows with megabyte keys through Spark: 34 to 44 s
def test_spark_stream_of_awkward_keys_and_times_sends_each_row_to_its_port(
    spark: Any, tmp_path: Path
) -> None:
    """Through Spark: null, empty, 1 MB and NFC/NFD keys; times in 1900 and after 9999 (Spark
    carries year 12000 as microseconds, it only cannot print it); an empty batch; a batch of
    only errors; a far-future time beyond maxExpiryJump."""
    options = {
        "keys": "k",
        "expiryKey": "t",
        "expiryPeriod": "1 day",
        "maxExpiryJump": "3650 days",
    }
    windows = [
        rows(
            TIMES,
            (0, "", at(2020, 1, 1)), (1, None, at(2020, 1, 1)), (2, MEGABYTE_KEY, at(2020, 1, 1)),
            (3, NFC, at(2020, 1, 1)), (4, NFD, at(2020, 1, 1)), (5, "old", at(1900, 1, 1)),
        ),
        rows(TIMES),
        rows(TIMES, (6, None, at(2020, 1, 1)), (7, "x", None)),
        rows(
            TIMES,
            (8, "", at(2020, 1, 1, 1)), (9, MEGABYTE_KEY, at(2020, 1, 1)),
            (10, "far", at(9999, 12, 31)), (11, "farther", year_12000()),
            (12, "old2", at(1900, 1, 2)), (13, NFD, at(2020, 1, 1)), (14, "new", at(2020, 1, 2)),
        ),
    ]  # fmt: skip
    found = run_spark_stream(spark, tmp_path, windows, options)
    assert ports_of(found) == {
        0: "unique", 1: "error", 2: "unique", 3: "unique", 4: "unique", 5: "unique",
        6: "error", 7: "error",
        8: "duplicate", 9: "duplicate", 10: "error", 11: "error", 12: "expired",
        13: "duplicate", 14: "unique",
    }  # fmt: skip
    assert (
        found[11][1] == "expiry value in 't' is more than maxExpiryJump ahead of the latest point"
    )
    assert found[7][1] == "null expiry value in 't'"
    for port in PORTS:  # the empty batch was a window too: one log entry per window
        entries = sorted(p.name for p in (tmp_path / "out" / port / "_spark_metadata").iterdir())
        assert entries == ["0", "1", "2", "3"], port


@pytest.mark.spark
def test_spark_stream_with_struct_binary_decimal_keys_and_nan_expiry_values(
    spark: Any, tmp_path: Path
) -> None:
    key = pa.struct([("b", pa.binary()), ("d", pa.decimal128(38, 10)), ("a", pa.int32())])
    schema = pa.schema([("rid", pa.int64()), ("s", key), ("x", pa.float64())])
    one = {"b": b"\x00\xff", "d": Decimal("1.5"), "a": 1}
    same = {"b": b"\x00\xff", "d": Decimal("1.50"), "a": 1}
    other = {"b": b"\x00\xfe", "d": Decimal("1.5"), "a": 1}
    windows = [
        rows(
            schema,
            (0, one, 10.0), (1, other, 10.0), (2, None, 10.0),
            (3, {"b": None, "d": Decimal(1), "a": 1}, 10.0), (4, same, 11.0),
        ),
        rows(
            schema,
            (5, same, float("nan")), (6, other, float("inf")), (7, one, float("-inf")),
            (8, one, 12.0), (9, {"b": b"", "d": Decimal("-0"), "a": 0}, 12.0),
        ),
    ]  # fmt: skip
    found = run_spark_stream(
        spark, tmp_path, windows, {"keys": "s", "expiryKey": "x", "expiryPeriod": "100"}
    )
    assert ports_of(found) == {
        0: "unique", 1: "unique", 2: "error", 3: "error", 4: "duplicate",
        5: "error", 6: "error", 7: "error", 8: "duplicate", 9: "unique",
    }  # fmt: skip
    assert found[3][1] == "null key column 's.b'"
    assert found[6][1] == "expiry value in 'x' is not a valid ordered value"
