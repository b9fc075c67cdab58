"""``dedupsink lookup`` and ``dedupsink.lookup``: whether a store remembers a key, since which
window, with which stamp, until when; or why it does not.

Fast tests, no Spark: windows are driven through ``LocalSink`` (two partitions) in Basic Dedup
and in tupleTime mode, then keys are looked up through the Python function and the CLI.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest

import dedupsink
from dedupsink.cli.lookup import render
from dedupsink.cli.main import main
from dedupsink.engine.placement import bucket_of, key_fingerprints
from dedupsink.errors import ConfigError
from dedupsink.sink.local import LocalSink
from dedupsink.store.store import BucketStore

BASIC_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
TIME_SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def basic_rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=BASIC_SCHEMA)


def time_rows(ids: list[int], hours: float) -> pa.Table:
    moment = T0 + dt.timedelta(hours=hours)
    return pa.table({"id": ids, "ts": [moment] * len(ids)}, schema=TIME_SCHEMA)


@pytest.fixture(scope="module")
def basic_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Batch 0: ids 0..9; batch 1: ids 5..14 (5..9 duplicates)."""
    out = tmp_path_factory.mktemp("basic") / "out"
    sink = LocalSink({"path": str(out), "keys": "id,name"}, BASIC_SCHEMA)
    sink.window(0, basic_rows(list(range(10))), partitions=2)
    sink.window(1, basic_rows(list(range(5, 15))), partitions=2)
    return out


