"""Iceberg ports: each port an Iceberg table ``<namespace>.<table>_<port>`` at ``<path>/<port>``.

The catalog comes from ``iceberg.catalog.<property>`` options (pyiceberg's ``load_catalog``);
on a local ``path`` without one, an embedded SQLite catalog at ``<path>/_iceberg_catalog.db``.
Publishing a window adds a port's files in one snapshot whose summary records the store version,
so a redone publication finds it and adds nothing; the catalog's commit is conditional and not
retried, so of two racing publishers one fails and then finds the other's snapshot.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from dedupsink.engine.classify import PORTS
from dedupsink.errors import DedupOptionError, PortTableError
from dedupsink.masking import MASK, is_secret_property
from dedupsink.options import ICEBERG_CATALOG_PREFIX, OUTPUT_FORMAT, PATH, StorageBounds
from dedupsink.ports.base import (
    CatalogInfo,
    PortFormat,
    missing_extra,
    recorded_schema,
    table_schema,
)
from dedupsink.ports.evolution import ICEBERG_WIDENING, check_evolution
from dedupsink.ports.output import Layout
from dedupsink.runtime import RUNTIME
from dedupsink.store.records import Move, Publication
from dedupsink.store.store import GARBAGE_EVERY as EXPIRE_EVERY

CATALOG_FILE = "_iceberg_catalog.db"
# The catalog's name for pyiceberg (a SQL catalog files its tables under it): the
# iceberg.catalog.name option, so that other engines opening the same catalog find them.
CATALOG_NAME = "name"
CATALOG_NAME_DEFAULT = "dedupsink"
# Snapshot summary properties that tie a snapshot to the store's commit.
STORE_PROPERTY = "dedupsink.store"
VERSION_PROPERTY = "dedupsink.version"
_COMMIT_ROUNDS = 8
# Properties of the tables the sink creates. pyiceberg rebuilds a table's whole metadata,
# snapshots included, several times a commit, so a commit's cost grows with the snapshots kept
# (about a millisecond each a port): the sink expires old ones as Iceberg's expire_snapshots
# does, by the table's history.expire.* properties, with a shorter horizon than Iceberg's
# (5 days) by default; old metadata files are deleted as new ones are written.
MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS = "history.expire.min-snapshots-to-keep"
TABLE_PROPERTIES = {
    MAX_SNAPSHOT_AGE: str(3_600_000),
    MIN_SNAPSHOTS: "16",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "16",
}
_ICEBERG_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3_600_000  # Iceberg's own defaults, for other tables
_ICEBERG_MIN_SNAPSHOTS = 1
# A catalog per set of properties, per process: a SQL catalog opens a database engine, a REST
# one authenticates; a commit in a long-lived driver process reuses it.
_catalogs_lock = threading.Lock()
_catalogs: dict[tuple[tuple[str, str], ...], Any] = RUNTIME.cache(
    "ports.iceberg_catalogs", dict, _catalogs_lock
)
# The table handle each port's last commit in this process left, as of that commit: the next
# window's commit starts from it instead of reading the table again (a read per port per
# window). A handle another writer has overtaken only costs a failed commit and a read: the
# catalog takes a commit only on top of the metadata it was made from.
_committed: dict[tuple[tuple[tuple[str, str], ...], tuple[str, str]], Any] = RUNTIME.cache(
    "ports.iceberg_committed", dict
)
_COMMITTED_KEEP = 64
# (table, recorded schema) pairs whose table is known to have every column of that schema at
# least as wide: a table's columns are only ever added and widened, so a port without rows in a
# window is not read again to learn that it already has the window's columns.
_covered: set[tuple[tuple[tuple[tuple[str, str], ...], tuple[str, str]], bytes]] = RUNTIME.cache(
    "ports.iceberg_covered", set
)


class IcebergPorts(PortFormat):
    """``outputFormat=iceberg``: each port an Iceberg table."""

    name = "iceberg"
    layout = Layout(in_table=True, data_folder="data")
    address_heading = "Iceberg table locations"

    def catalog_info(self) -> CatalogInfo:
        properties = self.catalog_properties()
        name = properties.pop(CATALOG_NAME, CATALOG_NAME_DEFAULT)
        tables: dict[str, str] = {port: self.table_name(port) for port in PORTS}
        return CatalogInfo(name, shown_properties(properties), tables)

    def identifier(self, port: str) -> tuple[str, str]:
        return (self.options.table_namespace, f"{self.options.table_prefix}_{port}")

    def table_name(self, port: str) -> str:
        return ".".join(self.identifier(port))

    def table_location(self, port: str) -> str:
        return self._url(self.output.path(port))

    def _url(self, path: str) -> str:
        """A path as pyiceberg takes it: a local one plain (pyiceberg parses a ``file://`` URL
        as a URL, cutting it at a ``#`` or ``?`` in a folder's name), others as URLs."""
        storage = self.output.storage
        return path if storage.family == "local" else storage.full_url(path)

    def catalog_properties(self) -> dict[str, str]:
        """The user's catalog properties; on a local path with none, the embedded SQLite
        catalog. Object-store credentials given as ``fs.*`` reach the catalog's file access."""
        given = dict(self.options.iceberg_catalog)
        storage = self.output.storage
        if not given and storage.family == "local":
            root = self.output.storage.path()
            if "?" in root:
                raise DedupOptionError(
                    PATH,
                    self.options.path,
                    "a path without '?' for the embedded Iceberg catalog (its SQLite URL would "
                    f"end there), or a catalog of your own ({ICEBERG_CATALOG_PREFIX}uri, ...)",
                )
            given = {
                "type": "sql",
                "uri": f"sqlite:///{root}/{CATALOG_FILE}",
                "warehouse": self._url(root),
            }
        return {
            **_file_io_properties(storage.family, storage.options, storage.bounds),
            **given,
        }

    def catalog(self) -> Any:
        properties = self.catalog_properties()
        key = tuple(sorted(properties.items()))
        with _catalogs_lock:
            if key not in _catalogs:
                _catalogs[key] = self._load_catalog(properties)
            return _catalogs[key]

    def _load_catalog(self, given: dict[str, str]) -> Any:
        pyiceberg = _pyiceberg()
        properties = dict(given)
        name = properties.pop(CATALOG_NAME, CATALOG_NAME_DEFAULT)
        uri = properties.get("uri", "")
        if uri.startswith("sqlite:///"):
            os.makedirs(os.path.dirname(uri[len("sqlite:///") :]) or ".", exist_ok=True)
        if properties.get("type") == "glue":
            properties = _bounded_glue(properties, self.output.storage.bounds)
        try:
            return pyiceberg.catalog.load_catalog(name, **properties)
        except Exception as exc:  # pyiceberg raises its own, SQLAlchemy's and the OS's errors
            raise DedupOptionError(
                ICEBERG_CATALOG_PREFIX + "<property>",
                self.options.mask(str(shown_properties(properties))),
                f"a catalog pyiceberg can load ({type(exc).__name__}: {exc})",
            ) from exc

    # -- at query start --------------------------------------------------------------------------

    def _catalog_missing(self) -> bool:
        """Whether the embedded catalog has not been made yet: a new output, with no tables.

        Its tables then wait for the first commit, which imports pyiceberg anyway: Spark plans
        a query in a Python process of its own, where importing pyiceberg and creating four
        tables cost most of a second of the first micro-batch. Only ``create_tables`` makes
        the file, so a file without tables is a creation that was cut short, which the next
        query start finishes."""
        if self.options.iceberg_catalog or self.output.storage.family != "local":
            return False
        return not os.path.exists(os.path.join(self.output.storage.path(), CATALOG_FILE))

    def check_tables(self, schema: pa.Schema) -> None:
        if self._catalog_missing():
            self.catalog_properties()  # refuses a path its SQLite URL cannot name
            _require_pyiceberg()
            return
        catalog = self.catalog()
        seconds = self.output.storage.bounds.start
        try:
            within(seconds, catalog.list_namespaces)
        except Exception as exc:  # an unreachable catalog: whatever its client raises
            option, value = self._catalog_address()
            why = (
                f"no reply within {seconds:g} s (storageConnectTimeout)"
                if isinstance(exc, TimeoutError)
                else f"{type(exc).__name__}: {exc}"
            )
            raise DedupOptionError(option, value, f"a catalog that can be reached ({why})") from exc
        for port in PORTS:
            table = self._table(port)
            if table is not None:
                self._check_table(table, port, schema)

    def _catalog_address(self) -> tuple[str, str]:
        """The option that says where the catalog is, and its value (a password masked)."""
        properties = self.catalog_properties()
        for name in ("uri", "glue.endpoint"):
            if properties.get(name):
                shown = self.options.mask(without_password(str(properties[name])))
                return ICEBERG_CATALOG_PREFIX + name, shown
        return ICEBERG_CATALOG_PREFIX + "type", str(properties.get("type"))

    def create_tables(self, schema: pa.Schema) -> None:
        if not self._catalog_missing():
            self._create_tables(schema)

    def create_deferred_tables(self, schema: pa.Schema) -> None:
        if self._catalog_missing():
            self._create_tables(schema)

    def _create_tables(self, schema: pa.Schema) -> None:
        exceptions = _pyiceberg().exceptions
        catalog = self.catalog()
        catalog.create_namespace_if_not_exists(self.options.table_namespace)
        for port in PORTS:
            if self._table(port) is not None:
                continue
            try:
                catalog.create_table(
                    self.identifier(port),
                    table_schema(port, schema),
                    location=self.table_location(port),
                    properties=TABLE_PROPERTIES,
                )
            except exceptions.TableAlreadyExistsError:
                continue  # another process created it

    def _table(self, port: str) -> Any:
        if self._catalog_missing():
            return None  # and no catalog file made by merely looking
        exceptions = _pyiceberg().exceptions
        try:
            return self.catalog().load_table(self.identifier(port))
        except (exceptions.NoSuchTableError, exceptions.NoSuchNamespaceError):
            return None

    def _check_table(self, table: Any, port: str, schema: pa.Schema) -> None:
        name, location = self.table_name(port), self.table_location(port)
        if table.location().rstrip("/") != location:
            raise DedupOptionError(
                OUTPUT_FORMAT,
                self.name,
                f"the Iceberg table {name} at {location}, where the sink writes its files (it "
                f"is at {table.location()}); set iceberg.table to another name",
            )
        wanted = _shape(self.catalog(), table_schema(port, schema))
        found = _shape(self.catalog(), table.schema().as_arrow())
        required = frozenset(f.name for f in table.schema().fields if f.required)
        check_evolution(
            self.name,
            f"the Iceberg table {name}",
            wanted,
            found,
            required,
            self.options.merge_schema,
            ICEBERG_WIDENING,
        )

    def has_windows(self) -> bool:
        for port in PORTS:
            table = self._table(port)
            if table is not None and table.current_snapshot() is not None:
                return True
        return False

    # -- the commit ------------------------------------------------------------------------------

    def publish_tables(self, publication: Publication, store_id: str) -> None:
        for port in PORTS:
            files = publication.files_of(port)
            if files:
                self._commit(port, files, publication, store_id)
            elif self._lacks_columns(port, publication):
                # A port without rows still takes the window's new columns (a schema change
                # alone, which a redo finds made), so every port table declares them.
                self._evolve(port, publication)

    def is_published(self, publication: Publication, store_id: str) -> bool:
        for port in PORTS:
            if publication.files_of(port):
                table = self._table(port)
                if table is None or published_version(table, store_id) < publication.version:
                    return False
            elif self._lacks_columns(port, publication):
                return False
        return True

    def _key(self, port: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, str]]:
        return (tuple(sorted(self.catalog_properties().items())), self.identifier(port))

    def _lacks_columns(self, port: str, publication: Publication) -> bool:
        """Whether the port's table lacks a column of the window's recorded schema, or has one
        narrower: known from an earlier look in this process, else read."""
        if publication.schema is None or (self._key(port), publication.schema) in _covered:
            return False
        table = self._table(port)
        if table is None:
            return False  # created with the input's columns
        if self._evolves(table, publication, port) is not None:
            return True
        _covered.add((self._key(port), publication.schema))
        return False

    def _evolves(self, table: Any, publication: Publication, port: str) -> pa.Schema | None:
        """The port's schema of the window's recorded one, if the table lacks a column of it or
        has one narrower (``union_by_name`` then changes the table); else None."""
        window = recorded_schema(publication)
        if window is None:
            return None
        wanted = table_schema(port, window)
        have = dict(_shape(self.catalog(), table.schema().as_arrow()))
        for name, kind in _shape(self.catalog(), wanted):
            old = have.get(name)
            if old is None or (old != kind and ICEBERG_WIDENING.allows(old, kind)):
                return wanted
        return None

    def _evolve(self, port: str, publication: Publication) -> None:
        """Add the window's new columns to a port table the window sends no rows, alone."""
        exceptions = _pyiceberg().exceptions
        for _ in range(_COMMIT_ROUNDS):
            table = self._table(port)
            wanted = None if table is None else self._evolves(table, publication, port)
            if wanted is None:
                break
            try:
                with _transaction(_without_retries(table)) as transaction:
                    transaction.update_schema().union_by_name(wanted).commit()
            except (exceptions.CommitFailedException, exceptions.CommitStateUnknownException):
                continue  # the table changed, or the change may have landed: read it again
            _committed.pop(self._key(port), None)
            break
        else:
            raise PortTableError(
                f"the Iceberg table {self.table_name(port)} kept changing under the schema change "
                f"of window {publication.version} ({_COMMIT_ROUNDS} rounds)"
            )
        _covered.add((self._key(port), publication.schema or b""))

    def _commit(
        self, port: str, files: list[Move], publication: Publication, store_id: str
    ) -> None:
        exceptions = _pyiceberg().exceptions
        paths = [self._url(self.output.path(move.target)) for move in files]
        summary = {STORE_PROPERTY: store_id, VERSION_PROPERTY: str(publication.version)}
        key = self._key(port)
        covered = publication.schema is None or (key, publication.schema) in _covered
        for _ in range(_COMMIT_ROUNDS):
            table = _committed.pop(key, None)
            if table is None:
                table = self._table(port)
            if table is None:
                raise PortTableError(f"the Iceberg table {self.table_name(port)} is gone")
            if published_version(table, store_id) >= publication.version:
                return
            handle = _without_retries(table)
            # The window's new columns in the snapshot's own commit: a reader sees them with
            # the rows, or neither.
            wanted = None if covered else self._evolves(handle, publication, port)
            try:
                with _transaction(handle) as transaction:
                    if wanted is not None:
                        transaction.update_schema().union_by_name(wanted).commit()
                    transaction.add_files(
                        paths, snapshot_properties=summary, check_duplicate_files=False
                    )
            except (exceptions.CommitFailedException, exceptions.CommitStateUnknownException):
                continue  # the table changed, or the commit may have landed: read it again
            _committed[key] = handle  # its metadata is now the commit's
            if publication.schema is not None:
                _covered.add((key, publication.schema))
            while len(_committed) > _COMMITTED_KEEP:
                del _committed[next(iter(_committed))]
            if publication.version % EXPIRE_EVERY == 0:
                expire_snapshots(self._table(port), publication.modified_ms)
            return
        raise PortTableError(
            f"the Iceberg table {self.table_name(port)} kept changing under the commit of window "
            f"{publication.version} ({_COMMIT_ROUNDS} rounds): another writer is committing to it"
        )

    # -- operating -------------------------------------------------------------------------------

    def describe(self, port: str, store_id: str) -> dict[str, Any]:
        table = self._table(port)
        if table is None:
            return {"table": self.table_name(port), "snapshots": None}
        return {
            "table": self.table_name(port),
            "snapshots": len(table.snapshots()),
            "published_version": published_version(table, store_id),
        }


