"""The JSON the operator commands print is a contract: every document of ``inspect``, ``history``
and ``lookup`` with ``--json``, in every mode and port format, validates against the JSON Schema
the installed package ships for it, the schemas refuse a field they do not name, and the shapes
they share (points, error reasons, the state a window used, times) are written alike.

Fast: the stores are written by ``LocalSink`` (no Spark); the demo's store is the shipped copy.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from operator_outputs import copy_store
from referencing import Registry, Resource

from dedupsink.cli.main import main
from dedupsink.inspection import jsonout
from dedupsink.sink.local import LocalSink
from dedupsink.units import utc_text

# The version of each document a reader relies on: raised with a field renamed, removed or
# given another type (docs/JSON.md); pinned here so that a change of shape must say so.
VERSIONS = {"inspect": 2, "history": 1, "lookup": 2}


def _registry() -> Registry[Any]:
    resources = []
    for kind in jsonout.DOCUMENTS:
        schema = jsonout.schema(kind)
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator(jsonout.schema(kind), registry=REGISTRY)


def printed(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0
    return capsys.readouterr().out


def documents(kind: str, path: Path, capsys: pytest.CaptureFixture[str], *more: str) -> list[Any]:
    """What ``dedupsink <kind> PATH --json ...`` prints, parsed: one document, or one a line."""
    out = printed([kind, str(path), "--json", *more], capsys)
    if kind == "history":
        return [json.loads(line) for line in out.splitlines()]
    return [json.loads(out)]


def check(kind: str, found: list[Any]) -> None:
    for document in found:
        validator(kind).validate(document)
        assert document["format"] == f"dedupsink.{kind}/{VERSIONS[kind]}"
        assert next(iter(document)) == "format"  # first, for a reader that peeks


def times_in(value: Any, name: str = "") -> Iterator[tuple[str, Any]]:
    """Every field of a document named as a time (``*_at``, ``heartbeat``), at any depth."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from times_in(inner, key)
    elif isinstance(value, list):
        for inner in value:
            yield from times_in(inner, name)
    elif name.endswith("_at") or name == "heartbeat":
        yield name, value