@pytest.fixture(scope="module")
def time_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tupleTime, one hour: ids 0..4 at T0, ids 0..9 at T0 + 30 min (0..4 duplicates), ids
    100..104 at T0 + 3 h, which forgets everything before T0 + 2 h."""
    out = tmp_path_factory.mktemp("time") / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    sink = LocalSink(options, TIME_SCHEMA)
    sink.window(0, time_rows(list(range(5)), 0), partitions=2)
    sink.window(1, time_rows(list(range(10)), 0.5), partitions=2)
    sink.window(2, time_rows(list(range(100, 105)), 3), partitions=2)
    return out


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["lookup", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- Basic Dedup --------------------------------------------------------------------------


def test_basic_unique_key_since_its_window(basic_store: Path) -> None:
    found = dedupsink.lookup(str(basic_store), {"id": 12, "name": "n12"})
    assert found.remembered
    assert (found.window, found.batch_id, found.query_id) == (2, 1, "local-query")
    assert found.stamp is None and found.committed_at is not None
    assert found.forgotten_when is not None and found.forgotten_when.startswith("never")
    assert not found.window_is_upper_bound


def test_basic_duplicate_key_since_the_window_it_was_unique(basic_store: Path) -> None:
    # id 7 came in batch 0 (version 1) and again, as a duplicate, in batch 1.
    found = dedupsink.lookup(str(basic_store), {"id": "7", "name": "n7"})
    assert found.remembered and (found.window, found.batch_id) == (1, 0)


def test_basic_unknown_key_never_seen(basic_store: Path) -> None:
    found = dedupsink.lookup(str(basic_store), {"id": 7, "name": "other"})
    assert not found.remembered
    assert found.reason is not None and found.reason.startswith("never seen")


def test_fingerprint_and_bucket_are_the_classifiers(basic_store: Path) -> None:
    found = dedupsink.lookup(str(basic_store), {"id": 3, "name": "n3"})
    manifest = BucketStore(str(basic_store / "_store")).read()
    assert manifest is not None
    settings = manifest.settings.engine_settings()
    fps = key_fingerprints(settings, [pa.array([3], pa.int64()), pa.array(["n3"], pa.string())])
    assert found.fingerprint == f"{int(fps.h1[0]):016x}{int(fps.h2[0]):016x}"
    assert found.bucket == int(bucket_of(settings, fps, None)[0])


def test_basic_cli_text_and_json(basic_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([str(basic_store), "id=12", "name=n12"], capsys)
    assert code == 0 and err == ""
    assert "remembered  yes, since window 2 (query local-query, batch 1, committed" in out
    assert "forgotten   never" in out
    code, out, _ = cli([str(basic_store), "id=99", "name=x", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["remembered"] is False and data["reason"].startswith("never seen")
    code, out, _ = cli([str(basic_store / "_store"), "id=0", "name=n0", "--json"], capsys)
    data = json.loads(out)
    assert data["remembered"] is True and data["window"] == 1 and data["batch_id"] == 0


# -- tupleTime ----------------------------------------------------------------------------


def test_time_unique_key_with_its_stamp(time_store: Path) -> None:
    found = dedupsink.lookup(str(time_store), {"id": 102})
    assert found.remembered and (found.window, found.batch_id) == (3, 2)
    assert found.stamp_text == "2024-01-01 03:00:00 UTC"
    assert found.forgotten_at_latest_text == "2024-01-01 04:00:00 UTC"
    assert found.bucket is None  # the expiry key is no key column: every bucket searched
    assert found.expiry_point_text == "2024-01-01 02:00:00 UTC"


def test_time_expiry_narrows_to_one_bucket(time_store: Path) -> None:
    found = dedupsink.lookup(str(time_store), {"id": 102}, expiry="2024-01-01T03:00:00Z")
    assert found.remembered and found.bucket is not None and found.window == 3


def test_time_forgotten_key(time_store: Path) -> None:
    # id 7 was stored at T0 + 30 min; the expiry point is T0 + 2 h.
    found = dedupsink.lookup(str(time_store), {"id": 7})
    assert not found.remembered
    assert found.reason is not None and "forgotten" in found.reason
    assert "2024-01-01 02:00:00 UTC" in found.reason
    given = dedupsink.lookup(str(time_store), {"id": 7}, expiry=T0 + dt.timedelta(minutes=30))
    assert given.reason is not None and given.reason.startswith("expired or forgotten")


def test_time_unknown_key(time_store: Path) -> None:
    found = dedupsink.lookup(str(time_store), {"id": 555})
    assert not found.remembered and found.reason is not None
    assert found.reason.startswith("never seen, or forgotten")


def test_time_duplicate_key_since_first_window(tmp_path: Path) -> None:
    out = tmp_path / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    sink = LocalSink(options, TIME_SCHEMA)
    sink.window(0, time_rows([1, 2, 3], 0), partitions=2)
    sink.window(1, time_rows([2, 3, 4], 0), partitions=2)  # 2 and 3 are duplicates
    found = dedupsink.lookup(str(out), {"id": 3})
    assert found.remembered and (found.window, found.batch_id) == (1, 0)
    assert found.stamp_text == "2024-01-01 00:00:00 UTC"


def test_time_cli_json_and_text(time_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli([str(time_store), "id=101", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["remembered"] is True and data["window"] == 3
    assert data["stamp"] == {"value": 1704078000000000, "text": "2024-01-01T03:00:00Z"}
    code, out, _ = cli([str(time_store), "id=3", "--expiry", "2024-01-01T00:00:00"], capsys)
    assert code == 0 and "remembered  no: expired or forgotten" in out


# -- errors -------------------------------------------------------------------------------


def test_bad_value_is_one_line(basic_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([str(basic_store), "id=abc", "name=x"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dedupsink: error: id=abc: ")
    assert "int64" in err
    with pytest.raises(ConfigError, match="int64"):
        dedupsink.lookup(str(basic_store), {"id": "abc", "name": "x"})


def test_missing_and_unknown_columns(basic_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli([str(basic_store), "id=1"], capsys)
    assert code == 2 and "missing key column name" in err and err.count("\n") == 1
    code, _, err = cli([str(basic_store), "id=1", "name=a", "other=2"], capsys)
    assert code == 2 and "other is not a key column (the store's keys: id, name)" in err
    code, _, err = cli([str(basic_store), "id"], capsys)
    assert code == 2 and "COLUMN=VALUE" in err


def test_a_misspelt_key_column_is_named_with_what_it_likely_meant(
    basic_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.relative_to(basic_store) for p in basic_store.rglob("*"))
    code, out, err = cli([str(basic_store), "id=1", "nmae=a"], capsys)
    assert (code, out) == (2, "")
    assert err == (
        "dedupsink: error: missing key column name; nmae is not a key column (did you mean "
        "name?) (the store's keys: id, name)\n"
    )
    assert sorted(p.relative_to(basic_store) for p in basic_store.rglob("*")) == before


def test_bad_timestamp_and_unsupported_type(
    tmp_path: Path, time_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli([str(time_store), "id=1", "--expiry", "yesterday"], capsys)
    assert code == 2 and "timestamp" in err and err.count("\n") == 1
    schema = pa.schema([("id", pa.binary())])
    out = tmp_path / "out"
    LocalSink({"path": str(out), "keys": "id"}, schema).window(
        0, pa.table({"id": [b"a", b"b"]}, schema=schema)
    )
    code, _, err = cli([str(out), "id=a"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "key column 'id' has type binary" in err


def test_timestamp_and_date_keys_in_iso_text(tmp_path: Path) -> None:
    schema = pa.schema(
        [("id", pa.int64()), ("day", pa.date32()), ("ts", pa.timestamp("us", tz="UTC"))]
    )
    out = tmp_path / "out"
    options = {"path": str(out), "keys": "id,day,ts", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    moment = T0 + dt.timedelta(minutes=30)
    rows = pa.table({"id": [1, 2], "day": [T0.date()] * 2, "ts": [moment] * 2}, schema=schema)
    LocalSink(options, schema).window(0, rows, partitions=2)
    key = {"id": "2", "day": "2024-01-01", "ts": "2024-01-01T00:30:00"}  # naive text: UTC
    found = dedupsink.lookup(str(out), key)
    assert found.remembered and found.window == 1
    assert found.bucket is not None  # the expiry key is a key column: its bucket is known
    assert found.stamp_text == "2024-01-01 00:30:00 UTC"
    other = dedupsink.lookup(str(out), {**key, "ts": "2024-01-01T01:30:00+01:00"})
    assert other.remembered and other.window == 1  # the same instant
    assert not dedupsink.lookup(str(out), {**key, "day": "2024-01-02"}).remembered


def test_forgotten_key_still_in_a_live_window_file(tmp_path: Path) -> None:
    # One file holds id 50 at T0 and id 51 at T0 + 3 h: the file stays, id 50 is forgotten.
    out = tmp_path / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    times = [T0, T0 + dt.timedelta(hours=3)]
    rows = pa.table({"id": [50, 51], "ts": times}, schema=TIME_SCHEMA)
    LocalSink(options, TIME_SCHEMA).window(0, rows, partitions=1)
    found = dedupsink.lookup(str(out), {"id": 50})
    assert not found.remembered and found.reason is not None
    assert found.reason.startswith(
        "expired, awaiting fold: its stamp 2024-01-01 00:00:00 UTC is at or below"
    )
    assert dedupsink.lookup(str(out), {"id": 51}).remembered


def test_folded_key_reports_an_upper_bound(tmp_path: Path) -> None:
    # 40 windows over two hash buckets: compaction folds old segments into later windows' files.
    out = tmp_path / "out"
    schema = pa.schema([("id", pa.int64())])
    sink = LocalSink({"path": str(out), "keys": "id", "numBuckets": "2"}, schema)
    for batch in range(40):
        ids = list(range(batch * 10, batch * 10 + 10))
        sink.window(batch, pa.table({"id": ids}, schema=schema), partitions=1)
    found = dedupsink.lookup(str(out), {"id": 3})  # stored by batch 0, version 1
    assert found.remembered and found.window is not None and found.window > 1
    assert found.window_is_upper_bound
    assert "or earlier" in render(found)