def shown_properties(properties: dict[str, str]) -> dict[str, str]:
    """Catalog properties as shown (``inspect``, ``run``'s summary, errors): secrets masked by
    name, and the password of a URL (a SQL catalog's ``postgresql+psycopg2://user:pw@host/db``,
    whose property is named ``uri``, not like a secret)."""
    return {
        k: MASK if is_secret_property(k) else without_password(v) for k, v in properties.items()
    }


def without_password(value: str) -> str:
    """``value`` with the password of a URL's user part masked; anything else as it is."""
    if "@" not in value:
        return value
    try:
        password = urlsplit(value).password
    except ValueError:  # not a URL (an unbalanced '[' in its host part)
        return value
    return value.replace(f":{password}@", f":{MASK}@", 1) if password else value


def expire_snapshots(table: Any, now_ms: int) -> None:
    """Expire the snapshots older than the table's ``history.expire.max-snapshot-age-ms``,
    keeping its newest ``history.expire.min-snapshots-to-keep`` (Iceberg's own rule; the data
    files stay, as with pyiceberg's expire_snapshots). Maintenance: a commit that loses a race
    is left to the next time."""
    exceptions = _pyiceberg().exceptions
    properties = table.metadata.properties
    max_age = int(properties.get(MAX_SNAPSHOT_AGE, _ICEBERG_MAX_SNAPSHOT_AGE_MS))
    keep = max(1, int(properties.get(MIN_SNAPSHOTS, _ICEBERG_MIN_SNAPSHOTS)))
    newest_first = sorted(table.snapshots(), key=lambda s: s.timestamp_ms, reverse=True)
    expired = [s.snapshot_id for s in newest_first[keep:] if s.timestamp_ms < now_ms - max_age]
    if not expired:
        return
    try:
        _without_retries(table).maintenance.expire_snapshots().by_ids(expired).commit()
    except (exceptions.CommitFailedException, exceptions.CommitStateUnknownException, ValueError):
        return  # ValueError: a snapshot became protected (a new ref) meanwhile


