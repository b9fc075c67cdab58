"""Process faults in the publication of table ports (``outputFormat`` delta and iceberg).

After the store's commit point, a window becomes readable by one table commit per port with rows
(a Delta commit carrying an application transaction, an Iceberg snapshot whose summary names the
store version), in the order unique, duplicate, expired, error. The driver is SIGKILLed (its
whole process group) at each step of that publication, then restarted from its checkpoint:

* (a) right after the commit point (manifest created), before any table commit;
* (b) between two ports' table commits (unique's made, duplicate's not);
* (c) after the last table commit, before the staging folder is discarded;

and once more while the restart redoes an interrupted publication. delta-rs and pyiceberg write
their commits past fsspec, so the kills strike at points of test subclasses of the port formats
(``table_hooks``, ``tests/faults.py``), on either side of each port's ``_commit``.

Right after each kill the test reads the store and every table with its own reader and checks
which tables show the window; after the restart: every input row in exactly one table exactly
once, the tables equal to the reference model, each table's history holding exactly one
commit (Delta) or snapshot (Iceberg) per window with rows for it, and no data file in a table's
folder that its table does not name. The direct engine of ``tests/reliability_driver.py`` runs
the sink's own code without Spark's transport; one scenario runs a real Spark stream.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from faults import (
    ORDERED_OPTIONS,
    PORTS,
    ROW_SCHEMA_DDL,
    Control,
    DriverRun,
    FaultPoint,
    assert_exactly_once,
    fault_url,
    ordered_batch,
    run_driver,
    table_point,
    write_inputs,
)
from streams import reference_outputs

from dedupsink.store.store import BucketStore

MAX_RUNS = 8
BATCHES = 5
KILLED_BATCH = 2  # window 3 of the store (version = batch + 1): rows in every port
# The embedded SQL catalog keeps its tables under the catalog's name (its ``catalog_name``
# column): a reader must load it under the name the sink uses.
ICEBERG_CATALOG_NAME = "dedupsink"

# Each step: the point that kills, and the ports whose tables show the window after the kill.
STEPS: dict[str, tuple[str, set[str]]] = {
    "a-after-commit-point": (table_point("unique"), set()),
    "b-between-ports": (table_point("unique", committed=True), {"unique"}),
    "c-before-cleanup": (table_point("error", committed=True), set(PORTS)),
}


class TableJob:
    """Ordered-mode windows into table ports, run and re-run by the driver script."""

    def __init__(self, root: Path, output_format: str, *, engine: str = "direct", **config: Any):
        self.root = root
        self.format = output_format
        self.inputs = [ordered_batch(b) for b in range(BATCHES)]
        self.output = root / "out"
        self.control = Control(root / "control").setup()
        write_inputs(root / "in", self.inputs)
        # Delta on the counting test filesystem (delta-rs is handed the plain local path);
        # Iceberg on a plain local path, where the embedded SQLite catalog serves with no
        # option (on ``dedupfault://`` the sink asks for a catalog).
        output = fault_url(self.output) if output_format == "delta" else str(self.output)
        self.config: dict[str, Any] = {
            "engine": engine,
            "input": str(root / "in"),
            "output": output,
            "checkpoint": str(root / ("chk" if engine == "spark" else "chk.json")),
            "options": {**ORDERED_OPTIONS, "outputFormat": output_format},
            "schema": ROW_SCHEMA_DDL,
            "table_hooks": True,
            **config,
        }
        self.runs: list[DriverRun] = []

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

    # -- the tables, through their own readers -------------------------------------------------

    def read(self, port: str) -> pa.Table:
        if self.format == "delta":
            from deltalake import DeltaTable

            return DeltaTable(str(self.output / port)).to_pyarrow_table()
        return self._iceberg(port).scan().to_arrow()

    def windows(self, port: str) -> list[int]:
        """The store version of each table commit (Delta) or snapshot (Iceberg) with rows."""
        if self.format == "delta":
            from deltalake import DeltaTable

            history = sorted(
                DeltaTable(str(self.output / port)).history(), key=lambda h: h["version"]
            )
            assert history[0]["operation"] == "CREATE TABLE", history[0]
            for entry in history[1:]:
                assert entry["operation"] == "WRITE" and "dedupsink.version" in entry, entry
            return [int(entry["dedupsink.version"]) for entry in history[1:]]
        snapshots = self._iceberg(port).snapshots()
        for snapshot in snapshots:
            assert snapshot.summary is not None and "dedupsink.version" in snapshot.summary
        return [int(s.summary["dedupsink.version"]) for s in snapshots]  # type: ignore[index]

    def referenced_files(self, port: str) -> set[Path]:
        if self.format == "delta":
            from deltalake import DeltaTable

            uris = DeltaTable(str(self.output / port)).file_uris()
            return {Path(uri.removeprefix("file://")) for uri in uris}
        tasks = self._iceberg(port).scan().plan_files()
        return {Path(task.file.file_path.removeprefix("file://")) for task in tasks}

    def data_files(self, port: str) -> set[Path]:
        folder = self.output / port / ("data" if self.format == "iceberg" else "")
        return set(folder.glob("*.parquet"))

    def _iceberg(self, port: str) -> Any:
        from pyiceberg.catalog import load_catalog

        root = self.output
        catalog = load_catalog(
            ICEBERG_CATALOG_NAME,
            type="sql",
            uri=f"sqlite:///{root}/_iceberg_catalog.db",
            warehouse=f"file://{root}",
        )
        return catalog.load_table(("dedup", f"{root.name}_{port}"))

    def rows_by_port(self) -> dict[str, list[int]]:
        return {port: sorted(self.read(port).column("rid").to_pylist()) for port in PORTS}


def assert_after_kill(job: TableJob, batch: int, showing: set[str]) -> None:
    """Right after a kill in the publication of ``batch``: the store committed its window, the
    tables of ``showing`` show it (once), the others do not; no row is visible twice."""
    manifest = BucketStore(str(job.output / "_store")).read()
    assert manifest is not None and manifest.version == batch + 1
    window = manifest.version
    for port in PORTS:
        windows = job.windows(port)
        assert len(windows) == len(set(windows)), f"{port}: a window committed twice: {windows}"
        assert (window in windows) == (port in showing), (port, windows)
        assert set(range(2, window)) <= set(windows), (port, windows)  # window 1: no expired
    everything = [rid for rids in job.rows_by_port().values() for rid in rids]
    assert len(everything) == len(set(everything)), "a row is visible twice"


def assert_final_tables(job: TableJob, orphans: set[Path] = frozenset()) -> None:  # type: ignore[assignment]
    """Every input row in exactly one table exactly once; the reference model; one table
    commit per window with rows per port; nothing in a table's folder that it does not name
    but ``orphans``."""
    by_port = job.rows_by_port()
    assert_exactly_once(by_port, job.inputs)
    for port in PORTS:
        rids = set(by_port[port])
        expected = [
            batch + 1
            for batch, table in enumerate(job.inputs)
            if rids & set(table.column("rid").to_pylist())
        ]
        assert sorted(job.windows(port)) == expected, f"{port}: {job.windows(port)}"
        unreferenced = job.data_files(port) - job.referenced_files(port)
        assert unreferenced <= orphans, f"{port}: unreferenced files {unreferenced}"
        assert job.referenced_files(port) <= job.data_files(port), f"{port}: files missing"
    windows = [table.drop_columns(["rid"]) for table in job.inputs]
    reference = reference_outputs(windows, "ordered", ["id"], "n", 10)
    actual = {
        port: Counter(
            tuple(row)
            for row in zip(*job.read(port).select(["id", "n"]).to_pydict().values(), strict=True)
        )
        for port in PORTS
    }
    assert actual == dict(reference)
    staging = job.output / "_staging"
    assert not staging.exists() or not [p for p in staging.rglob("*") if p.is_file()]


def kill_once_then_restart(job: TableJob, step: str) -> None:
    """Kill the job at ``step`` of its third window, check what the tables show then, restart
    it to the end and check the tables."""
    where, showing = STEPS[step]
    job.control.set_points([FaultPoint(step, where, batch=KILLED_BATCH)])
    first = job.run()
    assert first.killed, f"{first.result}\n{first.stderr}"
    assert set(job.control.fired()) == {step}
    assert_after_kill(job, KILLED_BATCH, showing)
    job.run_until_done()
    assert [run.killed for run in job.runs] == [True, False]
    assert_final_tables(job)


@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_driver_killed_in_table_publication_restarts_exactly_once(
    tmp_path: Path, output_format: str, step: str
) -> None:
    kill_once_then_restart(TableJob(tmp_path, output_format), step)


@pytest.mark.parametrize(
    "output_format",
    ["delta", pytest.param("iceberg", marks=pytest.mark.slow)],  # 3 runs: ~10 s
)
def test_driver_killed_again_while_the_restart_redoes_the_publication(
    tmp_path: Path, output_format: str
) -> None:
    """Killed between unique's and duplicate's table commits, then again in the restart's redo
    of that publication, right after duplicate's: a third run finishes it."""
    job = TableJob(tmp_path, output_format)
    job.control.set_points(
        [
            FaultPoint("first", table_point("unique", committed=True), batch=KILLED_BATCH),
            FaultPoint(
                "redo", table_point("duplicate", committed=True), batch=KILLED_BATCH, after="first"
            ),
        ]
    )
    assert job.run().killed
    assert_after_kill(job, KILLED_BATCH, {"unique"})
    assert job.run().killed
    assert_after_kill(job, KILLED_BATCH, {"unique", "duplicate"})
    job.run_until_done()
    assert set(job.control.fired()) == {"first", "redo"}
    assert [run.killed for run in job.runs] == [True, True, False]
    assert_final_tables(job)


