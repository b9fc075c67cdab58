"""The store's history (``store/history.py``): one row per committed window, kept in records and
compacted segments of its own, read back whatever a crash or a second process left.

Fast tests drive windows through ``LocalSink`` (no Spark): the record format, one row per window
with the commit's counts, idempotence (a record written twice, by two threads, a re-run batch),
a crash between the commit point and the history write, compaction levels and the bound, and
``dedupsink history`` (text and ``--json``). The Spark tests read the history with
``spark.read.format("dedup")`` after a stream, its restart, and a batch write run twice.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streams import PORT_NAMES, run_stream, write_batches

import dedupsink
import dedupsink.sink.commit as commit_module
from dedupsink.cli.history import render as history_text
from dedupsink.cli.main import main
from dedupsink.errors import DedupOptionError, StoreCorruptError
from dedupsink.sink.local import LocalSink
from dedupsink.store import history as hist
from dedupsink.store.history import (
    FANOUT,
    HISTORY_DIR,
    SCHEMA,
    compact,
    decode,
    encode,
    parse_name,
    read_history,
    record_window,
)
from dedupsink.store.records import WindowRecord
from dedupsink.store.storage import Storage
from dedupsink.store.store import BucketStore

SCHEMA_IN = pa.schema([("id", pa.int64()), ("seq", pa.int64())])
OPTIONS = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "100"}


def window(first: int, count: int = 10, resend: int = 3) -> pa.Table:
    """``count`` new ids from ``first`` and the ``resend`` ids before it again (duplicates)."""
    ids = list(range(first - resend, first + count)) if first >= resend else list(range(count))
    return pa.table({"id": ids, "seq": ids}, schema=SCHEMA_IN)


def store_of(out: Path) -> BucketStore:
    return BucketStore(str(out / "_store"))


def history_files(out: Path) -> list[str]:
    folder = out / "_store" / HISTORY_DIR
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def run_windows(sink: LocalSink, batches: range) -> dict[int, Any]:
    """Windows of ``batches``; each report by its version."""
    reports = {}
    for batch in batches:
        report = sink.window(batch, window(batch * 10), partitions=2)
        assert report is not None
        reports[report.version] = report
    return reports


# -- the record format -------------------------------------------------------------------------


def test_record_format_round_trip_and_damage() -> None:
    rows = [
        {"version": v, "query_id": "q", "batch_id": v - 1, "committed_ms": 1_700_000_000_000 + v}
        for v in (17, 18)
    ]
    data = encode(rows, 17, 32)
    assert data[:4] == b"DSH1"
    decoded = decode(data, "mem://x")
    assert [r["version"] for r in decoded] == [17, 18]
    assert decoded[0]["unique"] is None  # every column is present, unset ones as nil
    table = hist.to_table(decoded)
    assert table.schema == SCHEMA and table.column("committed_at")[0].value == (
        1_700_000_000_017 * 1000
    )
    for damaged in (data[:-1], data[:20], b"XXXX" + data[4:], data[:-1] + bytes([data[-1] ^ 1])):
        with pytest.raises(StoreCorruptError, match="mem://x"):
            decode(damaged, "mem://x")
    assert parse_name("r000000000042.rec") == hist.HistoryFile("r000000000042.rec", 42, 42)
    assert parse_name("s000000000017-000000000032.seg").span == 16  # type: ignore[union-attr]
    assert parse_name(".r000000000042.rec.1a2b.tmp") is None


def test_points_as_text_in_every_mode() -> None:
    day = 86_400_000_000
    assert hist.point_text(None, {"mode": "basic"}, []) is None
    assert hist.point_text(1.5e6, {"mode": "systemTime"}, []) == "1970-01-01 00:00:01.5 UTC"
    timestamp = {"mode": "tupleTime", "expiry_type": "timestamp[us]"}
    assert hist.point_text(day, timestamp, []) == "1970-01-02 00:00:00"
    zoned = {"mode": "tupleTime", "expiry_type": "timestamp[us, tz=UTC]"}
    assert hist.point_text(-day, zoned, []) == "1969-12-31 00:00:00 UTC"
    assert hist.point_text(day, {"mode": "tupleTime", "expiry_type": "date32[day]"}, []) == (
        "1970-01-02"
    )
    assert hist.point_text(3e17, timestamp, []) == "300000000000000000 µs since 1970-01-01"
    assert hist.point_text(1, {"mode": "categorical"}, ["a", "b"]) == "b"
    assert hist.point_text(-1, {"mode": "categorical"}, ["a"]) == "-1 (no category)"
    assert hist.point_text(0.25, {"mode": "ordered"}, []) == "0.25"


# -- rows of real windows ------------------------------------------------------------------------


def test_one_row_per_window_with_the_commits_counts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    reports = run_windows(sink, range(20))
    table = read_history(store_of(out))
    rows = table.to_pylist()
    assert [r["version"] for r in rows] == sorted(reports) == list(range(1, 21))
    for row in rows:
        report = reports[row["version"]]
        assert (row["query_id"], row["batch_id"]) == ("local-query", report.batch_id)
        assert {p: row[p] for p in PORT_NAMES} == report.counts.as_dict()
        assert row["store_bytes"] == report.store_bytes
        assert row["store_files"] == report.store_files
        assert row["keys_remembered"] == report.remembered
    assert sum(r["duplicate"] for r in rows) == 19 * 3
    assert sum(r["keys_added"] for r in rows) == sum(r["unique"] for r in rows)
    # expiryPeriod 100 over 10 new ids a window: old window files are forgotten.
    assert sum(r["keys_forgotten"] for r in rows) > 0
    last = rows[-1]
    assert last["latest_point"] == 199.0 and last["latest_point_text"] == "199"
    assert last["expiry_point"] == 99.0 and last["expiry_point_text"] == "99"
    # Windows 1..16 folded into one segment at version 16; 17..20 are records.
    assert history_files(out) == [
        "r000000000017.rec",
        "r000000000018.rec",
        "r000000000019.rec",
        "r000000000020.rec",
        "s000000000001-000000000016.seg",
    ]
    assert dedupsink.history(str(out)).equals(table)
    assert dedupsink.history(str(out / "_store")).equals(table)
    with pytest.raises(DedupOptionError, match="no store there"):
        dedupsink.history(str(tmp_path / "nothing"))


def test_each_window_records_its_error_rows_by_reason(tmp_path: Path) -> None:
    """Counted in the tasks by reason, summed by the commit, most first; a window without
    error rows has none."""
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
    out = tmp_path / "out"
    options = {"path": str(out), "keys": "id", "expiryKey": "ts", "expiryPeriod": "1 hour"}
    sink = LocalSink(options, schema)
    moment = pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC")).as_py()
    rows = pa.table(
        {"id": [1, None, 3, None, None, 6], "ts": [moment, moment, None, None, moment, None]},
        schema=schema,
    )
    sink.window(0, rows, partitions=2)
    sink.window(1, pa.table({"id": [7], "ts": [moment]}, schema=schema))
    first, second = dedupsink.history(str(out)).column("error_reasons").to_pylist()
    assert first == [
        {"reason": "null key column 'id'", "rows": 3},
        {"reason": "null expiry value in 'ts'", "rows": 2},
    ]
    assert second == []
    assert sum(entry["rows"] for entry in first) == dedupsink.history(str(out))["error"][0].as_py()


def test_a_commit_folds_the_records_it_wrote_without_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    reads: list[str] = []
    original = Storage.read

    def counted(self: Storage, path: str) -> bytes:
        reads.append(path)
        return original(self, path)

    monkeypatch.setattr(Storage, "read", counted)
    run_windows(sink, range(FANOUT))
    assert not [path for path in reads if HISTORY_DIR in path]
    assert history_files(out) == ["s000000000001-000000000016.seg"]


def test_basic_mode_and_a_release_have_no_points_and_no_row(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), "keys": "id"}, SCHEMA_IN)
    run_windows(sink, range(2))
    dedupsink.release(str(out))  # version 3: no window
    sink.start()
    run_windows(sink, range(2, 4))
    rows = dedupsink.history(str(out)).to_pylist()
    assert [r["version"] for r in rows] == [1, 2, 4, 5]
    assert [r["batch_id"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["latest_point"] is None and rows[0]["expiry_point_text"] is None


# -- idempotence -------------------------------------------------------------------------------


def test_a_record_written_twice_or_by_two_processes_is_one_row(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    run_windows(sink, range(3))
    store = store_of(out)
    manifest = store.read()
    assert manifest is not None
    before = (out / "_store" / HISTORY_DIR / "r000000000003.rec").read_bytes()
    record_window(store, manifest)  # a redo
    threads = [
        threading.Thread(target=record_window, args=(BucketStore(store.url), manifest))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (out / "_store" / HISTORY_DIR / "r000000000003.rec").read_bytes() == before
    # The batch run again (a restart before Spark's checkpoint) is discarded: no new row.
    sink.start()
    assert sink.window(2, window(20), partitions=2).already_committed  # type: ignore[union-attr]
    assert read_history(store).column("version").to_pylist() == [1, 2, 3]


def test_two_compactions_of_one_version_agree(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    run_windows(sink, range(FANOUT))
    store = store_of(out)
    table = read_history(store)
    files = history_files(out)
    for _ in range(2):
        compact(store, FANOUT)
    assert history_files(out) == files
    # A crash that left the folded records beside their segment: read once, deleted next time.
    (out / "_store" / HISTORY_DIR / "r000000000005.rec").write_bytes(
        encode([table.slice(4, 1).to_pylist()[0] | {"committed_ms": 0}], 5, 5)
    )
    assert read_history(store).num_rows == FANOUT
    compact(store, FANOUT)
    assert history_files(out) == files


# -- a crash between the commit point and the history write ------------------------------------


def test_a_window_whose_record_was_lost_keeps_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    run_windows(sink, range(4))

    def crash(store: BucketStore, manifest: Any) -> None:
        raise OSError("killed after the commit point")

    monkeypatch.setattr(commit_module, "record_window", crash)
    with pytest.raises(OSError, match="killed"):
        sink.window(4, window(40), partitions=2)  # version 5 committed, no record
    monkeypatch.undo()
    store = store_of(out)
    assert "r000000000005.rec" not in history_files(out)
    # Readers take a kept manifest's row while no file holds it.
    assert read_history(store).column("version").to_pylist() == [1, 2, 3, 4, 5]
    # The next run goes on; the compaction at version 16 writes the lost record and folds it,
    # and the garbage collection at 32 deletes manifest 5: the row stays.
    sink.start()
    run_windows(sink, range(5, 36))
    assert store.versions()[0] > 5
    rows = read_history(store).to_pylist()
    assert [r["version"] for r in rows] == list(range(1, 37))
    assert rows[4]["batch_id"] == 4 and rows[4]["unique"] == 10


def test_a_rerun_of_the_crashed_batch_writes_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    run_windows(sink, range(2))
    monkeypatch.setattr(commit_module, "record_window", lambda store, manifest: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        sink.window(2, window(20), partitions=2)
    monkeypatch.undo()
    sink.start()  # Spark re-runs the batch: discarded, its cleanup (and record) redone
    assert sink.window(2, window(20), partitions=2).already_committed  # type: ignore[union-attr]
    assert "r000000000003.rec" in history_files(out)


# -- compaction levels and the bound -----------------------------------------------------------


def test_compaction_levels_and_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a fanout of 2 (segments of 2, 4 and 8 versions) and 20 versions kept, 200 commits
    leave a bounded number of files, every version of the last 20 and none beyond the bound."""
    monkeypatch.setattr(hist, "FANOUT", 2)
    monkeypatch.setattr(hist, "KEEP_VERSIONS", 20)
    store = BucketStore(str(tmp_path / "store"))
    history = hist._History(store)
    most = 0
    for version in range(1, 201):
        row = {"version": version, "query_id": "q", "batch_id": version, "committed_ms": version}
        history.create(hist.HistoryFile(hist.record_name(version), version, version), [row])
        if version % 2 == 0:
            compact(store, version)
        most = max(most, len(history.files()))
        versions = read_history(store).column("version").to_pylist()
        assert versions == list(range(versions[0], version + 1))
        assert version - versions[0] < 20 + 8  # the bound, plus at most one top segment
        assert version - versions[0] >= min(version - 1, 19)
    assert most <= 1 + 1 + 1 + (20 + 8) // 8 + 1
    spans = {f.span for f in history.files()}
    assert spans <= {1, 2, 4, 8}