def published_version(table: Any, store_id: str) -> int:
    """The newest store version a snapshot of ``table`` records for ``store_id`` (-1: none).
    Versions only grow, so the newest snapshots, which are never expired first, decide."""
    newest = -1
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if summary is not None and summary.get(STORE_PROPERTY) == store_id:
            newest = max(newest, int(summary.get(VERSION_PROPERTY, -1)))
    return newest


def _without_retries(table: Any) -> Any:
    """``table`` as a handle whose commits fail on a conflict instead of being retried.

    pyiceberg retries a commit that lost a race by appending its files again on top of the
    winner's snapshot (``commit.retry.num-retries``, 4 by default): a second publisher of the
    same window would then add its files twice. This handle reads that property as 0, for this
    publisher only (the property is read from the handle, never written to the table), so the
    loser fails, reads the table again and finds the winner's snapshot."""
    from pyiceberg.table import Table, TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    return Table(
        table.name(),
        table.metadata.model_copy(update={"properties": properties}),
        table.metadata_location,
        table.io,
        table.catalog,
    )


def _transaction(table: Any) -> Any:
    """A transaction on ``table`` that works out its pending metadata once per change.

    pyiceberg's ``Transaction.table_metadata`` applies the staged updates to the table's
    metadata and deep-copies the result each time it is read, and one ``add_files`` reads it
    about seventeen times: that copying was two thirds of a window's Iceberg commit, and grows
    with the table's history. Staging replaces the tuple of updates with a longer one, so a
    result stays right while the table's metadata and that tuple are the same objects."""
    return _memo_transaction_class()(table)


