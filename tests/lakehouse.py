"""Ports as lakehouse tables (SPEC §7), read back with each format's own reader.

``PortTables`` reads the four port tables of one output, Delta Lake through delta-rs and Iceberg
through pyiceberg's catalog, never through the sink's code: the rows of each table, and its
history as a list of commits (Delta commits with operation WRITE, Iceberg snapshots), each with
the store version it records and the rows it added (the table at that commit minus the table at
the one before). A port compaction's commit (Delta's OPTIMIZE, an Iceberg ``replace``
snapshot) is no commit of rows: it is checked to change none and left out of that list.
``check_tables`` compares both with the reference model window by window: a port's table must
hold exactly one commit per window that sent it rows, carrying exactly that window's rows, in
window order, each tied to a distinct store version, the newest of which is the table's recorded
publication (Delta's app transaction, the Iceberg summary) and the store's latest version that
published rows to the port.

``DuckDB`` is an independent reader of the same tables (its delta and iceberg extensions, loaded
from the ``duckdb-ext-*`` wheels, offline), which also tells how many files a filtered scan
read.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pickle
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from servers import Remote
from streams import PORT_NAMES, Output, as_remote, frozen, reference_outputs

from dedupsink.store.store import BucketStore

TESTS_DIR = Path(__file__).resolve().parent
FORMATS = ("delta", "iceberg")
ERROR_COLUMN = "_dedup_error"
CATALOG_FILE = "_iceberg_catalog.db"
NAMESPACE = "dedup"
# A SQL catalog files its tables under the name it is opened with (pyiceberg's ``catalog_name``
# column): the sink opens every catalog as "dedupsink" (README: read them back under that name).
CATALOG_NAME = "dedupsink"

Rows = Counter[tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class Commit:
    """One commit of a port table: the store version it records and the rows it added."""

    table_version: int  # Delta's table version; Iceberg's snapshot sequence number
    store: str | None
    version: int | None
    rows: Rows


@dataclasses.dataclass
class PortTables:
    """The port tables of ``output`` in ``fmt``; for Iceberg on an object store, the SQLite
    file of the SQL catalog the sink is given (``catalog_db``)."""

    fmt: str
    output: Output
    catalog_db: Path | None = None
    _catalog: Any = None

    # -- what the sink is given ----------------------------------------------------------------

    @property
    def remote(self) -> Remote:
        return as_remote(self.output)

    @property
    def on_s3(self) -> bool:
        return self.remote.url.startswith("s3://")

    def sink_options(self) -> dict[str, str]:
        """``path``, ``fs.*``, ``outputFormat`` and, for Iceberg on S3, the catalog."""
        options = {"path": self.remote.url, **self.remote.sink_options, "outputFormat": self.fmt}
        if self.fmt == "iceberg" and self.on_s3:
            assert self.catalog_db is not None, "Iceberg on S3 needs a catalog"
            options.update(
                {
                    "iceberg.catalog.type": "sql",
                    "iceberg.catalog.uri": f"sqlite:///{self.catalog_db}",
                    "iceberg.catalog.warehouse": self.remote.url,
                }
            )
        return options

    # -- the format's own readers ----------------------------------------------------------------

    def delta_options(self) -> dict[str, str]:
        if not self.on_s3:
            return {}
        given = self.remote.storage_options
        return {
            "AWS_ENDPOINT_URL": given["endpoint_url"],
            "AWS_ACCESS_KEY_ID": given["key"],
            "AWS_SECRET_ACCESS_KEY": given["secret"],
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "timeout": "10s",
        }

    def delta_uri(self, port: str) -> str:
        return f"{self.remote.url}/{port}"

    def delta(self, port: str, version: int | None = None) -> Any:
        import deltalake

        return deltalake.DeltaTable(
            self.delta_uri(port), version=version, storage_options=self.delta_options()
        )

    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            if self.on_s3:
                given = self.remote.storage_options
                assert self.catalog_db is not None
                self._catalog = load_catalog(
                    CATALOG_NAME,
                    type="sql",
                    uri=f"sqlite:///{self.catalog_db}",
                    warehouse=self.remote.url,
                    **{
                        "s3.endpoint": given["endpoint_url"],
                        "s3.access-key-id": given["key"],
                        "s3.secret-access-key": given["secret"],
                        "s3.region": "us-east-1",
                    },
                )
            else:
                root = Path(self.remote.url)
                self._catalog = load_catalog(
                    CATALOG_NAME,
                    type="sql",
                    uri=f"sqlite:///{root}/{CATALOG_FILE}",
                    warehouse=f"file://{root}",
                )
        return self._catalog

    def identifier(self, port: str) -> tuple[str, str]:
        return (NAMESPACE, f"{self.remote.url.rstrip('/').rsplit('/', 1)[-1]}_{port}")

    def iceberg(self, port: str) -> Any:
        return self.catalog().load_table(self.identifier(port))

    def read(self, port: str) -> pa.Table:
        """The port's table as its format's reader gives it."""
        if self.fmt == "delta":
            return self.delta(port).to_pyarrow_table()
        return self.iceberg(port).scan().to_arrow()

    def heads(self) -> dict[str, int]:
        """Each port table's current version (Delta) or snapshot count (Iceberg)."""
        if self.fmt == "delta":
            return {port: self.delta(port).version() for port in PORT_NAMES}
        return {port: len(self.iceberg(port).snapshots()) for port in PORT_NAMES}

    def commits(self, port: str, columns: Sequence[str]) -> list[Commit]:
        """The table's commits of rows, oldest first, each with the rows it added."""
        if self.fmt == "delta":
            return self._delta_commits(port, columns)
        return self._iceberg_commits(port, columns)

    def _delta_commits(self, port: str, columns: Sequence[str]) -> list[Commit]:
        history = sorted(self.delta(port).history(), key=lambda entry: entry["version"])
        assert history[0]["version"] == 0 and history[0]["operation"] == "CREATE TABLE", history[0]
        commits = []
        before: Rows = Counter()
        for entry in history[1:]:
            now = rows_of(self.delta(port, entry["version"]).to_pyarrow_table(), columns)
            if entry["operation"] == "OPTIMIZE":
                assert now == before, f"{port} v{entry['version']}: a compaction changed rows"
                continue
            assert entry["operation"] == "WRITE", entry
            assert not before - now, f"{port} v{entry['version']} removed rows"
            version = entry.get("dedupsink.version")
            commits.append(
                Commit(
                    entry["version"],
                    entry.get("dedupsink.store"),
                    None if version is None else int(version),
                    now - before,
                )
            )
            before = now
        return commits

    def _iceberg_commits(self, port: str, columns: Sequence[str]) -> list[Commit]:
        table = self.iceberg(port)
        snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number)
        commits = []
        before: Rows = Counter()
        parent = None
        for snapshot in snapshots:
            assert snapshot.parent_snapshot_id == parent, f"{port}: snapshots are not one line"
            parent = snapshot.snapshot_id
            summary = snapshot.summary
            assert summary is not None
            now = rows_of(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow(), columns)
            if summary.operation.value == "replace":
                assert now == before, f"{port} snapshot {snapshot.sequence_number}: compaction"
                continue
            assert summary.operation.value == "append", summary
            assert not before - now, f"{port} snapshot {snapshot.sequence_number} removed rows"
            version = summary.get("dedupsink.version")
            commits.append(
                Commit(
                    snapshot.sequence_number,
                    summary.get("dedupsink.store"),
                    None if version is None else int(version),
                    now - before,
                )
            )
            before = now
        return commits

    def published(self, port: str, store_id: str) -> int | None:
        """The store version the table records as published: Delta's app transaction
        ``dedupsink-<store id>-<port>``; Iceberg's newest ``dedupsink.version`` of the store."""
        if self.fmt == "delta":
            found = self.delta(port).transaction_version(f"dedupsink-{store_id}-{port}")
            return None if found is None else int(found)
        versions = [
            int(s.summary["dedupsink.version"])
            for s in self.iceberg(port).snapshots()
            if s.summary is not None and s.summary.get("dedupsink.store") == store_id
        ]
        return max(versions, default=None)

    def views(self, columns: Sequence[str], store_id: str) -> dict[str, PortView]:
        """Each port's table, commits and recorded publication. delta-rs holds the GIL through
        some of its S3 calls, which would starve moto's server in this process (its requests
        time out): Delta tables on S3 are read in a child process."""
        if self.fmt == "delta" and self.on_s3:
            return in_child(self, "views_here", list(columns), store_id)
        return self.views_here(columns, store_id)

    def views_here(self, columns: Sequence[str], store_id: str) -> dict[str, PortView]:
        return {
            port: PortView(
                self.read(port), self.commits(port, columns), self.published(port, store_id)
            )
            for port in PORT_NAMES
        }

    def table_files(self, port: str) -> set[str]:
        """The names of the data files the port table's current version references."""
        if self.fmt == "delta":
            uris = self.delta(port).file_uris()
        else:
            uris = [task.file.file_path for task in self.iceberg(port).scan().plan_files()]
        return {uri.rsplit("/", 1)[-1] for uri in uris}

    def folder_files(self, port: str) -> set[str]:
        """The names of the Parquet files in the port's folder, at any depth."""
        fs = self.remote.fs()
        root = fs._strip_protocol(self.remote.url).rstrip("/")
        try:
            found = fs.find(f"{root}/{port}")
        except FileNotFoundError:
            return set()
        return {name.rsplit("/", 1)[-1] for name in found if name.endswith(".parquet")}

    def port_folders(self) -> list[str]:
        """The port folders (and the embedded catalog) under the output, if any."""
        fs = self.remote.fs()
        root = fs._strip_protocol(self.remote.url).rstrip("/")
        names = [*PORT_NAMES, CATALOG_FILE]
        return [name for name in names if fs.exists(f"{root}/{name}")]


