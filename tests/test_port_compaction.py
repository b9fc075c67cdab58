"""Port compaction (``dedupsink compact``, ``ports/compaction.py``) of Delta and Iceberg ports.

Windows go through the sink's own code without Spark (``LocalSink``); the tables are read back
with delta-rs and pyiceberg, never through the sink. A compaction must leave the rows as they
were, read by the current version and by the version before it (time travel), and must never
make a window's commit fail or publish it wrong, whichever of the two commits first.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from compaction_race import CompactionLoop
from faults import (
    CONTROL_ENV,
    ORDERED_OPTIONS,
    ROW_SCHEMA,
    Control,
    FaultPoint,
    InProcessSink,
    assert_exactly_once,
    fault_url,
    ordered_batch,
)
from lakehouse import PortTables, check_tables, per_window

from dedupsink.cli.main import main
from dedupsink.errors import DedupOptionError
from dedupsink.options import DedupOptions
from dedupsink.ports.compaction import PortCompaction, TableFile, compact_ports, plan_bins
from dedupsink.ports.delta import CHECKPOINT_INTERVAL, _own_commits
from dedupsink.ports.formats import compactor_for, port_format
from dedupsink.sink.local import LocalSink

FORMATS = ("delta", "iceberg")
PORTS = ("unique", "duplicate", "expired", "error")
COLUMNS = ("rid", "id", "n")
KEY_SCHEMA = pa.schema([("rid", pa.int64()), ("id", pa.int64())])


def new_keys(window: int, rows: int) -> pa.Table:
    """``rows`` rows of keys never seen before: one unique row for each partition."""
    ids = [window * rows + i for i in range(rows)]
    return pa.table({"rid": ids, "id": ids}, schema=KEY_SCHEMA)


def sorted_rows(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def head(tables: PortTables, port: str) -> int:
    """The port table's current version (Delta) or snapshot id (Iceberg)."""
    if tables.fmt == "delta":
        return int(tables.delta(port).version())
    snapshot = tables.iceberg(port).current_snapshot()
    assert snapshot is not None
    return int(snapshot.snapshot_id)


def read_at(tables: PortTables, port: str, version: int) -> pa.Table:
    """The port table as it was at ``version`` (Delta) or snapshot ``version`` (Iceberg)."""
    if tables.fmt == "delta":
        return tables.delta(port, version).to_pyarrow_table()
    return tables.iceberg(port).scan(snapshot_id=version).to_arrow()


def last_commit_is_compaction(tables: PortTables, port: str) -> None:
    """The latest commit is a compaction that changes no data: Delta's OPTIMIZE with every
    action ``dataChange=false``; an Iceberg snapshot of operation ``replace``."""
    if tables.fmt == "delta":
        table = tables.delta(port)
        entry = Path(tables.remote.url) / port / "_delta_log" / f"{table.version():020d}.json"
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        assert actions[0]["commitInfo"]["operation"] == "OPTIMIZE", actions[0]
        changes = [a.get("add") or a.get("remove") for a in actions[1:]]
        assert changes and all(change["dataChange"] is False for change in changes)
        assert {"add", "remove"} == {key for a in actions[1:] for key in a}
        assert actions[0]["commitInfo"]["engineInfo"].startswith("dedupsink/")
        for add in (a["add"] for a in actions[1:] if "add" in a):
            stats = json.loads(add["stats"])  # as a window's files: skipping still works
            assert {"numRecords", "minValues", "maxValues", "nullCount"} <= set(stats), stats
            assert stats["numRecords"] > 0 and stats["minValues"], stats
        return
    snapshot = tables.iceberg(port).current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace", snapshot.summary


def ordered_sink(out: Path, fmt: str) -> tuple[LocalSink, list[pa.Table]]:
    sink = LocalSink({"path": str(out), **ORDERED_OPTIONS, "outputFormat": fmt}, ROW_SCHEMA)
    return sink, []


def run_window(sink: LocalSink, inputs: list[pa.Table], partitions: int = 1) -> None:
    batch = len(inputs)
    inputs.append(ordered_batch(batch))
    sink.window(batch, inputs[-1], partitions)


def check_against_reference(out: Path, fmt: str, inputs: list[pa.Table]) -> None:
    """Each input row in exactly one port once; every table equal to the reference model with
    one commit of rows per window (compaction commits checked to change no rows)."""
    tables = PortTables(fmt, out)
    by_port = {p: tables.read(p).column("rid").to_pylist() for p in PORTS}
    assert_exactly_once(by_port, inputs)
    check_tables(tables, per_window(inputs, "ordered", ["id"], "n", 10), COLUMNS)


def compact_here(out: Path, fmt: str, target: int = 1 << 20) -> list[PortCompaction]:
    ports = port_format(DedupOptions(path=str(out), output_format=fmt))
    return compact_ports(compactor_for(ports), target)


# -- the plan --------------------------------------------------------------------------------


