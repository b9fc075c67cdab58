"""Schema evolution (``mergeSchema=true``) under real process kills, and read back by Spark.

Kills: the direct engine of ``tests/reliability_driver.py`` runs five ordered-mode windows into
Delta or Iceberg ports in a process of its own; the input files from the third on carry a column
more (``region``), and each file whose columns differ starts the sink anew with its schema
(``schema_per_file``), so window 3 of the store is the schema-changing one. The driver's process
group is SIGKILLed at a point of that window's commit (``tests/faults.py``): before the commit
point, before the first table commit, between the first and second port's table commits, after
the last table commit, after the sink commit; and, in a window that sends the expired port no
rows, on either side of that port's schema change alone. Right after each kill the test reads
the store and every table with its own reader (delta-rs, pyiceberg): the tables that show the
window, and only those, declare the column; no table names a data file carrying a column it does
not declare; no row is visible twice; what is visible equals the reference model of the windows
shown. The driver is then restarted until done: each table declares the column once (one Delta
``metaData`` change, one Iceberg schema more), added in the commit of window 3; every input row
is in exactly one table exactly once; the tables equal the reference model, old rows reading the
column as null; one commit of rows per window with rows.

Spark: a stream of files without the column, then a second query over the same checkpoint with
the wider schema (what a user does when the events gain a field: the file source's schema is
the query's, and a fresh checkpoint would read every old file again), ``mergeSchema=true``;
and a batch write of rows with the column after a narrow stream. Spark reads the Parquet ports
(merging the files' schemas), the Delta ports through delta-rs and the Iceberg ports through
pyiceberg into DataFrames: equal to the reference model.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from faults import (
    ORDERED_OPTIONS,
    PORTS,
    Control,
    DriverRun,
    FaultPoint,
    assert_exactly_once,
    ordered_batch,
    run_driver,
    table_point,
    write_inputs,
)
from lakehouse import PortTables, Rows, batch_write, per_window, rows_of, store_of
from streams import reference_outputs, run_stream, windows_of, write_batches

MAX_RUNS = 8
BATCHES = 5
CHANGED_BATCH = 2  # the first input file with the new column
CHANGED_WINDOW = CHANGED_BATCH + 1  # its store version
NEW = "region"
# The columns rows are compared on with the model; not rid: of two equal copies in a window,
# which one is unique is the model's choice.
COLUMNS = ["id", "n", NEW]


def batch(b: int, expired: bool = True) -> pa.Table:
    """Window ``b`` of the crash stream (``faults.ordered_batch``), from ``CHANGED_BATCH`` on
    with the new column; without its expired row when ``expired`` is false."""
    table = ordered_batch(b)
    if not expired and b > 0:
        table = table.filter(pc.not_equal(table.column("id"), 3000 + b))
    if b < CHANGED_BATCH:
        return table
    return table.append_column(NEW, pa.array([f"r{b}"] * table.num_rows, pa.string()))


def widened(table: pa.Table) -> pa.Table:
    """``table`` with the new column, null where it lacks it (how old rows read)."""
    if NEW in table.column_names:
        return table
    return table.append_column(NEW, pa.nulls(table.num_rows, pa.string()))


def port_names(port: str, columns: list[str]) -> list[str]:
    """A port table's columns once the window carrying the new column is in: added at the end
    (after the error port's ``_dedup_error``)."""
    names = [c for c in columns if c != NEW]
    return [*names, "_dedup_error", NEW] if port == "error" else [*names, NEW]


# -- the kill tests ----------------------------------------------------------------------------


class SchemaJob:
    """The driver's direct engine over inputs that gain a column, with ``mergeSchema=true``."""

    def __init__(self, root: Path, output_format: str, *, expired_in_change: bool = True):
        self.root = root
        self.inputs = [batch(b, expired_in_change or b != CHANGED_BATCH) for b in range(BATCHES)]
        write_inputs(root / "in", self.inputs)
        self.tables = PortTables(output_format, root / "out")
        self.control = Control(root / "control").setup()
        self.config: dict[str, Any] = {
            "engine": "direct",
            "input": str(root / "in"),
            "output": str(root / "out"),
            "checkpoint": str(root / "chk.json"),
            "options": {**ORDERED_OPTIONS, "outputFormat": output_format, "mergeSchema": "true"},
            "table_hooks": True,
            "schema_per_file": True,
        }
        self.runs: list[DriverRun] = []
        windows = [widened(t).drop_columns(["rid"]) for t in self.inputs]
        self.expected = per_window(windows, "ordered", ["id"], "n", 10)

    def run(self) -> DriverRun:
        done = run_driver({**self.config, "attempt": len(self.runs)}, self.control, self.root)
        self.runs.append(done)
        return done

    def run_until_done(self) -> None:
        for _ in range(MAX_RUNS):
            done = self.run()
            if not done.killed:
                assert done.returncode == 0, f"{done.result}\n{done.stderr}"
                return
        raise AssertionError(f"still killed after {MAX_RUNS} runs")

    @property
    def fmt(self) -> str:
        return self.tables.fmt

    def windows(self, port: str) -> list[int]:
        """The store version of each table commit that added rows (not a schema change alone)."""
        if self.fmt == "delta":
            history = sorted(self.tables.delta(port).history(), key=lambda h: h["version"])
            return [
                int(entry["dedupsink.version"])
                for entry in history[1:]
                if int(entry["operationMetrics"]["numFiles"])
            ]
        return [
            int(s.summary["dedupsink.version"])  # type: ignore[index]
            for s in self.tables.iceberg(port).snapshots()
        ]

    def referenced_files(self, port: str) -> set[Path]:
        if self.fmt == "delta":
            uris = self.tables.delta(port).file_uris()
        else:
            uris = [t.file.file_path for t in self.tables.iceberg(port).scan().plan_files()]
        return {Path(uri.removeprefix("file://")) for uri in uris}

    def data_files(self, port: str) -> set[Path]:
        folder = self.root / "out" / port / ("data" if self.fmt == "iceberg" else "")
        return set(folder.glob("*.parquet"))

    def visible(self, port: str) -> pa.Table:
        """The port's table as its reader gives it; a table not declaring the new column shows
        only rows without it (checked by the caller), which read it as null."""
        table = self.tables.read(port)
        return widened(table)

    def rids(self) -> dict[str, list[int]]:
        return {p: sorted(self.tables.read(p).column("rid").to_pylist()) for p in PORTS}


def assert_after_kill(job: SchemaJob, version: int, showing: set[str], declaring: set[str]) -> None:
    """Right after a kill in the schema-changing window's commit: the store is at ``version``;
    the tables of ``showing`` show the window's rows, those of ``declaring`` the new column
    (once), the others neither; every data file a table names carries only columns it declares;
    no row is visible twice; each table's rows are the model's of the windows it shows."""
    manifest = store_of(job.tables.output).read()
    assert manifest is not None and manifest.version == version
    for port in PORTS:
        windows = job.windows(port)
        assert len(windows) == len(set(windows)), f"{port}: a window committed twice: {windows}"
        assert (CHANGED_WINDOW in windows) == (port in showing), (port, windows)
        declared = job.tables.read(port).schema.names
        assert declared.count(NEW) == (port in declaring), (port, declared)
        for path in job.referenced_files(port):
            carried = pq.read_schema(path).names
            assert set(carried) <= set(declared), f"{port}: {path.name} carries {carried}"
        shown: Rows = sum((job.expected[w - 1][port] for w in windows), Counter())
        assert rows_of(job.visible(port), COLUMNS) == shown, port
    everything = [rid for rids in job.rids().values() for rid in rids]
    assert len(everything) == len(set(everything)), "a row is visible twice"


def projected(rows: Rows, count: int) -> Rows:
    out: Rows = Counter()
    for row, times in rows.items():
        out[row[:count]] += times
    return out


def assert_final(job: SchemaJob, orphans: set[Path] = frozenset()) -> None:  # type: ignore[assignment]
    """Each table declares the column once, at the end, added with window 3's commit; every
    input row in exactly one table once; the reference model (old rows: null); one commit of
    rows per window with rows; nothing in a table's folder it does not name but ``orphans``."""
    assert_exactly_once(job.rids(), job.inputs)
    for port in PORTS:
        table = job.tables.read(port)
        assert table.schema.names == port_names(port, ["rid", *COLUMNS]), port
        total: Rows = sum((window[port] for window in job.expected), Counter())
        assert rows_of(table, COLUMNS) == total, port
        # Rows per commit over the columns every version has (an old version lacks region).
        commits = job.tables.commits(port, COLUMNS[:2])
        with_rows = [c for c in commits if c.rows]
        wanted = [projected(w[port], 2) for w in job.expected if w[port]]
        assert [c.rows for c in with_rows] == wanted, f"{port}: not one commit per window"
        versions = [c.version for c in commits if c.version is not None]
        assert len(versions) == len(commits), f"{port}: a commit names no store version"
        assert versions == sorted(set(versions)), f"{port}: store versions {versions}"
        referenced = job.referenced_files(port)
        assert job.data_files(port) - referenced <= orphans, port
        assert referenced <= job.data_files(port), f"{port}: files missing"
        assert_column_came_with_window(job, port)
    staging = job.root / "out" / "_staging"
    assert not staging.exists() or not [p for p in staging.rglob("*") if p.is_file()]


def assert_column_came_with_window(job: SchemaJob, port: str) -> None:
    """The table's schema changed once: Delta, one log entry after the creation carries a
    ``metaData`` action, window 3's (with its rows if the window sent the port any); Iceberg,
    one schema more than the creation's, the schema of window 3's snapshot and not of window
    2's."""
    if job.fmt == "delta":
        log = job.root / "out" / port / "_delta_log"
        entries = [
            [json.loads(line) for line in path.read_text().splitlines()]
            for path in sorted(log.glob("*.json"))
        ]
        changes = [actions for actions in entries[1:] if any("metaData" in a for a in actions)]
        assert len(changes) == 1, f"{port}: {len(changes)} schema changes"
        info = next(a["commitInfo"] for a in changes[0] if "commitInfo" in a)
        assert info["dedupsink.version"] == str(CHANGED_WINDOW), (port, info)
        txn = next(a["txn"] for a in changes[0] if "txn" in a)
        assert txn["version"] == CHANGED_WINDOW, (port, txn)
        metadata = next(a["metaData"] for a in changes[0] if "metaData" in a)
        names = [f["name"] for f in json.loads(metadata["schemaString"])["fields"]]
        assert names.count(NEW) == 1 and names[-1] == NEW, (port, names)
        return
    table = job.tables.iceberg(port)
    schemas = table.schemas()
    assert len(schemas) == 2, f"{port}: schemas {sorted(schemas)}"
    by_window = {int(s.summary["dedupsink.version"]): s for s in table.snapshots()}
    for window, snapshot in by_window.items():
        names = [f.name for f in schemas[snapshot.schema_id].fields]
        assert names.count(NEW) == (window >= CHANGED_WINDOW), (port, window, names)


# Each step: the point that kills (in the schema-changing window), the store version after the
# kill, and the ports whose tables show the window's rows and declare the new column then.
STEPS: dict[str, tuple[str, int, set[str]]] = {
    "before-the-commit-point": ("before-commit", CHANGED_BATCH, set()),
    "before-the-first-table-commit": (table_point("unique"), CHANGED_WINDOW, set()),
    "between-the-first-and-second-table-commits": (
        table_point("unique", committed=True),
        CHANGED_WINDOW,
        {"unique"},
    ),
    "after-the-last-table-commit": (
        table_point("error", committed=True),
        CHANGED_WINDOW,
        set(PORTS),
    ),
    "after-the-sink-commit": ("after-commit", CHANGED_WINDOW, set(PORTS)),
}
FAST_STEPS = (
    "before-the-commit-point",
    "between-the-first-and-second-table-commits",
    "after-the-last-table-commit",
)


def killed_in_the_change_then_restarted(tmp_path: Path, output_format: str, step: str) -> None:
    job = SchemaJob(tmp_path, output_format)
    where, version, showing = STEPS[step]
    job.control.set_points([FaultPoint(step, where, batch=CHANGED_BATCH)])
    first = job.run()
    assert first.killed, f"{first.result}\n{first.stderr}"
    assert set(job.control.fired()) == {step}
    assert_after_kill(job, version, showing, showing)
    unnamed = {f for port in PORTS for f in job.data_files(port) - job.referenced_files(port)}
    # The window's files, with the column, in the folders of the tables not showing it yet:
    # before the commit point the dead run's, left for the tables' orphan removal; after it
    # the window's own, which the restart's table commits name.
    assert {f.parent.name if job.fmt == "delta" else f.parent.parent.name for f in unnamed} == (
        set(PORTS) - showing
    ), unnamed
    assert all(f.name.startswith(f"part-{CHANGED_WINDOW:010d}-") for f in unnamed), unnamed
    assert all(NEW in pq.read_schema(f).names for f in unnamed)
    job.run_until_done()
    assert [run.killed for run in job.runs] == [True, False]
    assert_final(job, unnamed if version == CHANGED_BATCH else set())


@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
@pytest.mark.parametrize(
    "step",
    [s if s in FAST_STEPS else pytest.param(s, marks=pytest.mark.slow) for s in STEPS],
)
def test_killed_in_the_schema_changing_window_the_column_and_every_row_land_once(
    tmp_path: Path, output_format: str, step: str
) -> None:
    killed_in_the_change_then_restarted(tmp_path, output_format, step)


@pytest.mark.slow
@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
def test_killed_again_while_the_restart_redoes_the_schema_changing_publication(
    tmp_path: Path, output_format: str
) -> None:
    """Killed between unique's and duplicate's table commits of the schema-changing window,
    then in the restart's redo right after duplicate's: a third run finishes it."""
    job = SchemaJob(tmp_path, output_format)
    job.control.set_points(
        [
            FaultPoint("first", table_point("unique", committed=True), batch=CHANGED_BATCH),
            FaultPoint(
                "redo",
                table_point("duplicate", committed=True),
                batch=CHANGED_BATCH,
                after="first",
            ),
        ]
    )
    assert job.run().killed
    assert_after_kill(job, CHANGED_WINDOW, {"unique"}, {"unique"})
    assert job.run().killed
    assert_after_kill(job, CHANGED_WINDOW, {"unique", "duplicate"}, {"unique", "duplicate"})
    job.run_until_done()
    assert set(job.control.fired()) == {"first", "redo"}
    assert [run.killed for run in job.runs] == [True, True, False]
    assert_final(job)


@pytest.mark.slow
@pytest.mark.parametrize("committed", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
def test_killed_at_the_schema_change_alone_of_a_port_without_rows(
    tmp_path: Path, output_format: str, committed: bool
) -> None:
    """The schema-changing window sends the expired port no rows: its table takes the column
    in a change of its own (Delta: a log entry with the ``metaData`` and the window's
    transaction, no file; Iceberg: a schema change, no snapshot). Killed right before or after
    it, then restarted: the column once in every table, every row once."""
    job = SchemaJob(tmp_path, output_format, expired_in_change=False)
    assert not job.expected[CHANGED_BATCH]["expired"]
    step = "expired-schema"
    where = table_point("expired", committed=committed)
    job.control.set_points([FaultPoint(step, where, batch=CHANGED_BATCH)])
    assert job.run().killed
    assert set(job.control.fired()) == {step}
    showing = {"unique", "duplicate"}
    assert_after_kill(job, CHANGED_WINDOW, showing, showing | ({"expired"} if committed else set()))
    job.run_until_done()
    assert [run.killed for run in job.runs] == [True, False]
    assert_final(job)


# -- Spark reads the evolved ports -------------------------------------------------------------

SPARK_OPTIONS = {
    "keys": "id",
    "expiryKey": "n",
    "expiryPeriod": "10",
    "ownerTimeout": "1 second",  # the next query need not wait for the one before's lease
}
NARROW_DDL = "rid BIGINT, id BIGINT, n BIGINT"
WIDE_DDL = f"{NARROW_DDL}, {NEW} STRING"
FORMATS = ("parquet", "delta", "iceberg")


def sink_options(fmt: str, output: Path) -> dict[str, str]:
    if fmt == "parquet":
        return {"path": str(output), **SPARK_OPTIONS}
    return {**PortTables(fmt, output).sink_options(), **SPARK_OPTIONS}


def spark_port(spark: Any, fmt: str, output: Path, port: str) -> Any:
    """A port as a Spark DataFrame: the Parquet folder through Spark's reader, merging its
    files' schemas; a Delta table read by delta-rs, an Iceberg table by pyiceberg (Spark has no
    reader of either here), handed to Spark as Arrow."""
    if fmt == "parquet":
        return spark.read.option("mergeSchema", "true").parquet(str(output / port))
    return spark.createDataFrame(PortTables(fmt, output).read(port))


def assert_spark_reads(spark: Any, fmt: str, output: Path, windows: list[pa.Table]) -> None:
    """Spark's view of every port: the new column once, a string, and the rows of the
    reference model over the windows, old rows with the column null."""
    expected = reference_outputs(
        [widened(w).select(COLUMNS) for w in windows], "ordered", ["id"], "n", 10
    )
    for port in PORTS:
        frame = spark_port(spark, fmt, output, port)
        assert frame.columns.count(NEW) == 1, (port, frame.columns)
        assert dict(frame.dtypes)[NEW] == "string", (port, frame.dtypes)
        if port == "error":
            assert "_dedup_error" in frame.columns, frame.columns
        rows = Counter(tuple(row) for row in frame.select(*COLUMNS).collect())
        assert rows == expected[port], port
    assert sum(len(w) for w in windows) == sum(
        spark_port(spark, fmt, output, port).count() for port in PORTS
    )


@pytest.mark.spark
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_second_query_with_the_wider_schema_evolves_the_ports_spark_reads(
    spark: Any, workdir: Path, fmt: str
) -> None:
    """A stream over files without the column (no option); then files with it arrive, and the
    query restarts from its checkpoint with the wider schema and ``mergeSchema=true``: only the
    new files are read (a narrow one among them reads the column as null). Two files a window.
    Spark reads every port as the reference model gives it."""
    source, checkpoint, output = workdir / "in", workdir / "chk", workdir / "out"
    inputs = [batch(b) for b in range(4)]
    inputs[3] = inputs[3].drop_columns([NEW])  # a producer not yet sending the column
    sink = sink_options(fmt, output)
    write_batches(source, inputs[:2])
    run_stream(spark, source, output, sink, checkpoint, schema=NARROW_DDL, files_per_batch=2)
    write_batches(source, inputs[2:], start=2)
    merging = {**sink, "mergeSchema": "true"}
    run_stream(spark, source, output, merging, checkpoint, schema=WIDE_DDL, files_per_batch=2)
    manifest = store_of(output).read()
    assert manifest is not None and manifest.version == 2  # one window a query: no file twice
    windows = windows_of([widened(t) for t in inputs], 2)
    assert_spark_reads(spark, fmt, output, windows)


@pytest.mark.slow  # the regular suite's budget: CI runs it with `make test-slow`
@pytest.mark.spark
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_write_with_merge_schema_adds_the_column_after_a_narrow_stream(
    spark: Any, workdir: Path, fmt: str
) -> None:
    """``df.write.format("dedup").mode("append")`` with ``mergeSchema=true`` of rows carrying
    the column, after a stream without it: the ports gain the column; Spark reads the model."""
    source, output = workdir / "in", workdir / "out"
    inputs = [batch(b) for b in range(2)]
    sink = sink_options(fmt, output)
    write_batches(source, inputs)
    run_stream(spark, source, output, sink, workdir / "chk", schema=NARROW_DDL, files_per_batch=2)
    backfill = batch(CHANGED_BATCH)
    batch_write(spark, backfill, workdir / "batches", {**sink, "mergeSchema": "true"})
    windows = [*windows_of(inputs, 2), backfill]
    if fmt != "parquet":
        tables = PortTables(fmt, output)
        for port in PORTS:
            names = tables.read(port).schema.names
            assert names == port_names(port, ["rid", *COLUMNS]), (port, names)
    assert_spark_reads(spark, fmt, output, windows)