@functools.cache
def _memo_transaction_class() -> type:
    from pyiceberg.table import Transaction
    from pyiceberg.table.metadata import TableMetadata

    class MemoTransaction(Transaction):  # type: ignore[misc]
        _memo: tuple[object, object, TableMetadata] | None = None

        @property
        def table_metadata(self) -> TableMetadata:
            base, updates = self._table.metadata, self._updates
            memo = self._memo
            if memo is None or memo[0] is not base or memo[1] is not updates:
                memo = (base, updates, super().table_metadata)
                self._memo = memo
            return memo[2]

    return MemoTransaction


def _shape(catalog: Any, schema: pa.Schema) -> list[tuple[str, str]]:
    """An Arrow schema as Iceberg types, (column, type) pairs, nullability and ids aside."""
    converted = catalog._convert_schema_if_needed(schema)
    return [(field.name, _type_text(field.field_type)) for field in converted.fields]


def _type_text(kind: Any) -> str:
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(kind, StructType):
        return (
            "struct<"
            + ", ".join(f"{f.name}: {_type_text(f.field_type)}" for f in kind.fields)
            + ">"
        )
    if isinstance(kind, ListType):
        return f"list<{_type_text(kind.element_type)}>"
    if isinstance(kind, MapType):
        return f"map<{_type_text(kind.key_type)}, {_type_text(kind.value_type)}>"
    return str(kind)


