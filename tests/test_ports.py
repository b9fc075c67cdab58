"""The port formats without Spark: each format's ports, through the sink's own tasks and commit
(``LocalSink``), read back with the format's own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from servers import Azurite, Remote, S3Server, azurite_installed

from dedupsink.sink.local import LocalSink
from dedupsink.store.store import BucketStore

SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])


def rows(ids: list[int], second: int) -> pa.Table:
    stamps = pa.array([second * 1_000_000] * len(ids), pa.timestamp("us", tz="UTC"))
    return pa.table({"id": ids, "ts": stamps}, schema=SCHEMA)


def options(url: str, output_format: str, **extra: str) -> dict[str, str]:
    return {
        "path": url,
        "keys": "id",
        "expiryKey": "ts",
        "expiryPeriod": "1 hour",
        "outputFormat": output_format,
        **extra,
    }


def delta_ids(url: str, port: str, storage_options: dict[str, str] | None = None) -> list[int]:
    from deltalake import DeltaTable

    table = DeltaTable(f"{url}/{port}", storage_options=storage_options)
    return sorted(table.to_pyarrow_table().column("id").to_pylist())


def delta_s3_options(remote: Remote) -> dict[str, str]:
    so: dict[str, Any] = remote.storage_options
    return {
        "AWS_ENDPOINT_URL": so["endpoint_url"],
        "AWS_ACCESS_KEY_ID": so["key"],
        "AWS_SECRET_ACCESS_KEY": so["secret"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def test_a_partition_that_found_no_key_new_is_settled_with_on_s3(s3: S3Server) -> None:
    """A task whose rows were all remembered stages an empty keys file; the other partitions
    of the window skip it (S3 refuses a ranged read of an empty object)."""
    remote = s3.remote("empty-keys")
    sink = LocalSink({**options(remote.url, "parquet"), **remote.sink_options}, SCHEMA)
    sink.window(0, rows([1, 2], 1000), partitions=1)
    report = sink.window(1, rows([1, 3], 1000), partitions=2)  # partition 0 gets only key 1
    assert report is not None
    assert (report.counts.unique, report.counts.duplicate) == (1, 1)


def test_delta_ports_on_s3_take_the_sinks_fs_options(s3: S3Server) -> None:
    remote = s3.remote("delta")
    sink = LocalSink({**options(remote.url, "delta"), **remote.sink_options}, SCHEMA)
    sink.window(0, rows([1, 2, 2], 1000), partitions=2)
    sink.window(1, rows([2, 3], 1000), partitions=2)
    so = delta_s3_options(remote)
    assert delta_ids(remote.url, "unique", so) == [1, 2, 3]
    assert delta_ids(remote.url, "duplicate", so) == [2, 2]
    store_id = BucketStore(f"{remote.url}/_store", remote.storage_options).read()
    assert store_id is not None
    described = sink.plan.ports.describe("unique", store_id.store_id)
    assert described["published_version"] == 2


def test_a_redone_delta_publication_adds_nothing(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    url = str(tmp_path / "out")
    sink = LocalSink(options(url, "delta"), SCHEMA)
    sink.window(0, rows([1, 2], 1000))
    manifest = sink.plan.store.read()
    assert manifest is not None and manifest.publication is not None
    ports = sink.plan.ports
    ports.publish(manifest.publication, manifest.store_id)  # as after a crash, twice
    ports.publish(manifest.publication, manifest.store_id)
    assert ports.is_published(manifest.publication, manifest.store_id)
    assert delta_ids(url, "unique") == [1, 2]
    writes = [h for h in DeltaTable(f"{url}/unique").history() if h["operation"] == "WRITE"]
    assert len(writes) == 1


@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
def test_a_table_port_rerun_after_its_commit_deletes_none_of_the_published_files(
    tmp_path: Path, output_format: str
) -> None:
    """Files a table format published in place are the tasks' staged files: discarding a
    re-run's staging must not delete them."""
    url = str(tmp_path / "orders")
    sink = LocalSink(options(url, output_format), SCHEMA)
    summaries = sink.tasks(0, rows([1, 2, 3], 1000), partitions=2)
    sink.commit(0, summaries)
    again = sink.commit(0, summaries)  # the same commit again: an attempt that passed its point
    assert again is not None and again.already_committed
    if output_format == "delta":
        assert delta_ids(url, "unique") == [1, 2, 3]
    else:
        table = sink.plan.ports._table("unique")
        assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]


