"""``mergeSchema=true``: port tables that take an input with new, missing or widened columns.

Without Spark (``LocalSink``), for Delta and Iceberg ports:

* without the option, a changed schema is refused at start, before any output, naming the
  column and ``mergeSchema=true`` (Parquet ports too, against the schema the store recorded);
* with it, a new column joins every port table in the commit of the window that first carries
  it (Delta: a ``metaData`` action in that log entry; Iceberg: the snapshot's own schema), old
  rows read it as null through delta-rs, pyiceberg and DuckDB, and a column a later input lacks
  is null in its rows;
* Iceberg widens int to long; Delta widens nothing; a string becoming a number is refused;
* the store records each window's schema and a schema version (history, inspect);
* a crash before, between and after the table commits of the schema-changing window, then a
  restart, leaves each table with the column once and every row once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from lakehouse import DuckDB, PortTables
from streams import output_listing

from dedupsink.errors import DedupOptionError
from dedupsink.ports.delta import DeltaPorts
from dedupsink.ports.iceberg import IcebergPorts
from dedupsink.runtime import RUNTIME
from dedupsink.sink.local import LocalSink
from dedupsink.store.history import read_history
from dedupsink.store.records import Publication

TABLES = ("delta", "iceberg")
PORTS = ("unique", "duplicate", "expired", "error")
OLD = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("body", pa.string())])
NEW = OLD.append(pa.field("region", pa.string()))
# A later producer that no longer sends body.
LATER = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("region", pa.string())])


def old_rows(*ids: int | None) -> pa.Table:
    return pa.table({"id": list(ids), "n": [1] * len(ids), "body": ["b"] * len(ids)}, OLD)


def new_rows(*ids: int | None) -> pa.Table:
    count = len(ids)
    return pa.table(
        {"id": list(ids), "n": [2] * count, "body": ["b"] * count, "region": ["eu"] * count}, NEW
    )


def later_rows(*ids: int | None) -> pa.Table:
    return pa.table({"id": list(ids), "n": [3] * len(ids), "region": ["us"] * len(ids)}, LATER)


def options_for(tables: PortTables, **more: str) -> dict[str, str]:
    return {**tables.sink_options(), "keys": "id", **more}


def refusal(options: dict[str, str], schema: pa.Schema) -> str:
    with pytest.raises(DedupOptionError) as caught:
        LocalSink(options, schema).start()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("fmt", [*TABLES, "parquet"])
def test_without_the_option_a_new_column_is_refused_before_any_output(
    workdir: Path, fmt: str
) -> None:
    out = workdir / "out"
    tables = PortTables(fmt, out)
    LocalSink(options_for(tables), OLD).window(0, old_rows(1, 2))
    before = output_listing(out)
    message = refusal(options_for(tables), NEW)
    assert "region is new" in message and "mergeSchema" in message and "true" in message
    message = refusal(options_for(tables, mergeSchema="false"), OLD.remove(2))
    assert "body is missing" in message and "mergeSchema='false'" in message
    assert output_listing(out) == before


@pytest.mark.parametrize("fmt", TABLES)
def test_a_string_becoming_a_number_is_refused_even_with_the_option(
    workdir: Path, fmt: str
) -> None:
    tables = PortTables(fmt, workdir / "out")
    LocalSink(options_for(tables), OLD).window(0, old_rows(1))
    changed = pa.schema([("id", pa.int64()), ("n", pa.int32()), ("body", pa.int64())])
    message = refusal(options_for(tables, mergeSchema="true"), changed)
    assert "body: string -> long" in message and "outputFormat" in message, message


def test_iceberg_widens_int_to_long_and_delta_refuses_it(workdir: Path) -> None:
    wide = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("body", pa.string())])
    delta = PortTables("delta", workdir / "d")
    LocalSink(options_for(delta), OLD).window(0, old_rows(1))
    message = refusal(options_for(delta, mergeSchema="true"), wide)
    assert "n: integer -> long" in message and "typeWidening" in message, message

    iceberg = PortTables("iceberg", workdir / "i")
    LocalSink(options_for(iceberg), OLD).window(0, old_rows(1))
    sink = LocalSink(options_for(iceberg, mergeSchema="true"), wide)
    sink.window(1, pa.table({"id": [2], "n": [2**40], "body": ["w"]}, wide))
    table = iceberg.iceberg("unique")
    assert str(table.schema().find_field("n").field_type) == "long"
    assert sorted(table.scan().to_arrow().column("n").to_pylist()) == [1, 2**40]


def test_a_key_column_never_changes_type(workdir: Path) -> None:
    tables = PortTables("iceberg", workdir / "out")
    LocalSink(options_for(tables), OLD).window(0, old_rows(1))
    wide_key = pa.schema([("id", pa.string()), ("n", pa.int32()), ("body", pa.string())])
    message = refusal(options_for(tables, mergeSchema="true"), wide_key)
    assert "id: int64 -> string" in message, message


def read_all(tables: PortTables, port: str) -> list[dict[str, Any]]:
    return sorted(tables.read(port).to_pylist(), key=lambda row: (row["id"] is None, row["id"]))


@pytest.mark.parametrize("fmt", TABLES)
def test_a_new_column_joins_every_port_table_with_the_window_that_carries_it(
    workdir: Path, fmt: str
) -> None:
    tables = PortTables(fmt, workdir / "out")
    LocalSink(options_for(tables), OLD).window(0, old_rows(1, 2, None))
    merging = LocalSink(options_for(tables, mergeSchema="true"), NEW)
    merging.window(1, new_rows(3, 1))  # unique and duplicate rows; none expired, none error
    later = LocalSink(options_for(tables, mergeSchema="true"), LATER)
    later.window(2, later_rows(4, 3, None))
    for port in PORTS:
        assert tables.read(port).schema.names[-1] == "region" or port == "error", port
    unique = read_all(tables, "unique")
    assert [(r["id"], r["body"], r["region"]) for r in unique] == [
        (1, "b", None),
        (2, "b", None),
        (3, "b", "eu"),
        (4, None, "us"),
    ]
    duplicate = read_all(tables, "duplicate")
    assert [(r["id"], r["body"], r["region"]) for r in duplicate] == [
        (1, "b", "eu"),
        (3, None, "us"),
    ]
    error = sorted(tables.read("error").to_pylist(), key=lambda row: row["n"])
    assert [(r["n"], r["body"], r["region"]) for r in error] == [(1, "b", None), (3, None, "us")]
    assert tables.read("error").schema.names == ["id", "n", "body", "_dedup_error", "region"]
    duckdb = DuckDB()
    for port in PORTS:
        seen = duckdb.read(tables, port).to_pylist()
        own = tables.read(port).to_pylist()
        key = lambda row: json.dumps(row, sort_keys=True, default=str)  # noqa: E731
        assert sorted(seen, key=key) == sorted(own, key=key), port
    check_schema_came_with_its_rows(tables)
    history = read_history(merging.plan.store)
    assert history.column("schema_version").to_pylist() == [0, 1, 2]


def check_schema_came_with_its_rows(tables: PortTables) -> None:
    """The first table version declaring region is the one that added window 2's rows (Delta:
    one log entry; Iceberg: the snapshot's schema)."""
    if tables.fmt == "delta":
        table = tables.delta("unique")
        log = Path(str(table.table_uri).removeprefix("file://")) / "_delta_log"
        entries = [
            [json.loads(line) for line in path.read_text().splitlines()]
            for path in sorted(log.glob("*.json"))
        ]
        with_region = [
            i
            for i, actions in enumerate(entries)
            if any("metaData" in a and "region" in a["metaData"]["schemaString"] for a in actions)
        ]
        assert len(with_region) == 1, with_region
        actions = entries[with_region[0]]
        assert any("add" in a for a in actions) and any("txn" in a for a in actions)
        # the expired table, which got no rows, took the column in an entry of its own
        expired = tables.delta("expired").schema().to_arrow()
        assert "region" in [f.name for f in expired]
    else:
        table = tables.iceberg("unique")
        by_version = {int(s.summary["dedupsink.version"]): s for s in table.snapshots()}
        schemas = table.schemas()
        first = schemas[by_version[1].schema_id]
        second = schemas[by_version[2].schema_id]
        assert "region" not in [f.name for f in first.fields]
        assert "region" in [f.name for f in second.fields]