_CHILD = """
import pickle, sys
sys.path.insert(0, sys.argv[1])
tables, method, args = pickle.load(sys.stdin.buffer)
pickle.dump(getattr(tables, method)(*args), sys.stdout.buffer)
"""


def in_child(tables: PortTables, method: str, *args: Any) -> Any:
    """``tables.<method>(*args)`` run in a child process of this interpreter."""
    given = pickle.dumps((dataclasses.replace(tables, _catalog=None), method, args))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(TESTS_DIR)],
        input=given,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return pickle.loads(done.stdout)


def rows_of(table: pa.Table, columns: Sequence[str]) -> Rows:
    selected = table.select(list(columns)).to_pylist()
    return Counter(frozen(tuple(row[c] for c in columns)) for row in selected)


# -- DuckDB, an independent reader ------------------------------------------------------------


class DuckDB:
    """A DuckDB connection with its delta, avro and iceberg extensions loaded from the installed
    ``duckdb-ext-*`` wheels, which put them where DuckDB looks for installed extensions
    (``<site-packages>/duckdb_ext/extensions/v<version>/<platform>/``); nothing is fetched."""

    def __init__(self) -> None:
        import duckdb

        spec = importlib.util.find_spec("duckdb_ext")
        assert spec is not None and spec.submodule_search_locations, "duckdb-ext-* missing"
        folder = Path(next(iter(spec.submodule_search_locations))) / "extensions"
        self.connection = duckdb.connect(
            config={
                "extension_directory": str(folder),
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
            }
        )
        for extension in ("delta", "avro", "iceberg"):
            self.connection.execute(f"LOAD {extension}")

    def scan(self, tables: PortTables, port: str) -> str:
        """The table function reading ``port``'s table: ``delta_scan`` of its folder, or
        ``iceberg_scan`` of its current metadata file."""
        if tables.fmt == "delta":
            return f"delta_scan('{tables.delta_uri(port)}')"
        return f"iceberg_scan('{tables.iceberg(port).metadata_location}')"

    def read(self, tables: PortTables, port: str, where: str = "true") -> pa.Table:
        query = f"SELECT * FROM {self.scan(tables, port)} WHERE {where}"
        return self.connection.sql(query).fetch_arrow_table()

    def files_read(self, tables: PortTables, port: str, where: str) -> int:
        """How many of the table's data files a scan filtered by ``where`` read: the scan's
        ``Total Files Read`` in ``EXPLAIN ANALYZE`` (a Delta scan also shows ``Scanning Files:
        <read>/<all>``, whose total must be the table's)."""
        query = f"EXPLAIN ANALYZE SELECT * FROM {self.scan(tables, port)} WHERE {where}"
        plan = self.connection.sql(query).fetchall()[0][1]
        found = re.search(r"Total Files Read: (\d+)", plan)
        assert found is not None, plan
        scanning = re.search(r"Scanning Files: (\d+)/(\d+)", plan)
        if scanning is not None:
            assert int(scanning.group(1)) == int(found.group(1)), plan
            assert int(scanning.group(2)) == len(tables.table_files(port)), plan
        return int(found.group(1))