def test_delta_commits_on_s3_are_conditional_puts(s3: S3Server) -> None:
    """delta-rs creates each log entry with If-None-Match: *, as the store does its manifests:
    two writers can never both create one table version."""
    remote = s3.remote("delta-conditional")
    sink = LocalSink({**options(remote.url, "delta"), **remote.sink_options}, SCHEMA)
    sink.window(0, rows([1], 1000))
    s3.reset_counts()
    sink.window(1, rows([2, 1], 1000))
    log_puts = [r for r in s3.requests() if r.kind == "PUT" and "/_delta_log/" in r.key]
    assert [r.key.rsplit("/", 2)[-2:] for r in log_puts] == [
        ["_delta_log", "00000000000000000002.json"],  # unique
        ["_delta_log", "00000000000000000001.json"],  # duplicate's first rows
    ]
    assert all(r.conditional for r in log_puts)
    assert not [r for r in s3.requests() if r.kind == "COPY"]  # nothing copied


def _publish_from_another_process(
    sink_options: dict[str, str], publication_wire: dict[str, Any], start: Any
) -> None:
    from dedupsink.options import DedupOptions
    from dedupsink.ports.formats import port_format
    from dedupsink.store.records import Publication

    publication = Publication.from_wire(publication_wire)
    assert publication is not None
    start.wait()
    port_format(DedupOptions.parse(sink_options)).publish(publication, "racer")


@pytest.mark.parametrize("output_format", ["delta", "iceberg"])
def test_four_processes_publishing_one_window_at_once_commit_it_once(
    tmp_path: Path, output_format: str
) -> None:
    import multiprocessing

    url = str(tmp_path / "race")
    sink_options = options(url, output_format)
    sink = LocalSink(sink_options, SCHEMA)
    sink.window(0, rows([1, 2, 3], 1000), partitions=2)
    manifest = sink.plan.store.read()
    assert manifest is not None and manifest.publication is not None
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    racers = [
        context.Process(
            target=_publish_from_another_process,
            args=(sink.plan.options.to_strings(), manifest.publication.to_wire(), start),
        )
        for _ in range(4)
    ]
    for racer in racers:
        racer.start()
    start.set()
    for racer in racers:
        racer.join(120)
    assert [racer.exitcode for racer in racers] == [0, 0, 0, 0]
    if output_format == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(f"{url}/unique")
        assert table.transaction_version("dedupsink-racer-unique") == manifest.version
        racing = [h for h in table.history() if h.get("dedupsink.store") == "racer"]
        assert len(racing) == 1
    else:
        from dedupsink.ports.iceberg import STORE_PROPERTY

        table = sink.plan.ports._table("unique")
        racing = [s for s in table.snapshots() if s.summary.get(STORE_PROPERTY) == "racer"]
        assert len(racing) == 1


@pytest.mark.skipif(not azurite_installed(), reason="Azurite is installed by `make install`")
def test_delta_ports_on_azure_take_the_connection_string(azure: Azurite) -> None:
    """delta-rs takes no connection string: the sink gives it the account, key and endpoint."""
    from deltalake import DeltaTable

    remote = azure.remote("delta")
    sink = LocalSink({**options(remote.url, "delta"), **remote.sink_options}, SCHEMA)
    sink.window(0, rows([1, 2, 2], 1000), partitions=2)
    ports = sink.plan.ports
    table = DeltaTable(ports.table_uri("unique"), storage_options=ports.storage_options)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2]