@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
def test_driver_killed_before_the_commit_point_leaves_only_orphans_for_vacuum(
    tmp_path: Path, output_format: str
) -> None:
    """Killed after the tasks, before the commit: the tasks' port files sit in the tables'
    folders, named by no table commit (invisible to table readers). The restart re-runs the
    batch with files of its own; the dead run's files stay, left to the table's own orphan
    removal (docs/ARCHITECTURE.md, step 6), which for Delta is ``VACUUM`` with ``full``."""
    job = TableJob(tmp_path, output_format)
    job.control.set_points([FaultPoint("before", "before-commit", batch=KILLED_BATCH)])
    assert job.run().killed
    manifest = BucketStore(str(job.output / "_store")).read()
    assert manifest is not None and manifest.version == KILLED_BATCH  # window 3 not committed
    for port in PORTS:
        assert KILLED_BATCH + 1 not in job.windows(port)
    orphans = {f for port in PORTS for f in job.data_files(port) - job.referenced_files(port)}
    assert len(orphans) == len(PORTS), orphans  # one partition: a file per port
    assert all(f.name.startswith(f"part-{KILLED_BATCH + 1:010d}-") for f in orphans)
    job.run_until_done()
    assert_final_tables(job, orphans)
    if output_format == "delta":
        from deltalake import DeltaTable

        before = job.rows_by_port()
        for port in PORTS:
            DeltaTable(str(job.output / port)).vacuum(
                retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
            )
        assert not any(f.exists() for f in orphans)
        assert job.rows_by_port() == before
        for port in PORTS:
            assert job.data_files(port) == job.referenced_files(port), port


@pytest.mark.spark
@pytest.mark.slow
def test_spark_driver_killed_between_delta_port_commits_restarts_exactly_once(
    tmp_path: Path,
) -> None:
    """A real Structured Streaming query into Delta ports: the driver's process group is killed
    between unique's and duplicate's Delta commits; restarted from Spark's checkpoint, the query
    finishes the publication and discards its re-run of the batch."""
    kill_once_then_restart(TableJob(tmp_path, "delta", engine="spark"), "b-between-ports")


def test_embedded_iceberg_catalog_reads_back_as_the_readme_shows(tmp_path: Path) -> None:
    """The catalog name README's snippet gives ``load_catalog`` finds the port tables."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    named = re.search(r'load_catalog\("([^"]+)", type="sql"', readme)
    assert named is not None, "README has no load_catalog(..., type='sql') snippet"
    job = TableJob(tmp_path, "iceberg")
    job.run_until_done()
    from pyiceberg.catalog import load_catalog

    root = job.output
    catalog = load_catalog(
        named.group(1),
        type="sql",
        uri=f"sqlite:///{root}/_iceberg_catalog.db",
        warehouse=f"file://{root}",
    )
    assert catalog.load_table(f"dedup.{root.name}_unique").scan().to_arrow().num_rows > 0