def _file_io_properties(
    family: str, options: dict[str, Any], bounds: StorageBounds
) -> dict[str, str]:
    """The ``fs.*`` options of an S3 output as pyiceberg's file-access properties, with the
    storage's bounds on each request (pyarrow's S3 client retries a failed one itself, three
    attempts in all)."""
    if family != "s3":
        return {}
    names = {
        "endpoint_url": "s3.endpoint",
        "key": "s3.access-key-id",
        "secret": "s3.secret-access-key",
        "token": "s3.session-token",
        "region_name": "s3.region",
    }
    properties = {names[k]: str(v) for k, v in options.items() if k in names}
    properties["s3.connect-timeout"] = f"{bounds.connect_timeout:g}"
    properties["s3.request-timeout"] = f"{bounds.attempt:g}"
    if "s3.endpoint" in properties:
        # An S3-compatible server ignores the region; unset, pyarrow's file access spends
        # seconds asking AWS for the bucket's.
        properties.setdefault("s3.region", "us-east-1")
    return properties


def _bounded_glue(properties: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
    """A Glue catalog's properties with the storage's bounds on its client: pyiceberg makes it
    with ten attempts and botocore's 60 s timeouts, minutes for one silent request. A botocore
    session of ours carries the timeouts (its default client config, which the catalog's own
    config, retries only, is merged into); three attempts unless the user sets them."""
    from botocore.config import Config
    from botocore.session import Session

    if "botocore_session" in properties:
        return properties
    session = Session()
    session.set_default_client_config(
        Config(connect_timeout=bounds.connect_timeout, read_timeout=bounds.read_timeout)
    )
    return {"glue.max-retries": 3, **properties, "botocore_session": session}


def within(seconds: float, call: Callable[[], object]) -> None:
    """``call()`` in a thread of its own, given up after ``seconds`` (``TimeoutError``): a
    client with no deadline of its own (boto3's, SQLAlchemy's) cannot hold a query's start.
    The thread is a daemon: a call stuck past its own timeouts never keeps the process."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, name="dedup-catalog-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"no reply within {seconds:g} s")
    if outcome[0] is not None:
        raise outcome[0]


def _require_pyiceberg() -> None:
    """Refuse a missing extra at query start without importing it (a second, in a planner)."""
    if importlib.util.find_spec("pyiceberg") is None:
        raise missing_extra("iceberg", "pyiceberg", ImportError("No module named 'pyiceberg'"))


def _pyiceberg() -> Any:
    try:
        import pyiceberg.catalog
        import pyiceberg.exceptions
    except ImportError as exc:
        raise missing_extra("iceberg", "pyiceberg", exc) from exc
    return pyiceberg