def test_iceberg_snapshots_older_than_the_tables_horizon_are_expired(tmp_path: Path) -> None:
    """Every 16 windows the sink expires a port table's snapshots by its history.expire.*
    properties (a commit's cost grows with the snapshots kept); the rows all stay."""
    from dedupsink.ports.iceberg import MAX_SNAPSHOT_AGE, MIN_SNAPSHOTS, published_version

    url = str(tmp_path / "orders")
    sink = LocalSink(options(url, "iceberg"), SCHEMA)
    sink.start()
    ports = sink.plan.ports
    ports.create_deferred_tables(SCHEMA)
    with ports._table("unique").transaction() as transaction:
        transaction.set_properties({MAX_SNAPSHOT_AGE: "0", MIN_SNAPSHOTS: "2"})
    for window in range(17):
        sink.window(window, rows([window], 1000))
    table = ports._table("unique")
    assert len(table.snapshots()) == 3  # the 2 kept at version 16, then version 17's
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(17))
    store = sink.plan.store.read()
    assert store is not None and published_version(table, store.store_id) == 17
    duplicate = ports._table("duplicate")  # the default horizon (an hour): nothing expired
    assert duplicate.metadata.properties[MAX_SNAPSHOT_AGE] == "3600000"


def test_delta_tables_are_checkpointed_every_ten_commits(tmp_path: Path) -> None:
    url = str(tmp_path / "orders")
    sink = LocalSink(options(url, "delta"), SCHEMA)
    for window in range(11):
        sink.window(window, rows([window], 1000))
    log = {p.name for p in (tmp_path / "orders" / "unique" / "_delta_log").iterdir()}
    assert "00000000000000000009.checkpoint.parquet" in log
    assert delta_ids(url, "unique") == list(range(11))


def test_an_iceberg_catalog_name_files_the_tables_where_other_engines_look(
    tmp_path: Path,
) -> None:
    from pyiceberg.catalog import load_catalog

    url = str(tmp_path / "orders")
    database = f"sqlite:///{tmp_path}/catalog.db"
    catalog = {
        "iceberg.catalog.type": "sql",
        "iceberg.catalog.uri": database,
        "iceberg.catalog.warehouse": f"file://{tmp_path}",
        "iceberg.catalog.name": "lake",
    }
    LocalSink({**options(url, "iceberg"), **catalog}, SCHEMA).window(0, rows([1, 2], 1000))
    lake = load_catalog("lake", type="sql", uri=database, warehouse=f"file://{tmp_path}")
    table = lake.load_table("dedup.orders_unique")
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2]


def test_an_iceberg_commit_works_out_its_pending_metadata_once_per_staged_change(
    tmp_path: Path,
) -> None:
    """pyiceberg's transaction deep-copies the table's metadata on every read of its pending
    state; the sink's transaction reuses it until a change is staged, and commits the same."""
    from dedupsink.ports.iceberg import _transaction

    url = str(tmp_path / "orders")
    sink = LocalSink(options(url, "iceberg"), SCHEMA)
    sink.window(0, rows([1], 1000))
    table = sink.plan.ports._table("unique")
    transaction = _transaction(table)
    assert transaction.table_metadata is transaction.table_metadata
    before = transaction.table_metadata
    transaction.set_properties({"owner": "orders-team"})
    after = transaction.table_metadata
    assert after is not before and after.properties["owner"] == "orders-team"
    transaction.commit_transaction()
    assert sink.plan.ports._table("unique").metadata.properties["owner"] == "orders-team"
    sink.window(1, rows([2], 1000))
    unique = sink.plan.ports._table("unique")
    assert sorted(unique.scan().to_arrow().column("id").to_pylist()) == [1, 2]


PLAN_A_NEW_ICEBERG_OUTPUT = """
import json
import sys
import pyarrow as pa
from dedupsink.sink.plan import plan_for
schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
plan_for(json.loads(sys.argv[1]), schema, "run-1")
print("pyiceberg imported" if "pyiceberg" in sys.modules else "pyiceberg not imported")
"""


