"""The operator's questions asked of ``dedupsink.inspection`` directly, on a copy of the demo's
store (two runs of ``conf/system-logs.conf``): typed answers, no command line, no text."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from operator_outputs import copy_store

from dedupsink.cli.inspect import table_state
from dedupsink.cli.main import main
from dedupsink.engine.classify import PORTS
from dedupsink.errors import ConfigError
from dedupsink.inspection import (
    Inspection,
    Location,
    inspect_store,
    locate,
    lookup,
    report_data,
)
from dedupsink.inspection import history as history_of
from dedupsink.inspection.state import PortState
from dedupsink.masking import MASK
from dedupsink.ports.base import CatalogInfo
from dedupsink.sink.local import LocalSink
from dedupsink.store.history import SCHEMA

FIRST_QUERY = "05bc37e6-7fca-48ec-b0be-959a763d2f7f"
SECOND_QUERY = "3efc2f9d-67a2-4474-8f70-ba92b3d0436e"


@pytest.fixture(scope="module")
def location(tmp_path_factory: pytest.TempPathFactory) -> Location:
    return locate(str(copy_store(tmp_path_factory.mktemp("demo"))))


def test_locating_an_output_path_and_its_store_path(location: Location, tmp_path: Path) -> None:
    assert location.store_url == f"{location.output_url}/_store"
    assert locate(location.store_url) == location
    with pytest.raises(ConfigError, match="no dedup store at"):
        locate(str(tmp_path))


def test_the_inspection_is_typed(location: Location) -> None:
    inspection = inspect_store(location)
    assert isinstance(inspection, Inspection) and inspection.version == 10
    state = inspection.state
    assert state is not None
    assert (state.settings.mode, state.settings.keys, state.windows) == (
        "tupleTime",
        ("serial",),
        8,
    )
    assert state.last_window is not None
    assert state.last_window.window == 9
    assert (state.last_window.record.query, state.last_window.record.batch) == (SECOND_QUERY, 3)
    assert state.latest.text == "2014-12-31 07:55:00 UTC"
    assert state.expiry_point.text == "2014-12-30 07:55:00 UTC"
    assert state.remembered_keys == 291 and state.owner is None
    assert [f.by for f in state.fenced] == ["release", "release"]
    assert {p.port: p.rows for p in state.ports} == {
        "unique": 291,
        "duplicate": 279,
        "expired": 98,
        "error": 14,
    }
    assert all(not p.is_table for p in state.ports)  # Parquet folders
    assert inspection.to_dict()["ports"]["unique"]["rows"] == 291


def test_the_history_is_its_arrow_table(location: Location) -> None:
    rows = history_of(location)
    assert isinstance(rows, pa.Table) and rows.schema == SCHEMA
    assert rows.column("version").to_pylist() == [1, 2, 3, 4, 6, 7, 8, 9]
    assert history_of(location, last=2).column("version").to_pylist() == [8, 9]


def test_a_remembered_key_and_a_forgotten_one(location: Location) -> None:
    remembered = lookup(location, {"serial": "290"})
    assert remembered.remembered and remembered.window == 4
    assert (remembered.query_id, remembered.batch_id) == (FIRST_QUERY, 3)
    assert remembered.stamp_text == "2014-12-31 07:52:00 UTC"
    forgotten = lookup(location, {"serial": 2})
    assert not forgotten.remembered and forgotten.reason is not None
    assert forgotten.reason.startswith("expired, awaiting fold: its stamp 2014-12-30 00:11:00 UTC")


def test_the_report_series_are_typed_columns(location: Location) -> None:
    data = report_data(location)
    assert data.summary is not None and data.windows == 8 and data.group_size == 1
    assert data.summary.totals == {"unique": 291, "duplicate": 279, "expired": 98, "error": 14}
    assert data.summary.queries == 2
    assert [c.last_version for c in data.columns] == [1, 2, 3, 4, 6, 7, 8, 9]
    first = data.columns[0]
    assert first.counts == dict(zip(PORTS, (90, 6, 0, 2), strict=True))
    assert isinstance(first.committed_at, dt.datetime) and first.share(
        "duplicate"
    ) == pytest.approx(100 * 6 / 98)
    assert report_data(location, last=3).windows == 3


def test_an_iceberg_stores_catalog_is_shown_with_the_call_that_reads_its_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The embedded catalog's type, URI, warehouse and name, and the load_catalog call, which
    opens the port tables as written; the location column shows each table's folder."""
    out = tmp_path / "out"
    schema = pa.schema([("id", pa.int64())])
    sink = LocalSink({"path": str(out), "keys": "id", "outputFormat": "iceberg"}, schema)
    sink.window(0, pa.table({"id": [1, 2, 2, 3]}, schema=schema), partitions=2)
    state = inspect_store(locate(str(out))).state
    assert state is not None and state.catalog is not None
    catalog = state.catalog
    assert (catalog.name, catalog.kind) == ("dedupsink", "sql")
    assert catalog.uri == f"sqlite:///{out}/_iceberg_catalog.db"
    assert catalog.warehouse == str(out)
    assert catalog.tables["unique"] == "dedup.out_unique"
    assert [p.path for p in state.ports] == [str(out / port) for port in PORTS]

    from pyiceberg.catalog import load_catalog

    opened = eval(catalog.load_call(), {"load_catalog": load_catalog})  # as a reader pastes it
    assert opened.load_table(catalog.tables["unique"]).scan().to_arrow().num_rows == 3

    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"catalog     sql catalog 'dedupsink' at sqlite:///{out}/_iceberg_catalog.db" in text
    assert "  unique           1      " in text and f"{out}/unique\n" in text
    assert "dedup.out_unique with 1 snapshot, store version 1" in text
    assert main(["inspect", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["catalog"]
    assert shown["uri"] == catalog.uri and shown["load"].startswith(
        'from pyiceberg.catalog import load_catalog; load_catalog("dedupsink"'
    )


def described(**state: object) -> PortState:
    return PortState("unique", 0, 0, 0, "/out/unique", None, state)


@pytest.mark.parametrize(
    ("state", "shown"),
    [
        ({"table": "dedup.out_unique", "snapshots": None}, "dedup.out_unique: no table yet"),
        (
            {"table": "dedup.out_unique", "snapshots": 0, "published_version": -1},
            "dedup.out_unique with no snapshot yet",
        ),
        (
            {"table": "dedup.out_unique", "snapshots": 2, "published_version": -1},
            "dedup.out_unique with 2 snapshots",
        ),
        (
            {"table": "dedup.out_unique", "snapshots": 1, "published_version": 4},
            "dedup.out_unique with 1 snapshot, store version 4",
        ),
        ({"table": "/out/unique", "table_version": None}, "/out/unique: no table yet"),
        (
            {"table": "/out/unique", "table_version": 0, "published_version": None},
            "version 0",
        ),
        ({"log_entries_on_disk": 3}, "-"),
    ],
    ids=[
        "iceberg-none",
        "iceberg-empty",
        "iceberg-other-store",
        "iceberg",
        "delta-none",
        "delta-created",
        "parquet",
    ],
)
def test_an_empty_table_port_is_said_so(state: dict[str, object], shown: str) -> None:
    """A port table not created yet (an embedded catalog makes them at the first commit), or
    holding no window of this store, reads as such, never as None snapshots or version -1."""
    assert table_state(described(**state)) == shown


def test_catalog_secrets_are_masked() -> None:
    catalog = CatalogInfo("c", {"type": "rest", "uri": "https://cat", "token": MASK}, {})
    assert '"token": "***"' in catalog.load_call()