# -- the command -------------------------------------------------------------------------------


def test_each_window_records_its_wall_and_commit_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Wall time from the window's first task's start to its commit point, and the commit's own:
    in the window record (absent from an older record's bytes), the history and its text."""
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    run_windows(sink, range(2))
    rows = read_history(store_of(out)).to_pylist()
    for row in rows:
        assert 0 < row["commit_seconds"] <= row["wall_seconds"]
        assert row["wall_seconds"] >= row["task_seconds"] - 0.001  # one task a window here
    record = BucketStore(str(out / "_store")).read()
    assert record is not None and record.last_window is not None
    window = record.last_window
    assert (window.wall_seconds, window.commit_seconds) == (
        rows[-1]["wall_seconds"],
        rows[-1]["commit_seconds"],
    )
    assert window.to_wire()["wall"] == [window.wall_seconds, window.commit_seconds]
    older = replace(window, wall_seconds=None, commit_seconds=None)
    assert "wall" not in older.to_wire()
    assert WindowRecord.from_wire(older.to_wire()) == older
    row = {
        "version": 6,
        "query_id": "966b42e4",
        "batch_id": 0,
        "committed_ms": 1_764_378_000_000,
        **dict(zip(PORT_NAMES, (0, 31, 65, 2), strict=True)),
        "keys_added": 0,
        "keys_forgotten": 0,
        "keys_remembered": 230,
        "keys_expired_unfolded": 61,
        "store_bytes": 7_000,
        "latest_point_text": "2014-12-31 07:55:00 UTC",
        "wall_seconds": 9.126,
        "commit_seconds": 0.412,
    }
    before = {**row, "version": 5, "keys_expired_unfolded": None, "wall_seconds": None}
    assert history_text(hist.to_table([before, row]), "s") == HISTORY_TEXT


HISTORY_TEXT = (
    "store s: 2 windows\n"
    "  version      committed (UTC)  batch  unique  duplicate  expired  error  keys +  keys -  "
    "remembered  awaiting fold  wall s  commit s   store             latest point  query\n"
    "  5        2025-11-29 01:00:00      0       0         31       65      2       0       0  "
    "       230              -       -      0.41  7.0 kB  2014-12-31 07:55:00 UTC  966b42e4\n"
    "  6        2025-11-29 01:00:00      0       0         31       65      2       0       0  "
    "       230             61    9.13      0.41  7.0 kB  2014-12-31 07:55:00 UTC  966b42e4"
)


def test_history_command_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), **OPTIONS}, SCHEMA_IN)
    run_windows(sink, range(3))
    assert main(["history", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"store {out}/_store: 3 windows"
    assert lines[1].split()[:3] == ["version", "committed", "(UTC)"]
    assert [line.split()[0] for line in lines[2:]] == ["1", "2", "3"]
    assert lines[3].split()[3:8] == ["1", "10", "3", "0", "0"]  # batch, unique, duplicate, ...
    assert main(["history", str(out / "_store"), "--json", "--last", "2"]) == 0
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["version"] for o in objects] == [2, 3]
    # The table's columns, but each point with its text as one object and the state as one.
    folded = [n for n in SCHEMA.names if not n.endswith("_text") and not n.startswith("state_")]
    shown = [n for n in objects[0] if n not in ("format", "state")]
    assert shown == folded and objects[0]["format"] == "dedupsink.history/1"
    assert objects[1]["committed_at"].endswith("Z") and objects[1]["duplicate"] == 3
    assert main(["history", str(tmp_path / "nothing")]) == 2
    assert "no dedup store" in capsys.readouterr().err


# -- Spark -------------------------------------------------------------------------------------


def spark_rows(spark: Any, target: str | None, **options: str) -> list[dict[str, Any]]:
    reader = spark.read.format("dedup")
    for key, value in options.items():
        reader = reader.option(key, value)
    frame = reader.load() if target is None else reader.load(target)
    return [row.asDict() for row in frame.orderBy("version").collect()]


def port_counts(spark: Any, out: Path) -> dict[str, int]:
    return {port: spark.read.parquet(str(out / port)).count() for port in PORT_NAMES}


@pytest.mark.spark
@pytest.mark.slow  # four streams and batch writes in a child Spark: 26 s
def test_spark_reads_the_history_of_a_stream_a_restart_and_batch_writes(
    spark: Any, tmp_path: Path
) -> None:
    out, inputs, checkpoint = tmp_path / "out", tmp_path / "in", tmp_path / "cp"
    write_batches(inputs, [window(i * 10) for i in range(2)])
    run_stream(spark, inputs, out, OPTIONS, checkpoint)
    write_batches(inputs, [window(20)], start=2)
    run_stream(spark, inputs, out, OPTIONS, checkpoint)  # a restart from the checkpoint
    pq.write_table(window(35), tmp_path / "backfill.parquet")
    frame = spark.read.parquet(str(tmp_path / "backfill.parquet"))
    for _ in range(2):  # the same batch job run twice: the second is all duplicates
        frame.write.format("dedup").options(**OPTIONS).mode("append").save(str(out))

    rows = spark_rows(spark, str(out))
    assert [r["version"] for r in rows] == list(range(1, 6))
    assert [r["batch_id"] for r in rows] == [0, 1, 2, 0, 0]
    assert len({r["query_id"] for r in rows[:3]}) == 1
    assert all(r["query_id"].startswith("batch-") for r in rows[3:])
    assert {p: sum(r[p] for r in rows) for p in PORT_NAMES} == port_counts(spark, out)
    assert rows[4]["unique"] == 0 and rows[4]["duplicate"] == 13
    assert rows[-1]["committed_at"] >= rows[0]["committed_at"]
    assert spark.read.format("dedup").load(str(out)).schema.fieldNames() == SCHEMA.names
    # storePath names the same history; the Python API agrees.
    assert spark_rows(spark, None, storePath=str(out / "_store")) == rows
    local = dedupsink.history(str(out)).to_pylist()
    assert [(r["version"], r["unique"], r["duplicate"]) for r in local] == [
        (r["version"], r["unique"], r["duplicate"]) for r in rows
    ]
    with pytest.raises(Exception, match="no store there"):
        spark.read.format("dedup").load(str(tmp_path / "nothing")).collect()