def test_a_new_embedded_iceberg_catalog_is_made_by_the_first_commit(tmp_path: Path) -> None:
    """Spark plans a query in a Python process of its own: on a new output with the embedded
    catalog there is nothing to check, so planning imports no pyiceberg and makes no table;
    the first commit makes the catalog and the four tables."""
    import json
    import subprocess
    import sys

    from dedupsink.ports.iceberg import CATALOG_FILE

    url = tmp_path / "orders"
    planned = subprocess.run(
        [sys.executable, "-c", PLAN_A_NEW_ICEBERG_OUTPUT, json.dumps(options(str(url), "iceberg"))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert planned.stdout.strip() == "pyiceberg not imported"
    assert not (url / CATALOG_FILE).exists()
    sink = LocalSink(options(str(url), "iceberg"), SCHEMA)
    sink.window(0, rows([1, 1], 1000))
    assert (url / CATALOG_FILE).exists()
    ports = sink.plan.ports
    tables = {port: ports._table(port) for port in ("unique", "duplicate", "expired", "error")}
    assert all(table is not None for table in tables.values()), tables
    assert tables["unique"].scan().to_arrow().column("id").to_pylist() == [1]
    assert tables["error"].current_snapshot() is None  # created empty: no rows yet


def test_an_iceberg_catalog_left_without_tables_gets_them_at_the_next_start(
    tmp_path: Path,
) -> None:
    """A first commit killed after making the catalog file and before its tables: the next
    query start makes them (only the sink makes that file, so a file means a start is due)."""
    from pyiceberg.catalog import load_catalog

    from dedupsink.ports.iceberg import CATALOG_FILE

    url = tmp_path / "orders"
    url.mkdir()
    load_catalog("dedupsink", type="sql", uri=f"sqlite:///{url}/{CATALOG_FILE}").list_namespaces()
    sink = LocalSink(options(str(url), "iceberg"), SCHEMA)
    sink.start()
    assert sink.plan.ports._table("unique") is not None
    sink.window(0, rows([1, 2], 1000))
    unique = sink.plan.ports._table("unique")
    assert sorted(unique.scan().to_arrow().column("id").to_pylist()) == [1, 2]


def test_an_iceberg_commit_from_a_handle_another_writer_overtook_reads_the_table_again(
    tmp_path: Path,
) -> None:
    """A port's commit starts from the handle its last commit in this process left; when
    another writer has committed since, the catalog refuses that commit and it reads again."""
    from dedupsink.ports.iceberg import _committed, published_version

    url = str(tmp_path / "orders")
    sink = LocalSink(options(url, "iceberg"), SCHEMA)
    sink.window(0, rows([1], 1000))
    assert any(identifier[1] == "orders_unique" for _, identifier in _committed)
    ports = sink.plan.ports
    with ports._table("unique").transaction() as other_writer:
        other_writer.set_properties({"owner": "orders-team"})
    sink.window(1, rows([2], 1000))
    unique = ports._table("unique")
    assert sorted(unique.scan().to_arrow().column("id").to_pylist()) == [1, 2]
    assert unique.metadata.properties["owner"] == "orders-team"
    assert len(unique.snapshots()) == 2  # one a window
    store = sink.plan.store.read()
    assert store is not None and published_version(unique, store.store_id) == 2


def test_a_tasks_port_files_share_the_encoding_its_first_rows_chose(tmp_path: Path) -> None:
    """A task counts the distinct values of its first rows of a schema once: its later files
    of that schema (another port, the next chunk) dictionary-encode the same columns."""
    import pyarrow.parquet as pq

    from dedupsink.ports.output import Output, PortWriters

    output = Output(str(tmp_path))
    writers = PortWriters(output, "_staging/w0000000001-q-0-run", 0, 0)
    ids = [f"id-{i}" for i in range(1024)]
    writers.write("unique", pa.table({"user": ["ann", "bob"] * 512, "id": ids}))
    writers.write("duplicate", pa.table({"user": ids, "id": ids}))

    def dictionary_encoded(path: str) -> list[bool]:
        group = pq.ParquetFile(output.path(path)).metadata.row_group(0)
        return ["RLE_DICTIONARY" in group.column(i).encodings for i in range(group.num_columns)]

    files = {record.port: record.path for record in writers.close()}
    assert dictionary_encoded(files["unique"]) == [True, False]
    assert dictionary_encoded(files["duplicate"]) == [True, False]
