"""Iceberg ports in the catalogs teams run: AWS Glue's and pyiceberg's SQL catalog on PostgreSQL.

The store and the tables' files are on moto's S3 server; the tables are in

* ``glue``: pyiceberg's Glue catalog against moto's Glue API, served by the same moto server
  (``glue.endpoint`` is the S3 endpoint: moto answers every AWS service on one port);
* ``postgres``: pyiceberg's SQL catalog in a real PostgreSQL (``tests/postgres.py``, Debian's
  server started for the session; skipped, naming the package, where it is not installed), its
  URI carrying a password that trust authentication ignores, so that its masking is seen.

For each catalog:

* windows through the sink (in this process, two partitions, a restart half-way) leave tables
  equal to the reference model, one snapshot per window with rows (``lakehouse.check_tables``),
  read back by pyiceberg through a catalog loaded independently with the same properties;
* the catalog as the sink shows it (``catalog_info``: what ``dedupsink run``'s summary prints,
  and the ``catalog`` of ``inspect --json`` for the embedded catalog) names its type, URI,
  warehouse and name with every secret masked, and the ``load_catalog`` call it prints opens the
  tables (moto and trust authentication take the masked secrets);
* the kill loop of ``test_reliability_tables.py``: the direct engine of
  ``reliability_driver.py`` SIGKILLed right after the store's commit point, between two ports'
  snapshots and after the last one (all three slow), then restarted: every
  input row in exactly one table exactly once, the reference model, one snapshot per window
  with rows per port.

A PostgreSQL catalog nothing answers at is refused at the query's start, its password masked.
A real Spark stream into each catalog is slow (Spark's planner process loads the catalog too).

Not covered: moto's Glue API takes an ``UpdateTable`` whatever its ``VersionId`` (AWS Glue
refuses a stale one with ``ConcurrentModificationException``, which pyiceberg's Glue catalog
turns into a failed commit), so two publishers racing for one Glue table are not tested here.
"""

from __future__ import annotations

import dataclasses
import json
import time
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
    ordered_batch,
    run_driver,
    table_point,
    write_inputs,
)
from lakehouse import CATALOG_NAME, PortTables, check_tables, per_window, store_of
from servers import S3Server, free_port
from streams import output_listing, reference_outputs, run_stream, write_batches

from dedupsink.cli.inspect import catalog_lines
from dedupsink.errors import DedupOptionError
from dedupsink.masking import MASK
from dedupsink.sink.local import LocalSink
from dedupsink.sink.plan import plan_for

CATALOGS = ("glue", "postgres")
# Trust authentication lets anyone in: the password in the URI is never checked, only masked.
PASSWORD = "pg-password-42"
SECRETS = ("test-key", "test-secret", PASSWORD)


@dataclasses.dataclass
class CatalogTables(PortTables):
    """Iceberg port tables on S3 in a catalog of the test's, read through pyiceberg's catalog
    loaded with the same properties the sink is given (``properties``, without the
    ``iceberg.catalog.`` prefix), plus the file access to moto's S3."""

    properties: dict[str, str] = dataclasses.field(default_factory=dict)

    def sink_options(self) -> dict[str, str]:
        given = {f"iceberg.catalog.{name}": value for name, value in self.properties.items()}
        where = {"path": self.remote.url, **self.remote.sink_options}
        return {**where, "outputFormat": "iceberg", **given}

    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            storage = self.remote.storage_options
            self._catalog = load_catalog(
                CATALOG_NAME,
                **self.properties,
                **{
                    "s3.endpoint": storage["endpoint_url"],
                    "s3.access-key-id": storage["key"],
                    "s3.secret-access-key": storage["secret"],
                    "s3.region": "us-east-1",
                },
            )
        return self._catalog


