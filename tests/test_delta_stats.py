"""Delta ports' add-action statistics and commitInfo, compared with delta-rs's own writer.

A port file's statistics are worked out from its Parquet footer by the task that writes it
(``dedupsink/ports/stats.py``); delta-rs's ``write_deltalake`` of the same rows must give the
same ``stats`` JSON, for every column type the ports carry.
"""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dedupsink.ports.output import Output, PortWriters
from dedupsink.ports.stats import StatsColumns
from dedupsink.runtime import RUNTIME
from dedupsink.sink.local import LocalSink
from dedupsink.store.records import Move

UTC = datetime.UTC
LONG = "a" * 40 + "é" * 30  # 100 bytes: cut to a 64-byte prefix
TOP = "zz" + "€" * 70  # the maximum's prefix ends in an incremented character
POINT = pa.struct([("x", pa.int32()), ("name", pa.string())])


def every_type() -> pa.Table:
    """Three rows of every column type a port carries, nulls, extremes and long strings."""
    return pa.table(
        {
            "i8": pa.array([1, -128, None], pa.int8()),
            "i16": pa.array([1, 2, -32768], pa.int16()),
            "i32": pa.array([7, None, -(2**31)], pa.int32()),
            "i64": pa.array([1, 2**62, None], pa.int64()),
            "f32": pa.array([1.1, None, -2.5], pa.float32()),
            "f64": pa.array([1.1, float("nan"), -3.25], pa.float64()),
            "d10": pa.array([Decimal("99999999.99"), Decimal("-1.50"), None], pa.decimal128(10, 2)),
            "d38": pa.array(
                [Decimal("9" * 32 + "." + "9" * 6), Decimal("-0.000001"), None],
                pa.decimal128(38, 6),
            ),
            "s": pa.array([LONG, TOP, None], pa.string()),
            "b": pa.array([b"\x00\x01", b"abc", None], pa.binary()),
            "flag": pa.array([True, None, False]),
            "day": pa.array(
                [datetime.date(2026, 1, 1), datetime.date(1969, 12, 31), None], pa.date32()
            ),
            "ts": pa.array(
                [
                    datetime.datetime(2026, 1, 1),
                    datetime.datetime(2026, 1, 1, 0, 0, 0, 123456),
                    datetime.datetime(1960, 1, 1, 0, 0, 0, 500),
                ],
                pa.timestamp("us"),
            ),
            "tsz": pa.array(
                [
                    datetime.datetime(2026, 1, 1, tzinfo=UTC),
                    None,
                    datetime.datetime(2026, 1, 2, 0, 0, 0, 120000, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "point": pa.array([{"x": 1, "name": "q"}, None, {"x": None, "name": "r"}], POINT),
            "tags": pa.array([[1, 2], None, []], pa.list_(pa.int64())),
            "attrs": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        }
    )


def port_writer_stats(tmp_path: Path, table: pa.Table, columns: StatsColumns) -> dict[str, Any]:
    """The stats of ``table`` written as a task writes a port file: two batches, two row
    groups, merged."""
    output = Output(str(tmp_path / "ports"), file_stats=(("unique", columns),))
    writers = PortWriters(output, "_staging/w0000000001-q-0-run", 0, 0)
    writers.write("unique", table.slice(0, 2))
    writers.write("unique", table.slice(2))
    (written,) = writers.close()
    assert written.rows == table.num_rows and written.stats is not None
    stats: dict[str, Any] = json.loads(written.stats)
    return stats


def delta_rs_stats(folder: Path, table: pa.Table, configuration: dict[str, str]) -> dict[str, Any]:
    """The stats delta-rs's writer puts in the add action of ``table``'s file."""
    from deltalake import DeltaTable, write_deltalake

    DeltaTable.create(str(folder), table.schema, configuration=configuration)
    write_deltalake(str(folder), table, mode="append")
    (stats,) = add_stats(folder)
    return stats


def add_stats(table: Path) -> list[dict[str, Any]]:
    """The parsed ``stats`` of every add action in the table's log, in log order."""
    found = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                found.append(json.loads(action["add"]["stats"]))
    return found


@pytest.mark.parametrize(
    "configuration",
    [
        {},
        {"delta.dataSkippingNumIndexedCols": "5"},
        {"delta.dataSkippingNumIndexedCols": "-1"},
        {"delta.dataSkippingNumIndexedCols": "0"},
        {"delta.dataSkippingStatsColumns": "s,i64,tsz"},
    ],
    ids=["default", "five", "all", "none", "named"],
)
def test_port_file_stats_equal_delta_rs_for_every_column_type(
    tmp_path: Path, configuration: dict[str, str]
) -> None:
    table = every_type()
    columns = StatsColumns.of_configuration(configuration)
    ours = port_writer_stats(tmp_path, table, columns)
    theirs = delta_rs_stats(tmp_path / "delta-rs", table, configuration)
    assert ours == theirs


def test_the_rules_the_equality_rests_on(tmp_path: Path) -> None:
    """What delta-rs's stats hold for the tricky columns, spelled out."""
    stats = port_writer_stats(tmp_path, every_type(), StatsColumns())
    low, high, nulls = stats["minValues"], stats["maxValues"], stats["nullCount"]
    assert low["s"] == "a" * 40 + "é" * 12  # a 64-byte prefix at a character boundary
    assert high["s"] == "zz" + "€" * 19 + "₭"  # cut, then its last character incremented
    assert high["d38"] == pytest.approx(1e32) and high["d38"] < 1e32  # stepped into precision
    assert (low["ts"], high["ts"]) == ("1960-01-01 00:00:00.000", "2026-01-01 00:00:00.123")
    assert (low["tsz"], high["tsz"]) == ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00.120Z")
    assert (low["day"], high["day"]) == ("1969-12-31", "2026-01-01")
    assert (low["f64"], high["f64"]) == (-3.25, 1.1)  # NaN left out
    assert low["point"] == {"x": 1, "name": "q"} and nulls["point"] == {"x": 2, "name": 1}
    for absent in ("b", "tags", "attrs"):  # binary, list, map: no statistics at all
        assert absent not in low and absent not in nulls


def test_stats_columns_follow_the_table_properties() -> None:
    leaves = [("a",), ("st", "x"), ("st", "y"), ("l", ""), ("b",)]
    assert StatsColumns().chosen(leaves) == [0, 1, 2, 3, 4]
    assert StatsColumns.of_configuration({"delta.dataSkippingNumIndexedCols": "2"}).chosen(
        leaves
    ) == [0, 1, 2]  # a struct takes one slot
    named = StatsColumns.of_configuration({"delta.dataSkippingStatsColumns": "b, `st`.y"})
    assert named.chosen(leaves) == [2, 4]


def test_a_move_recorded_without_stats_still_decodes_and_keeps_its_bytes() -> None:
    old = ["unique/part-1.parquet", "unique/part-1.parquet", 10, 3]
    move = Move.from_wire(old)
    assert move.stats is None and move.to_wire() == old
    with_stats = Move("a", "a", 1, 1, '{"numRecords":1}')
    assert Move.from_wire(with_stats.to_wire()) == with_stats


SCHEMA = pa.schema(
    [("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("note", pa.string())]
)


def window(ids: list[int | None], second: int) -> pa.Table:
    stamps = pa.array([second * 1_000_000] * len(ids), pa.timestamp("us", tz="UTC"))
    notes = [None if i is None else f"note {i}" for i in ids]
    return pa.table({"id": ids, "ts": stamps, "note": notes}, schema=SCHEMA)


def test_every_commit_of_the_sink_carries_an_appends_commit_info_and_file_stats(
    tmp_path: Path,
) -> None:
    """Commits written after this process's own (one request) and after reading the table
    (a new process: ``RUNTIME.reset``) carry the same commitInfo, and every add its stats."""
    from deltalake import DeltaTable

    url = str(tmp_path / "out")
    sink = LocalSink(
        {
            "path": url,
            "keys": "id",
            "expiryKey": "ts",
            "expiryPeriod": "1 hour",
            "outputFormat": "delta",
        },
        SCHEMA,
    )
    sink.window(0, window([1, 2, 2, None], 1000), partitions=2)
    sink.window(1, window([3, 2], 1001), partitions=2)
    RUNTIME.reset()  # a new driver process: the next commit reads the table first
    sink.start()
    sink.window(2, window([4, 5, 4], 1002), partitions=2)
    store = sink.plan.store.read()
    assert store is not None
    for port in ("unique", "duplicate", "error"):
        table = DeltaTable(f"{url}/{port}")
        history = sorted(table.history(), key=lambda entry: entry["version"])
        assert history[0]["operation"] == "CREATE TABLE"
        writes = history[1:]
        assert writes, port
        for entry in writes:
            version = entry["version"]
            files = [a for a in add_entries(Path(url) / port) if a[0] == version]
            assert entry["operation"] == "WRITE", entry
            assert entry["operationParameters"]["mode"] == "Append"
            assert entry["engineInfo"] == entry["clientVersion"] == "dedupsink/0.1.0"
            metrics = entry["operationMetrics"]
            assert metrics["numFiles"] == str(len(files)), (port, version)
            assert metrics["numOutputRows"] == str(sum(s["numRecords"] for _, s, _ in files))
            assert metrics["numOutputBytes"] == str(sum(size for _, _, size in files))
            assert entry["dedupsink.store"] == store.store_id
            assert entry["dedupsink.query"] == "local-query"
            assert int(entry["dedupsink.batch"]) == int(entry["dedupsink.version"]) - 1
        for _, stats, _ in add_entries(Path(url) / port):
            assert set(stats) == {"numRecords", "minValues", "maxValues", "nullCount"}
            assert set(stats["nullCount"]) == set(SCHEMA.names) | (
                {"_dedup_error"} if port == "error" else set()
            )


def add_entries(table: Path) -> list[tuple[int, dict[str, Any], int]]:
    """(log version, parsed stats, size) of every add action in the table's log."""
    found = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                found.append((int(entry.stem), json.loads(add["stats"]), int(add["size"])))
    return found