# -- the reference, window by window -----------------------------------------------------------


def per_window(
    windows: Sequence[pa.Table],
    mode: str,
    keys: Sequence[str],
    expiry_key: str | None = None,
    period: float | None = None,
) -> list[dict[str, Rows]]:
    """The rows each window sends to each port (``streams.reference_outputs`` over prefixes)."""
    out: list[dict[str, Rows]] = []
    before: dict[str, Rows] = {port: Counter() for port in PORT_NAMES}
    for end in range(1, len(windows) + 1):
        now = reference_outputs(windows[:end], mode, keys, expiry_key, period)
        out.append({port: now[port] - before[port] for port in PORT_NAMES})
        before = now
    return out


def store_of(output: Output) -> BucketStore:
    remote = as_remote(output)
    return BucketStore(f"{remote.url}/_store", remote.storage_options)


def versions_with_rows(store: BucketStore, port: str) -> tuple[int, set[int]]:
    """Of the manifests the store keeps: the oldest kept version, and the versions whose
    publication has files for ``port``."""
    kept = store.versions()
    found = set()
    for version in kept:
        manifest = store.read(version)
        assert manifest is not None
        if manifest.publication is not None and manifest.publication.files_of(port):
            found.add(version)
    return min(kept), found


@dataclasses.dataclass(frozen=True)
class PortView:
    """What a format's reader shows of one port table."""

    table: pa.Table
    commits: list[Commit]
    published: int | None