def glue_properties(s3: S3Server) -> dict[str, str]:
    """AWS Glue's catalog as moto serves it, on the S3 server's port."""
    return {
        "type": "glue",
        "glue.endpoint": s3.endpoint_url,
        "glue.region": "us-east-1",
        "glue.access-key-id": "test-key",
        "glue.secret-access-key": "test-secret",
        "warehouse": f"s3://{s3.bucket}/warehouse",
    }


def postgres_properties(s3: S3Server, url: str) -> dict[str, str]:
    """pyiceberg's SQL catalog in the session's PostgreSQL, a password in its URI."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return {
        "type": "sql",
        "uri": f"{scheme}://{user}:{PASSWORD}@{host}",
        "warehouse": f"s3://{s3.bucket}/warehouse",
    }


@pytest.fixture(params=CATALOGS)
def tables(request: pytest.FixtureRequest, s3: S3Server) -> CatalogTables:
    """A fresh output on the S3 server, its port tables in the parametrized catalog."""
    if request.param == "glue":
        properties = glue_properties(s3)
    else:
        properties = postgres_properties(s3, request.getfixturevalue("postgres"))
    return CatalogTables("iceberg", s3.remote(request.param), properties=properties)


# -- windows through the sink ----------------------------------------------------------------

ORDERED = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10"}
COLUMNS = ["id", "seq", "body"]


def ordered_windows() -> list[pa.Table]:
    """Rows for every port from the second window on; a copy is the same row as its original
    (the body a function of the key), so the ports' rows do not depend on the partitions."""

    def window(ids: list[int | None], seqs: list[int | None]) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "seq": pa.array(seqs, pa.int64()),
                "body": [f"event {i}" for i in ids],
            }
        )

    return [
        window([1, 2, 2, 3], [10, 11, 11, 12]),
        window([4, 1, 5, None], [15, 10, 16, 17]),
        window([6, 2, 7, 7], [20, 11, 22, 22]),
        window([8, 3, 9, 10], [25, 12, 26, None]),
    ]


def test_windows_and_a_restart_leave_the_catalogs_tables_equal_to_the_reference(
    tables: CatalogTables,
) -> None:
    windows = ordered_windows()
    options = {**tables.sink_options(), **ORDERED}
    first = LocalSink(options, windows[0].schema)
    for batch_id, window in enumerate(windows[:2]):
        first.window(batch_id, window, partitions=2)
    check_tables(tables, per_window(windows[:2], "ordered", ["id"], "seq", 10), COLUMNS)

    restarted = LocalSink(options, windows[0].schema)  # a new run of the query
    for batch_id, window in enumerate(windows[2:], start=2):
        restarted.window(batch_id, window, partitions=2)
    check_tables(tables, per_window(windows, "ordered", ["id"], "seq", 10), COLUMNS)
    assert set(tables.catalog().list_tables("dedup")) >= {tables.identifier(p) for p in PORTS}
    staged = [name for name in output_listing(tables.output) if name.startswith("_staging/")]
    assert not staged, staged


def test_the_catalog_is_shown_with_secrets_masked_and_its_load_call_opens_the_tables(
    tables: CatalogTables,
) -> None:
    """The catalog as the running sink shows it (``run``'s summary prints these lines)."""
    windows = ordered_windows()[:2]
    sink = LocalSink({**tables.sink_options(), **ORDERED}, windows[0].schema)
    for batch_id, window in enumerate(windows):
        sink.window(batch_id, window, partitions=2)
    catalog = sink.plan.ports.catalog_info()
    assert catalog is not None

    shown = catalog.to_dict()
    text = json.dumps(shown) + "\n".join(catalog_lines(catalog))
    assert not [secret for secret in SECRETS if secret in text], text
    assert shown["name"] == CATALOG_NAME
    assert shown["type"] == tables.properties["type"]
    assert shown["warehouse"] == tables.properties["warehouse"]
    assert shown["tables"]["unique"] == ".".join(tables.identifier("unique"))
    properties = shown["properties"]
    if shown["type"] == "glue":
        assert shown["uri"] is None
        assert properties["glue.endpoint"] == tables.properties["glue.endpoint"]
        assert properties["glue.region"] == "us-east-1"
        assert properties["glue.access-key-id"] == properties["glue.secret-access-key"] == MASK
    else:
        assert shown["uri"] == tables.properties["uri"].replace(PASSWORD, MASK)
    assert properties["s3.secret-access-key"] == properties["s3.access-key-id"] == MASK
    assert catalog_lines(catalog)[0].startswith(f"catalog     {shown['type']} catalog 'dedupsink'")

    from pyiceberg.catalog import load_catalog

    opened = eval(catalog.load_call(), {"load_catalog": load_catalog})  # as a reader pastes it
    for port in PORTS:
        table = opened.load_table(catalog.tables[port])
        assert table.scan().to_arrow().equals(tables.read(port)), port