def test_parquet_ports_take_new_columns_with_the_option(workdir: Path) -> None:
    out = workdir / "out"
    LocalSink({"path": str(out), "keys": "id"}, OLD).window(0, old_rows(1, 2))
    sink = LocalSink({"path": str(out), "keys": "id", "mergeSchema": "true"}, NEW)
    sink.window(1, new_rows(3))
    files = ds.dataset(str(out / "unique"), format="parquet")
    schemas = [fragment.physical_schema for fragment in files.get_fragments()]
    assert {tuple(s.names) for s in schemas} == {tuple(OLD.names), tuple(NEW.names)}
    read = ds.dataset(str(out / "unique"), schema=NEW, format="parquet").to_table()
    assert sorted(read.column("region").to_pylist(), key=str) == [None, None, "eu"]


def test_a_publication_without_a_schema_encodes_as_before() -> None:
    wire = {"window": 3, "folder": "_staging/w3", "modified_ms": 5, "moves": [], "logs": {}}
    publication = Publication.from_wire(wire)
    assert publication is not None and publication.schema is None
    assert publication.to_wire() == wire
    recorded = Publication(3, "f", 5, (), (), b"schema", 2).to_wire()
    assert recorded["schema"] == b"schema" and recorded["schema_version"] == 2


# -- a crash in the publication of the schema-changing window --------------------------------