def check_tables(
    tables: PortTables, expected: Sequence[Mapping[str, Rows]], columns: Sequence[str]
) -> None:
    """Every port table equals the reference, holds one commit per window with rows (carrying
    exactly that window's rows), each tied to a distinct store version, and records as published
    the store's latest version that published rows to the port."""
    store = store_of(tables.output)
    manifest = store.read()
    assert manifest is not None
    store_id = manifest.store_id
    views = tables.views(columns, store_id)
    for port in PORT_NAMES:
        view = views[port]
        names = [*columns, ERROR_COLUMN] if port == "error" else list(columns)
        assert view.table.schema.names == names, (port, view.table.schema.names)
        total: Rows = sum((window[port] for window in expected), Counter())
        assert rows_of(view.table, columns) == total, port
        if port == "error" and view.table.num_rows:
            reasons = view.table.column(ERROR_COLUMN).to_pylist()
            assert all(reasons), "an error row without a reason"

        wanted = [window[port] for window in expected if window[port]]
        got = [c.rows for c in view.commits]
        assert got == wanted, f"{port}: not one commit per window with rows"
        assert all(c.store == store_id for c in view.commits), port
        versions = [c.version for c in view.commits]
        assert all(v is not None for v in versions), port
        assert versions == sorted(set(versions)), f"{port}: store versions {versions}"
        oldest, published_here = versions_with_rows(store, port)
        assert {v for v in versions if v is not None and v >= oldest} == published_here, port
        newest = versions[-1] if versions else None
        assert view.published == newest, port
        if newest is not None:
            assert newest == max(published_here), port


# -- inputs ------------------------------------------------------------------------------------


def batch_write(
    spark: Any, table: pa.Table, folder: Path, options: Mapping[str, str], partitions: int = 2
) -> None:
    """``df.write.format("dedup").mode("append").save()`` of ``table``'s rows."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"batch-{len(list(folder.iterdir())):03d}.parquet"
    pq.write_table(table, source)
    frame = spark.read.parquet(str(source)).repartition(partitions)
    writer = frame.write.format("dedup").mode("append")
    given = dict(options)
    path = given.pop("path")
    for key, value in given.items():
        writer = writer.option(key, value)
    writer.save(path)