def test_inspect_told_the_catalog_shows_it_and_the_tables(
    tables: CatalogTables, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dedupsink inspect --catalog PROPERTY=VALUE``, as the sink's ``iceberg.catalog.*``
    options: the catalog with its secrets masked, and each port table in it."""
    from dedupsink.cli.main import main

    windows = ordered_windows()[:2]
    options = tables.sink_options()
    sink = LocalSink({**options, **ORDERED}, windows[0].schema)
    for batch_id, window in enumerate(windows):
        sink.window(batch_id, window, partitions=2)
    arguments = ["inspect", "--json", options["path"]]
    for name, value in options.items():
        for prefix, flag in (("fs.", "--fs"), ("iceberg.catalog.", "--catalog")):
            if name.startswith(prefix):
                arguments += [flag, f"{name[len(prefix) :]}={value}"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    assert not [secret for secret in SECRETS if secret in printed], printed
    shown = json.loads(printed)
    assert shown["catalog"]["type"] == tables.properties["type"]
    assert shown["catalog"]["tables"]["unique"] == ".".join(tables.identifier("unique"))


def test_an_unreachable_postgres_catalog_is_refused_at_once_with_its_password_masked(
    tmp_path: Path,
) -> None:
    """Nothing listens at the URI's port: the query is refused at its start, within seconds,
    naming the URI with its password masked, before any output."""
    uri = f"postgresql+psycopg2://dedup:{PASSWORD}@127.0.0.1:{free_port()}/lake"
    out = tmp_path / "out"
    catalog = {"iceberg.catalog.type": "sql", "iceberg.catalog.uri": uri}
    options = {"path": str(out), "keys": "id", "outputFormat": "iceberg", **catalog}
    started = time.monotonic()
    with pytest.raises(DedupOptionError) as caught:
        plan_for(options, pa.schema([("id", pa.int64())]), "run-1")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert PASSWORD not in message, message
    assert uri.replace(PASSWORD, MASK) in message and "iceberg.catalog." in message, message
    assert not (out / "_store").exists()


# -- the kill loop -------------------------------------------------------------------------------

BATCHES = 5
KILLED_BATCH = 2  # window 3 of the store (version = batch + 1): rows in every port
MAX_RUNS = 8
# Each step: the point that kills, and the ports whose tables show the window after the kill.
STEPS: dict[str, tuple[str, set[str]]] = {
    "a-after-commit-point": (table_point("unique"), set()),
    "b-between-ports": (table_point("unique", committed=True), {"unique"}),
    "c-before-cleanup": (table_point("error", committed=True), set(PORTS)),
}


class CatalogJob:
    """Ordered-mode windows into Iceberg ports on S3 in ``tables``' catalog, run and re-run by
    the driver script's direct engine with a fault point on each side of each port's snapshot."""

    def __init__(self, root: Path, tables: CatalogTables) -> None:
        self.root = root
        self.tables = tables
        self.inputs = [ordered_batch(b) for b in range(BATCHES)]
        self.control = Control(root / "control").setup()
        write_inputs(root / "in", self.inputs)
        options = tables.sink_options()
        self.config: dict[str, Any] = {
            "engine": "direct",
            "input": str(root / "in"),
            "output": options.pop("path"),
            "checkpoint": str(root / "chk.json"),
            "options": {**ORDERED_OPTIONS, **options},
            "schema": ROW_SCHEMA_DDL,
            "table_hooks": True,
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

    def windows(self, port: str) -> list[int]:
        """The store version each snapshot of the port's table records."""
        snapshots = self.tables.iceberg(port).snapshots()
        for snapshot in snapshots:
            assert snapshot.summary is not None and "dedupsink.version" in snapshot.summary
        return [int(s.summary["dedupsink.version"]) for s in snapshots]  # type: ignore[index]

    def rows_by_port(self) -> dict[str, list[int]]:
        return {port: sorted(self.tables.read(port).column("rid").to_pylist()) for port in PORTS}


def assert_after_kill(job: CatalogJob, showing: set[str]) -> None:
    """Right after a kill in the publication of the killed batch: the store committed its
    window, the tables of ``showing`` show it once, the others not; no row visible twice."""
    manifest = store_of(job.tables.output).read()
    assert manifest is not None and manifest.version == KILLED_BATCH + 1
    window = manifest.version
    for port in PORTS:
        windows = job.windows(port)
        assert len(windows) == len(set(windows)), f"{port}: a window committed twice: {windows}"
        assert (window in windows) == (port in showing), (port, windows)
    everything = [rid for rids in job.rows_by_port().values() for rid in rids]
    assert len(everything) == len(set(everything)), "a row is visible twice"


def assert_final_tables(job: CatalogJob) -> None:
    """Every input row in exactly one table exactly once; the reference model; one snapshot
    per window with rows per port; every data file in a table's folder named by its table."""
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
        assert job.tables.folder_files(port) == job.tables.table_files(port), port
    windows = [table.drop_columns(["rid"]) for table in job.inputs]
    reference = reference_outputs(windows, "ordered", ["id"], "n", 10)
    actual = {
        port: Counter((row["id"], row["n"]) for row in job.tables.read(port).to_pylist())
        for port in PORTS
    }
    assert actual == dict(reference)
    staged = [name for name in output_listing(job.tables.output) if name.startswith("_staging/")]
    assert not staged, staged


def kill_once_then_restart(job: CatalogJob, step: str) -> None:
    where, showing = STEPS[step]
    job.control.set_points([FaultPoint(step, where, batch=KILLED_BATCH)])
    first = job.run()
    assert first.killed, f"{first.result}\n{first.stderr}"
    assert set(job.control.fired()) == {step}
    assert_after_kill(job, showing)
    job.run_until_done()
    assert [run.killed for run in job.runs] == [True, False]
    assert_final_tables(job)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param("a-after-commit-point", marks=pytest.mark.slow),
        pytest.param("b-between-ports", marks=pytest.mark.slow),
        pytest.param("c-before-cleanup", marks=pytest.mark.slow),
    ],
)
def test_driver_killed_in_the_publication_to_the_catalog_restarts_exactly_once(
    tmp_path: Path, tables: CatalogTables, step: str
) -> None:
    kill_once_then_restart(CatalogJob(tmp_path, tables), step)


# -- a real Spark stream -------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_a_stream_restarted_from_its_checkpoint_commits_each_window_once(
    spark: Any, workdir: Path, tables: CatalogTables
) -> None:
    """Spark's planner process checks and creates the tables in the catalog, its driver commits
    them: two runs of one stream through one checkpoint."""
    windows = ordered_windows()
    source, checkpoint = workdir / "in", workdir / "chk"
    sink = {**tables.sink_options(), **ORDERED}
    write_batches(source, windows[:2])
    run_stream(spark, source, tables.output, sink, checkpoint, repartition=2)
    write_batches(source, windows[2:], start=2)
    run_stream(spark, source, tables.output, sink, checkpoint, repartition=2)
    check_tables(tables, per_window(windows, "ordered", ["id"], "seq", 10), COLUMNS)