class Crash(Exception):
    """The driver dying at a point of the publication."""


# (port, before its table commit or after it)
CRASH_POINTS = {
    "before-unique": ("unique", False),
    "between-unique-and-duplicate": ("unique", True),
    "after-error": ("error", True),
}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
@pytest.mark.parametrize("fmt", TABLES)
def test_a_crash_in_the_schema_changing_commit_leaves_the_column_once_and_every_row_once(
    workdir: Path, fmt: str, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = PortTables(fmt, workdir / "out")
    LocalSink(options_for(tables), OLD).window(0, old_rows(1, 2, None))
    crash_port, after = CRASH_POINTS[point]
    cls: Any = DeltaPorts if fmt == "delta" else IcebergPorts
    original = cls._commit

    def crashing(self: Any, *args: Any) -> None:
        port = args[1] if fmt == "delta" else args[0]
        if port == crash_port and not after:
            raise Crash(point)
        original(self, *args)
        if port == crash_port and after:
            raise Crash(point)

    monkeypatch.setattr(cls, "_commit", crashing)
    sink = LocalSink(options_for(tables, mergeSchema="true"), NEW)
    with pytest.raises(Crash):
        sink.window(1, new_rows(3, 1, None))
    monkeypatch.setattr(cls, "_commit", original)
    RUNTIME.reset()  # a new driver process
    restarted = LocalSink(options_for(tables, mergeSchema="true"), NEW)
    restarted.start()  # the next start finishes the interrupted publication
    report = restarted.window(1, new_rows(3, 1, None))  # Spark re-runs the batch
    assert report is not None and report.already_committed
    restarted.window(2, new_rows(4))
    for port in PORTS:
        names = tables.read(port).schema.names
        assert names.count("region") == 1, (port, names)
    ids = {port: sorted(tables.read(port).column("id").to_pylist(), key=str) for port in PORTS}
    assert ids == {
        "unique": [1, 2, 3, 4],
        "duplicate": [1],
        "expired": [],
        "error": [None, None],
    }
    assert [r["region"] for r in read_all(tables, "unique")] == [None, None, "eu", "eu"]