def test_plan_bins_packs_small_files_in_window_order_up_to_the_target() -> None:
    files = [
        TableFile("u/part-0000000003-p0.parquet", 40),
        TableFile("u/part-0000000001-p0.parquet", 40),
        TableFile("u/compact-0000000000-0000-x.parquet", 50),
        TableFile("u/part-0000000002-p0.parquet", 500),  # at the target: left alone
        TableFile("u/part-0000000004-p0.parquet", 30),
        TableFile("u/part-0000000005-p0.parquet", 90),
    ]
    bins = plan_bins(files, 100)
    assert [[f.path.split("/")[1][:18] for f in group] for group in bins] == [
        ["compact-0000000000", "part-0000000001-p0"],
        ["part-0000000003-p0", "part-0000000004-p0"],
    ]  # part-5 alone in its bin: nothing to gain


# -- a thousand small files ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_compact_rewrites_a_thousand_small_files_into_a_few(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """125 windows of 8 partitions leave 1,000 files in ``unique``; ``dedupsink compact``
    rewrites them in one commit; the rows read back the same, now and at the version before;
    the next windows commit on top as before."""
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), "keys": "id", "outputFormat": fmt}, KEY_SCHEMA)
    for window in range(125):
        sink.window(window, new_keys(window, 8), partitions=8)
    tables = PortTables(fmt, out)
    before = sorted_rows(tables.read("unique"), ("rid", "id"))
    assert len(before) == 1000 and len(tables.table_files("unique")) == 1000
    version_before = head(tables, "unique")

    started = time.monotonic()
    assert main(["compact", str(out), "--target-size", "128MB"]) == 0
    elapsed = time.monotonic() - started
    printed = capsys.readouterr().out
    assert "unique: 1000 -> 1 files" in printed, printed
    print(f"\n{fmt}: 1000 -> {len(tables.table_files('unique'))} files in {elapsed:.2f} s")

    assert len(tables.table_files("unique")) < 10
    assert sorted_rows(tables.read("unique"), ("rid", "id")) == before
    assert sorted_rows(read_at(tables, "unique", version_before), ("rid", "id")) == before
    last_commit_is_compaction(tables, "unique")

    for window in range(125, 128):  # the sink goes on, in the process that compacted
        sink.window(window, new_keys(window, 8), partitions=8)
    after = sorted_rows(tables.read("unique"), ("rid", "id"))
    assert after == sorted(before + [(i, i) for i in range(1000, 1024)])
    assert len(tables.table_files("unique")) == 1 + 24


def test_compact_refuses_parquet_ports_saying_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), "keys": "id"}, KEY_SCHEMA)
    sink.window(0, new_keys(0, 2))
    assert main(["compact", str(out)]) == 2
    error = capsys.readouterr().err
    assert "outputFormat=parquet" in error and "Compacting the ports" in error
    assert main(["compact", str(out), "--target-size", "lots"]) == 2
    assert "--target-size='lots'" in capsys.readouterr().err


# -- races with the sink's commits, each order made on purpose --------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_window_committed_between_a_compactions_read_and_commit(tmp_path: Path, fmt: str) -> None:
    """The compaction reads the table, a window commits, then the compaction commits: it loses
    that version, reads the table again and commits the same files on the next one."""
    out = tmp_path / "out"
    sink, inputs = ordered_sink(out, fmt)
    for _ in range(4):
        run_window(sink, inputs)
    ports = port_format(DedupOptions(path=str(out), output_format=fmt))
    compactor = compactor_for(ports)
    plain_commit = compactor.commit
    raced: list[int] = []

    def commit_after_a_window(*args: Any) -> int | None:
        if not raced:
            raced.append(len(inputs))
            run_window(sink, inputs)  # a window published meanwhile, to every port
        return plain_commit(*args)

    compactor.commit = commit_after_a_window  # type: ignore[method-assign]
    done = {result.port: result for result in compact_ports(compactor, 1 << 20)}
    assert done["unique"].outcome == "compacted" and done["unique"].rounds == 2
    assert all(result.rounds == 1 for port, result in done.items() if port != "unique")
    run_window(sink, inputs)
    check_against_reference(out, fmt, inputs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_compaction_from_another_process_between_two_windows(tmp_path: Path, fmt: str) -> None:
    """``dedupsink compact`` in another process takes the version after this process's last
    window commit: the next window's one-request commit (Delta's conditional create of that
    entry; Iceberg's cached handle) fails, and it commits on the table as read."""
    out = tmp_path / "out"
    sink, inputs = ordered_sink(out, fmt)
    for _ in range(4):
        run_window(sink, inputs)
    tables = PortTables(fmt, out)
    version = tables.delta("unique").version() if fmt == "delta" else None
    done = subprocess.run(
        [sys.executable, "-m", "dedupsink", "compact", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last_commit_is_compaction(tables, "unique")
    run_window(sink, inputs)
    if fmt == "delta":
        assert version is not None
        uri = str(out / "unique")
        assert tables.delta("unique").version() == version + 2  # the OPTIMIZE, then the window
        assert _own_commits[uri].table_version == version + 2
    run_window(sink, inputs)
    check_against_reference(out, fmt, inputs)


def test_a_delta_compaction_at_a_checkpoint_version_writes_the_checkpoint(tmp_path: Path) -> None:
    """Windows make versions 1 to 8 of ``unique``; the compaction is version 9, where a
    window's commit would write the checkpoint (every ``CHECKPOINT_INTERVAL``): it writes it,
    and the table, read from it, is right, then and after more windows."""
    out = tmp_path / "out"
    sink, inputs = ordered_sink(out, "delta")
    for _ in range(CHECKPOINT_INTERVAL - 2):
        run_window(sink, inputs)
    tables = PortTables("delta", out)
    assert tables.delta("unique").version() == CHECKPOINT_INTERVAL - 2
    done = {result.port: result for result in compact_here(out, "delta")}
    assert done["unique"].committed_version == CHECKPOINT_INTERVAL - 1
    log = out / "unique" / "_delta_log"
    assert (log / f"{CHECKPOINT_INTERVAL - 1:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 9
    check_against_reference(out, "delta", inputs)
    for _ in range(CHECKPOINT_INTERVAL + 1):
        run_window(sink, inputs)
    check_against_reference(out, "delta", inputs)


# -- many rounds, two processes ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_compactions_in_another_process_racing_windows_lose_nothing(
    tmp_path: Path, fmt: str
) -> None:
    """A process compacts every port over and over while this one commits 40 windows: every
    input row is in exactly one port once, every table equals the reference model with one
    commit of rows per window, and no window's commit failed."""
    out = tmp_path / "out"
    sink, inputs = ordered_sink(out, fmt)
    run_window(sink, inputs)  # the tables exist before the other process looks
    loop = CompactionLoop(out, fmt)
    try:
        for _ in range(39):
            run_window(sink, inputs)
    finally:
        outcomes = loop.finish()
    check_against_reference(out, fmt, inputs)
    counts = Counter(outcome for _, outcome, _ in outcomes)
    lost = sum(1 for _, outcome, rounds in outcomes if outcome == "compacted" and rounds > 1)
    print(f"\n{fmt}: compaction outcomes {dict(counts)}, commits that lost a round {lost}")
    assert counts["compacted"] >= 4, counts


# -- compactEvery: compaction in the driver's commit ------------------------------------------


@pytest.mark.parametrize(
    ("given", "option", "accepted"),
    [
        ({"compactEvery": "-1"}, "compactEvery", "a whole number, 0 or more"),
        ({"compactEvery": "often"}, "compactEvery", "a whole number, 0 or more"),
        ({"compactEvery": "5"}, "compactEvery", "0 (off) with outputFormat=parquet"),
        (
            {"compactEvery": "5", "outputFormat": "delta", "compactTargetSize": "huge"},
            "compactTargetSize",
            "a size such as '128 MB'",
        ),
    ],
)
def test_compact_options_fail_the_query_before_any_output(
    tmp_path: Path, given: dict[str, str], option: str, accepted: str
) -> None:
    out = tmp_path / "out"
    sink = LocalSink({"path": str(out), "keys": "id", **given}, KEY_SCHEMA)
    with pytest.raises(DedupOptionError) as refused:
        sink.start()
    expected = f"option {option}={given[option]!r} is invalid: expected {accepted}"
    assert expected in str(refused.value)
    assert not out.exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_compact_every_compacts_in_the_commit_after_publishing(tmp_path: Path, fmt: str) -> None:
    """``compactEvery=3``: after versions 3, 6 and 9 the commit compacts each port; the tables
    hold one commit of rows per window and few files."""
    out = tmp_path / "out"
    options = {"path": str(out), **ORDERED_OPTIONS, "outputFormat": fmt, "compactEvery": "3"}
    sink, inputs = LocalSink(options, ROW_SCHEMA), []
    for _ in range(10):
        run_window(sink, inputs)
    tables = PortTables(fmt, out)
    assert len(tables.table_files("unique")) == 2  # compacted at version 9, then window 10
    check_against_reference(out, fmt, inputs)


def test_a_failing_compaction_in_the_commit_is_logged_and_the_window_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first compaction's file write fails (a full disk, through the test filesystem): the
    window's commit returns, the warning names the version, and the next compaction runs."""
    control = Control(tmp_path / "control").setup(
        [FaultPoint("full", "commit", op="open(wb)", path_part="compact-", action="raise")]
    )
    monkeypatch.setenv(CONTROL_ENV, str(control.dir))
    out = tmp_path / "out"
    options = {**ORDERED_OPTIONS, "outputFormat": "delta", "compactEvery": "2"}
    sink, inputs = InProcessSink(fault_url(out), options, ROW_SCHEMA), []
    with caplog.at_level(logging.WARNING, logger="dedupsink"):
        for _ in range(4):
            run_window(sink, inputs)
    assert set(control.fired()) == {"full"}
    assert "port compaction after version 2 skipped" in caplog.text
    assert len(PortTables("delta", out).table_files("unique")) == 1  # compacted at version 4
    check_against_reference(out, "delta", inputs)