def names_in(value: Any) -> Iterator[str]:
    """Every field name of a document, at any depth."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from names_in(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from names_in(inner)


# -- the stores --------------------------------------------------------------------------------

ID_CITY = pa.schema([("id", pa.int64()), ("city", pa.string())])
PRODUCER = pa.schema([("host", pa.string()), ("seq", pa.int64())])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of ``make run`` (tupleTime on a zoned timestamp), released twice."""
    return copy_store(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def categorical(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Categorical mode, with error rows (a null key) whose reasons the window records."""
    out = tmp_path_factory.mktemp("categorical") / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "city", "expiryPeriod": "1"}
    sink = LocalSink(options, ID_CITY)
    sink.window(0, pa.table({"id": [1, 2], "city": ["Austin", "Austin"]}, ID_CITY), partitions=2)
    rows = pa.table({"id": [3, 1, None], "city": ["Boston", "Austin", "Boston"]}, ID_CITY)
    sink.window(1, rows, partitions=2)
    return out


@pytest.fixture(scope="module")
def sequence(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sequence") / "out"
    sink = LocalSink({"path": str(out), "keys": "host", "sequenceKey": "seq"}, PRODUCER)
    sink.window(0, pa.table({"host": ["a", "b", "a"], "seq": [1, 1, 2]}, PRODUCER), partitions=2)
    return out


# Key columns of every type lookup parses, named out of alphabetical order; the expiry key a
# naive timestamp, which the store counts as UTC.
TYPED = pa.schema(
    [
        ("name", pa.string()),
        ("id", pa.int64()),
        ("score", pa.float64()),
        ("ok", pa.bool_()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us")),
        ("body", pa.string()),
    ]
)
TYPED_KEY = {"name": "b", "id": 2, "score": 2.5, "ok": True, "day": "2024-01-01"}
T0 = dt.datetime(2024, 1, 1)


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("typed") / "out"
    keys = "name,id,score,ok,day,ts"
    options = {"path": str(out), "keys": keys, "expiryKey": "ts", "expiryPeriod": "90 minutes"}
    rows = {
        "name": ["a", "b"],
        "id": [1, 2],
        "score": [1.0, 2.5],
        "ok": [False, True],
        "day": [T0.date()] * 2,
        "ts": [T0, T0 + dt.timedelta(minutes=30)],
        "body": ["x", "y"],
    }
    LocalSink(options, TYPED).window(0, pa.table(rows, schema=TYPED), partitions=2)
    return out


@pytest.fixture(scope="module", params=["delta", "iceberg"])
def table_ports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "out"
    schema = pa.schema([("id", pa.int64())])
    sink = LocalSink({"path": str(out), "keys": "id", "outputFormat": request.param}, schema)
    sink.window(0, pa.table({"id": [1, 2, 2]}, schema=schema), partitions=2)
    return out


# -- every output against its schema -----------------------------------------------------------


def test_the_demos_documents_match_their_schemas(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check("inspect", documents("inspect", demo, capsys))
    history = documents("history", demo, capsys)
    assert len(history) == 8
    check("history", history)
    for key in ("serial=290", "serial=2", "serial=999999"):
        check("lookup", documents("lookup", demo, capsys, key))


def test_every_mode_and_port_format_matches_the_schemas(
    categorical: Path,
    sequence: Path,
    table_ports: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for path in (categorical, sequence, table_ports):
        check("inspect", documents("inspect", path, capsys))
        check("history", documents("history", path, capsys))
    check("lookup", documents("lookup", categorical, capsys, "id=3"))
    check("lookup", documents("lookup", sequence, capsys, "host=a", "seq=5"))
    check("lookup", documents("lookup", table_ports, capsys, "id=2"))
    shown = documents("inspect", sequence, capsys)[0]
    assert shown["producers"] == {"count": 2, "lowest": 1, "highest": 2}


def test_a_store_without_a_window_matches_the_inspect_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    LocalSink({"path": str(out), "keys": "id"}, pa.schema([("id", pa.int64())])).start()
    found = documents("inspect", out, capsys)
    check("inspect", found)
    assert found[0]["last_window"] is None and found[0]["latest_point"] is None
    assert documents("history", out, capsys) == []


# -- one shape for one thing -------------------------------------------------------------------


def test_the_demos_inspect_document_is_labelled_throughout(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = documents("inspect", demo, capsys)[0]
    assert shown["last_window"]["state"] == {
        "loaded_bytes": 1464,
        "loaded_max_bytes": 864,
        "fetched_bytes": 1464,
        "private_bytes": 1464,
        "mapped_bytes": 0,
    }
    assert shown["latest_point"] == {"value": 1420012500000000, "text": "2014-12-31T07:55:00Z"}
    assert shown["expiry_point"] == {"value": 1419926100000000, "text": "2014-12-30T07:55:00Z"}
    assert shown["committed_at"] == "2026-11-29T00:43:39.325Z"
    assert shown["store_format"] == 2
    # The last window is the history's last line, but what only the store after it holds.
    last_line = documents("history", demo, capsys)[-1]
    assert {k: v for k, v in last_line.items() if k in shown["last_window"]} == shown["last_window"]


def test_the_lookups_points_are_objects_with_iso_times(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = documents("lookup", demo, capsys, "serial=290")[0]
    assert shown["stamp"] == {"value": 1420012320000000, "text": "2014-12-31T07:52:00Z"}
    assert shown["forgotten_at_latest"]["text"] == "2015-01-01T07:52:00Z"
    assert shown["latest_point"] == documents("inspect", demo, capsys)[0]["latest_point"]
    unknown = documents("lookup", demo, capsys, "serial=999999")[0]
    assert unknown["stamp"] is None and unknown["forgotten_at_latest"] is None


def test_the_lookups_key_is_typed_by_its_columns_recorded_type(
    demo: Path, typed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert documents("lookup", demo, capsys, "serial=290")[0]["key"] == {"serial": 290}
    given = [f"{name}={value}" for name, value in TYPED_KEY.items()]
    found = documents("lookup", typed, capsys, *given, "ts=2024-01-01T00:30:00")[0]
    check("lookup", [found])
    assert found["remembered"]
    # in the store's order of keys; a naive time as the store counts it, UTC
    assert found["key"] == {**TYPED_KEY, "ts": "2024-01-01T00:30:00Z"}
    # 2 == 2.0 == True in Python: the types themselves, as JSON wrote them
    assert [type(value) for value in found["key"].values()] == [str, int, float, bool, str, str]


def test_a_key_awaiting_fold_gives_the_stamp_its_reason_names(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = documents("lookup", demo, capsys, "serial=2")[0]
    check("lookup", [shown])
    assert not shown["remembered"] and shown["reason"].startswith("expired, awaiting fold")
    assert shown["stamp"] == {"value": 1419898260000000, "text": "2014-12-30T00:11:00Z"}
    assert shown["stamp"]["value"] <= shown["expiry_point"]["value"]
    text = printed(["lookup", str(demo), "serial=2"], capsys)
    assert f"its stamp {utc_text(shown['stamp']['value'])} is at or below" in text


def test_inspect_lists_keys_and_columns_in_their_order(
    demo: Path, typed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = documents("inspect", demo, capsys)[0]["settings"]
    assert settings["keys"] == [{"name": "serial", "type": "int64"}]
    shown = documents("inspect", typed, capsys)[0]
    check("inspect", [shown])
    assert "key_types" not in shown["settings"]
    assert shown["settings"]["keys"] == [
        {"name": "name", "type": "string"},
        {"name": "id", "type": "int64"},
        {"name": "score", "type": "double"},
        {"name": "ok", "type": "bool"},
        {"name": "day", "type": "date32[day]"},
        {"name": "ts", "type": "timestamp[us]"},
    ]
    assert shown["schema"] == {
        "version": 0,
        "columns": [{"name": field.name, "type": str(field.type)} for field in TYPED],
    }


def test_every_period_is_named_by_its_unit(
    demo: Path,
    categorical: Path,
    sequence: Path,
    typed: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def periods(path: Path) -> list[Any]:
        settings = documents("inspect", path, capsys)[0]["settings"]
        names = ("period_seconds", "period_key_units", "span_seconds", "span_key_units")
        return [settings[name] for name in names]

    assert periods(demo) == [86400, None, 3600, None]  # 24 hours, buckets of 1 hour
    assert periods(typed)[:2] == [5400, None]  # 90 minutes
    assert periods(categorical) == [None, 1, None, None]  # one category back
    assert periods(sequence) == [None, None, None, None]  # nothing expires
    found = [
        *(documents("inspect", path, capsys)[0] for path in (demo, categorical, sequence, typed)),
        *documents("history", demo, capsys),
        *documents("lookup", demo, capsys, "serial=290"),
    ]
    names = {name for document in found for name in names_in(document)}
    assert {"period", "span", "key_types"}.isdisjoint(names)
    for name in names:
        if "period" in name or "span" in name or name.endswith(("_seconds", "_us")):
            assert name.endswith(("_seconds", "_key_units")) or "_seconds_" in name, name


def test_error_reasons_and_categories_are_written_alike_everywhere(
    categorical: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reasons = [{"reason": "null key column 'id'", "rows": 1}]
    inspected = documents("inspect", categorical, capsys)[0]
    assert inspected["last_window"]["error_reasons"] == reasons
    lines = documents("history", categorical, capsys)
    assert [line["error_reasons"] for line in lines] == [[], reasons]
    assert inspected["latest_point"] == {"value": 1, "text": "Boston"}
    assert lines[-1]["latest_point"] == inspected["latest_point"]
    assert lines[0]["latest_point"] == {"value": 0, "text": "Austin"}
    found = documents("lookup", categorical, capsys, "id=3")[0]
    assert found["stamp"] == {"value": 1, "text": "Boston"}


def test_every_time_is_iso_8601_utc(
    demo: Path, categorical: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = [
        *documents("inspect", demo, capsys),
        *documents("history", demo, capsys),
        *documents("lookup", demo, capsys, "serial=290"),
        *documents("inspect", categorical, capsys),
    ]
    times = [value for document in found for _, value in times_in(document)]
    # the local sink still holds its store: a heartbeat; each inspect's verdict is judged at a
    # time, and the demo's names the latest point of its historical data
    assert len(times) == 1 + 8 + 1 + 2 + 2 + 1
    time = jsonout.schema("defs")["$defs"]["time"]
    for value in times:
        Draft202012Validator(time).validate(value)


# -- the schemas are strict and shipped --------------------------------------------------------


def test_the_schemas_refuse_a_field_they_do_not_name(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inspected = documents("inspect", demo, capsys)[0]
    line = documents("history", demo, capsys)[0]
    found = documents("lookup", demo, capsys, "serial=290")[0]
    settings = inspected["settings"]
    drifted = [
        ("inspect", {**inspected, "latest": inspected["latest_point"]}),
        ("inspect", {**inspected, "last_window": {**inspected["last_window"], "query": "q"}}),
        ("history", {**line, "latest_point_text": "2014-12-30 11:42:00 UTC"}),
        ("history", {**line, "error_reasons": [["null key column 'serial'", 1]]}),
        ("lookup", {**found, "stamp": 1420012320000000.0}),
        ("lookup", {**found, "committed_at": "2026-11-29 00:43:18 UTC"}),
        ("inspect", {**inspected, "format": "dedupsink.inspect/1"}),
        ("lookup", {**found, "format": "dedupsink.lookup/1"}),
        # the shapes the second versions replaced
        ("inspect", {**inspected, "settings": {**settings, "key_types": ["int64"]}}),
        ("inspect", {**inspected, "settings": {**settings, "period": 86400000000}}),
        ("inspect", {**inspected, "settings": {**settings, "keys": ["serial"]}}),
        ("inspect", {**inspected, "schema": {"version": 0, "columns": {"serial": "int64"}}}),
        ("lookup", {**found, "key": {"serial": ["290"]}}),
    ]
    for kind, document in drifted:
        with pytest.raises(ValidationError):
            validator(kind).validate(document)


def test_each_schema_names_its_documents_version() -> None:
    assert jsonout.FORMAT_VERSIONS == VERSIONS
    for kind, version in VERSIONS.items():
        const = jsonout.schema(kind)["properties"]["format"]["const"]
        assert const == f"dedupsink.{kind}/{version}"


def test_the_installed_package_ships_the_schemas() -> None:
    """The package is installed from its wheel: the schemas come from its package data."""
    import dedupsink.inspection

    folder = Path(dedupsink.inspection.__file__).parent / "schemas"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{kind}.schema.json" for kind in jsonout.DOCUMENTS
    )
    for kind in jsonout.DOCUMENTS:
        Draft202012Validator.check_schema(jsonout.schema(kind))
    with pytest.raises(ValueError, match="no JSON schema 'report'"):
        jsonout.schema("report")
