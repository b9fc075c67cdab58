"""Delta Lake ports: each port a Delta table at ``<path>/<port>``.

Tasks write their Parquet files straight into the table's folder (a file no Delta commit names
is invisible). Publishing a window is one Delta commit per port with rows, carrying the
application transaction ``dedupsink-<store id>-<port>`` at the store version, so a redone
publication finds it and adds nothing. When this process made the table's latest commit, the
next log entry is written by the storage's conditional create (one request); otherwise, or
after a conflict, delta-rs reads the table and commits without retrying.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, quote

import pyarrow as pa

from dedupsink.engine.classify import PORTS
from dedupsink.errors import DedupOptionError, PortTableError
from dedupsink.options import PATH
from dedupsink.ports.base import PortFormat, missing_extra, recorded_schema, table_schema
from dedupsink.ports.evolution import DELTA_WIDENING, check_evolution
from dedupsink.ports.output import FileStats, Layout, staging_batch
from dedupsink.ports.stats import StatsColumns
from dedupsink.runtime import RUNTIME
from dedupsink.store.records import Move, Publication
from dedupsink.store.storage import Storage, StorageBounds
from dedupsink.version import __version__

# A commit that lost a race reads the table again; a loser finds the winner's transaction, so
# more than a few rounds means another writer keeps committing other data to the port table.
_COMMIT_ROUNDS = 8
# Configuration of the tables the sink creates: a checkpoint every 10 commits, as Spark's Delta
# writes them (delta-rs's default is 100), so a commit, which replays the log from the last
# checkpoint, reads at most ten commits (on S3, ten requests).
CHECKPOINT_INTERVAL = 10
TABLE_CONFIGURATION = {"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}
# Each table's latest commit where this process made it (by table URI): its log version and
# the store and window it published. The next commit is the conditional create of the entry
# after it.
_own_commits: dict[str, OwnCommit] = RUNTIME.cache("ports.delta_own_commits", dict)
# Who wrote a commit, as Delta's commitInfo names it (Spark: "Apache-Spark/<v> Delta-Lake/<v>").
ENGINE_INFO = f"dedupsink/{__version__}"
# The writer features a blind append of files honours as it is (a table of writer version 7).
_APPEND_WRITER_FEATURES = frozenset({"appendOnly", "timestampNtz"})
# The tables this process has read, by URI and storage options: brought up to date with the
# commits since (one listing of the log) instead of read again from the last checkpoint, a
# read that grows to a hundred commits between checkpoints. The driver's commit process lives
# as long as the query.
_tables: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = RUNTIME.cache(
    "ports.delta_tables", dict
)
# (table URI, recorded schema) pairs whose table is known to declare every column of that
# schema: a table's columns are only ever added to, so a port without rows in a window is not
# read again to learn that its table already has the window's columns.
_covered: set[tuple[str, bytes]] = RUNTIME.cache("ports.delta_covered", set)


@dataclass(frozen=True)
class OwnCommit:
    """The table version this process committed last, and the store window it published."""

    table_version: int
    store_id: str
    version: int  # the store version it published
    metadata: dict[str, Any] | None = None  # the table's metaData after it (None: not known)


class DeltaPorts(PortFormat):
    """``outputFormat=delta``: each port a Delta Lake table."""

    name = "delta"
    layout = Layout(in_table=True)
    address_heading = "Delta tables"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage_options = delta_storage_options(self.output.storage)

    def table_uri(self, port: str) -> str:
        storage = self.output.storage
        path = self.output.path(port)
        return path if storage.family == "local" else storage.full_url(path)

    def app_id(self, store_id: str, port: str) -> str:
        return f"dedupsink-{store_id}-{port}"

    # -- at query start --------------------------------------------------------------------------

    def check_tables(self, schema: pa.Schema) -> None:
        deltalake = _deltalake()
        if self.output.storage.family == "memory":
            raise DedupOptionError(
                PATH,
                self.options.path,
                "a filesystem other processes reach with outputFormat=delta (delta-rs cannot "
                "see fsspec's memory://)",
            )
        for port in PORTS:
            table = self._table(deltalake, port)
            if table is not None:
                self._check_schema(deltalake, table, port, schema)

    def create_tables(self, schema: pa.Schema) -> None:
        deltalake = _deltalake()
        for port in PORTS:
            if self._table(deltalake, port) is not None:
                continue
            try:
                deltalake.DeltaTable.create(
                    self.table_uri(port),
                    table_schema(port, schema),
                    mode="ignore",
                    configuration=TABLE_CONFIGURATION,
                    storage_options=self.storage_options,
                )
            except deltalake.exceptions.DeltaError as exc:
                if self._table(deltalake, port) is None:  # else another process created it
                    raise PortTableError(
                        f"cannot create the Delta table {self.table_uri(port)}: {exc}"
                    ) from exc

    def _table(self, deltalake: Any, port: str) -> Any:
        """The port's table at its latest version, or None if there is none yet."""
        uri = self.table_uri(port)
        key = (uri, tuple(sorted(self.storage_options.items())))
        try:
            table = _tables.get(key)
            if table is None:
                table = deltalake.DeltaTable(uri, storage_options=self.storage_options)
                _tables[key] = table
            else:
                table.update_incremental()
            return table
        except deltalake.exceptions.TableNotFoundError:
            return None
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            _tables.pop(key, None)
            raise PortTableError(f"cannot read the Delta table {uri}: {exc}") from exc

    def _check_schema(self, deltalake: Any, table: Any, port: str, schema: pa.Schema) -> None:
        """An input whose columns differ is refused, or with ``mergeSchema=true`` taken as
        the window's commit will add its new columns (``evolution.check_evolution``)."""
        wanted = _shape(deltalake.Schema.from_arrow(table_schema(port, schema)))
        found = _shape(table.schema())
        required = frozenset(
            f["name"] for f in json.loads(table.schema().to_json())["fields"] if not f["nullable"]
        )
        check_evolution(
            self.name,
            f"the Delta table {self.table_uri(port)}",
            wanted,
            found,
            required,
            self.options.merge_schema,
            DELTA_WIDENING,
        )

    def file_stats(self) -> FileStats:
        """Each table's stats columns, by its ``delta.dataSkipping*`` properties (delta-rs's
        defaults for a table not created yet)."""
        deltalake = _deltalake()
        chosen = []
        for port in PORTS:
            table = self._table(deltalake, port)
            configuration = {} if table is None else table.metadata().configuration
            chosen.append((port, StatsColumns.of_configuration(configuration)))
        return tuple(chosen)

    def has_windows(self) -> bool:
        deltalake = _deltalake()
        for port in PORTS:
            table = self._table(deltalake, port)
            if table is not None and table.version() > 0:
                return True
        return False

    # -- the commit ------------------------------------------------------------------------------

    def publish_tables(self, publication: Publication, store_id: str) -> None:
        """One commit per port table, the four side by side: each is a table of its own, and
        in a steady stream each commit is one request (on an object store, one round trip for
        all four instead of four one after another)."""
        deltalake = _deltalake()
        self.output.storage.together(
            partial(self._publish_port, deltalake, port, publication, store_id) for port in PORTS
        )

    def _publish_port(
        self, deltalake: Any, port: str, publication: Publication, store_id: str
    ) -> None:
        files = publication.files_of(port)
        # A port without rows still takes the window's new columns, in a commit of its own
        # adding no file, so that every port table declares them from that window on.
        if files or self._lacks_columns(deltalake, port, publication):
            self._commit(deltalake, port, files, publication, store_id)

    def is_published(self, publication: Publication, store_id: str) -> bool:
        deltalake = _deltalake()
        for port in PORTS:
            if publication.files_of(port):
                table = self._table(deltalake, port)
                if table is None or not self._committed(table, store_id, port, publication):
                    return False
            elif self._lacks_columns(deltalake, port, publication):
                return False
        return True

    def _lacks_columns(self, deltalake: Any, port: str, publication: Publication) -> bool:
        """Whether the port's table lacks a column of the window's recorded schema: known from
        this process's last commit or read of it, else read."""
        if publication.schema is None:
            return False
        uri = self.table_uri(port)
        if (uri, publication.schema) in _covered:
            return False
        table = self._table(deltalake, port)
        if table is None:
            return False  # created at the next start, with the input's columns
        if _merged_metadata(_metadata_of(table), publication, port) is not None:
            return True
        _covered.add((uri, publication.schema))
        return False

    def _committed(self, table: Any, store_id: str, port: str, publication: Publication) -> bool:
        version = table.transaction_version(self.app_id(store_id, port))
        return version is not None and version >= publication.version

    def _commit(
        self,
        deltalake: Any,
        port: str,
        files: list[Move],
        publication: Publication,
        store_id: str,
    ) -> None:
        uri = self.table_uri(port)
        own = _own_commits.get(uri)
        if own is not None and own.store_id == store_id:
            if own.version >= publication.version:
                return  # published by this process: windows are published in order
            known = own.metadata
            if (known is not None or publication.schema is None) and self._append(
                port, own.table_version + 1, files, publication, store_id, known
            ):
                return
        _own_commits.pop(uri, None)  # another writer committed: read the table again
        for _ in range(_COMMIT_ROUNDS):
            table = self._table(deltalake, port)
            if table is None:
                raise PortTableError(f"the Delta table {self.table_uri(port)} is gone")
            if self._committed(table, store_id, port, publication):
                return
            self._check_protocol(table, port)
            # The conditional create of the entry after the one read, as delta-rs commits
            # without retrying: a loser reads the table again.
            metadata = _metadata_of(table)
            if self._append(port, table.version() + 1, files, publication, store_id, metadata):
                return
        raise PortTableError(
            f"the Delta table {self.table_uri(port)} kept changing under the commit of window "
            f"{publication.version} ({_COMMIT_ROUNDS} rounds): another writer is committing to it"
        )

    def _check_protocol(self, table: Any, port: str) -> None:
        """Refuse a table whose protocol asks writers for more than a blind append of files
        honours (constraints, generated columns, column mapping, ...)."""
        protocol = table.protocol()
        version = protocol.min_writer_version
        features = set(protocol.writer_features or ())
        if version <= 2 or (version == 7 and features <= _APPEND_WRITER_FEATURES):
            return
        asked = ", ".join(sorted(features - _APPEND_WRITER_FEATURES)) or f"writer version {version}"
        raise PortTableError(
            f"the Delta table {self.table_uri(port)} asks its writers for {asked}, which the "
            "sink's appends do not honour; it writes tables of writer version 2 or with the "
            f"writer features {', '.join(sorted(_APPEND_WRITER_FEATURES))}"
        )

    def _append(
        self,
        port: str,
        version: int,
        files: list[Move],
        publication: Publication,
        store_id: str,
        metadata: dict[str, Any] | None,
    ) -> bool:
        """Write the window's commit as log entry ``version`` if it does not exist yet; on a
        table whose metaData is ``metadata``, with a new one where the window's recorded schema
        has columns the table lacks (the same entry: a reader sees the columns and the rows
        together)."""
        path = self.output.path(f"{port}/_delta_log/{version:020d}.json")
        uri = self.table_uri(port)
        merged = None
        if metadata is not None and (uri, publication.schema) not in _covered:
            merged = _merged_metadata(metadata, publication, port)
        app_id = self.app_id(store_id, port)
        entry = commit_entry(app_id, port, files, publication, store_id, merged)
        try:
            self.output.storage.create(path, entry)
        except FileExistsError:
            return False
        after = merged or metadata
        _own_commits[uri] = OwnCommit(version, store_id, publication.version, after)
        if publication.schema is not None and after is not None:
            _covered.add((uri, publication.schema))
        if (version + 1) % CHECKPOINT_INTERVAL == 0:
            self._checkpoint(port)
        return True

    def _checkpoint(self, port: str) -> None:
        """A checkpoint of the table's latest version, written by delta-rs (a commit written
        here has no post-commit hook to write it)."""
        deltalake = _deltalake()
        table = self._table(deltalake, port)
        if table is None:
            return
        try:
            table.create_checkpoint()
        except deltalake.exceptions.DeltaError as exc:
            raise PortTableError(
                f"cannot write a checkpoint of the Delta table {self.table_uri(port)}: {exc}"
            ) from exc

    # -- operating -------------------------------------------------------------------------------

    def describe(self, port: str, store_id: str) -> dict[str, Any]:
        table = self._table(_deltalake(), port)
        if table is None:
            return {"table": self.table_uri(port), "table_version": None}
        return {
            "table": self.table_uri(port),
            "table_version": table.version(),
            "published_version": table.transaction_version(self.app_id(store_id, port)),
        }


def commit_entry(
    app_id: str,
    port: str,
    files: list[Move],
    publication: Publication,
    store_id: str,
    metadata: dict[str, Any] | None = None,
) -> bytes:
    """A Delta log entry adding ``files`` to ``port``'s table with the window's application
    transaction: the actions of a blind append as Spark's Delta writer makes one (one JSON
    object a line), and, where the window adds columns, the table's new ``metaData`` (as
    Spark's writer does with ``mergeSchema``)."""
    at = publication.modified_ms
    info = commit_info(files, publication, store_id)
    actions: list[dict[str, Any]] = [
        {"commitInfo": info},
        {"txn": {"appId": app_id, "version": publication.version, "lastUpdated": at}},
    ]
    if metadata is not None:
        info["isBlindAppend"] = False  # it reads and changes the table's schema
        actions.append({"metaData": metadata})
    for move in files:
        add = {
            "path": quote(move.target[len(port) + 1 :]),
            "partitionValues": {},
            "size": move.size or 0,
            "modificationTime": at,
            "dataChange": True,
            "stats": _stats(move),
        }
        actions.append({"add": add})
    return "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions).encode()


def commit_info(files: list[Move], publication: Publication, store_id: str) -> dict[str, Any]:
    """The commitInfo of a window's append: Spark's for a WRITE in append mode (its metrics as
    strings, as Spark writes them), the engine, and the store window and the query and batch it
    came from (``DeltaTable.history()`` shows every field)."""
    info: dict[str, Any] = {
        "timestamp": publication.modified_ms,
        "operation": "WRITE",
        "operationParameters": {"mode": "Append", "partitionBy": "[]"},
        "isolationLevel": "Serializable",
        "isBlindAppend": True,
        "operationMetrics": {
            "numFiles": str(len(files)),
            "numOutputRows": str(sum(move.rows or 0 for move in files)),
            "numOutputBytes": str(sum(move.size or 0 for move in files)),
        },
        "engineInfo": ENGINE_INFO,
        "clientVersion": ENGINE_INFO,
        "dedupsink.store": store_id,
        "dedupsink.version": str(publication.version),
    }
    batch = staging_batch(publication.folder)
    if batch is not None:
        info["dedupsink.query"], info["dedupsink.batch"] = batch[0], str(batch[1])
    return info


def _metadata_of(table: Any) -> dict[str, Any]:
    """A table's current metaData action, as its log holds it."""
    meta = table.metadata()
    return {
        "id": meta.id,
        "name": meta.name,
        "description": meta.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": table.schema().to_json(),
        "partitionColumns": list(meta.partition_columns),
        "configuration": dict(meta.configuration),
        "createdTime": meta.created_time,
    }


def _merged_metadata(
    metadata: dict[str, Any], publication: Publication, port: str
) -> dict[str, Any] | None:
    """``metadata`` with the columns of the window's recorded schema its table lacks added at
    the end, nullable; None if it has them all (or the window recorded no schema). Types are
    not changed: a Delta table widens none (``evolution.DELTA_WIDENING``, checked at start)."""
    window = recorded_schema(publication)
    if window is None:
        return None
    schema = json.loads(metadata["schemaString"])
    have = {field["name"] for field in schema["fields"]}
    wanted = json.loads(_deltalake().Schema.from_arrow(table_schema(port, window)).to_json())
    new = [{**field, "nullable": True} for field in wanted["fields"] if field["name"] not in have]
    if not new:
        return None
    schema["fields"] = schema["fields"] + new
    return {**metadata, "schemaString": json.dumps(schema, separators=(",", ":"))}


def _deltalake() -> Any:
    try:
        import deltalake
        import deltalake.exceptions
    except ImportError as exc:
        raise missing_extra("delta", "deltalake", exc) from exc
    return deltalake


def _shape(schema: Any) -> list[tuple[str, str]]:
    """A Delta schema as (column, type) pairs, nullability aside (Spark marks the same column
    nullable in one query and not in another)."""
    fields = json.loads(schema.to_json())["fields"]
    return [(f["name"], _type_text(_without_nullability(f["type"]))) for f in fields]


def _type_text(kind: Any) -> str:
    """A Delta type as text: a primitive's name (``long``), a nested type's JSON."""
    return kind if isinstance(kind, str) else json.dumps(kind, sort_keys=True)


def _without_nullability(kind: Any) -> Any:
    if isinstance(kind, dict):
        return {
            key: _without_nullability(value)
            for key, value in kind.items()
            if key not in ("nullable", "containsNull", "valueContainsNull", "metadata")
        }
    if isinstance(kind, list):
        return [_without_nullability(item) for item in kind]
    return kind


def delta_storage_options(storage: Storage) -> dict[str, str]:
    """The sink's ``fs.*`` options (fsspec's names) as delta-rs storage options."""
    options = storage.options
    if storage.family == "s3":
        translated = _s3_options(options)
    elif storage.family == "azure":
        translated = _azure_options(options)
    elif storage.family == "gcs":
        translated = _gcs_options(options)
    else:
        return {}
    return {**_bounded(storage.bounds), **translated}


def _bounded(bounds: StorageBounds) -> dict[str, str]:
    """The storage's bounds as object_store's client and retry options, which delta-rs's
    requests follow: each request bounded, transient faults retried with backoff until the
    budget is spent."""
    return {
        "connect_timeout": f"{bounds.connect_timeout:g}s",
        "timeout": f"{bounds.attempt:g}s",
        "retry_timeout": f"{bounds.budget:g}s",
    }


_S3_NAMES = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
    "region_name": "AWS_REGION",
}


def _s3_options(options: dict[str, Any]) -> dict[str, str]:
    translated = {_S3_NAMES[k]: str(v) for k, v in options.items() if k in _S3_NAMES}
    if options.get("anon") is True:
        translated["AWS_SKIP_SIGNATURE"] = "true"
    return _with_defaults(translated, "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP")


def _azure_options(options: dict[str, Any]) -> dict[str, str]:
    """adlfs's options as delta-rs's: a connection string is split into its account, key,
    endpoint and signature (delta-rs takes none), and an ``http://`` endpoint is allowed."""
    translated: dict[str, str] = {}
    connection = options.get("connection_string")
    if connection:
        parts = dict(parse_qsl(str(connection).replace(";", "&"), keep_blank_values=True))
        names = {
            "AccountName": "account_name",
            "AccountKey": "account_key",
            "BlobEndpoint": "endpoint",
            "SharedAccessSignature": "azure_storage_sas_key",
        }
        translated.update({names[k]: v for k, v in parts.items() if k in names})
        if parts.get("DefaultEndpointsProtocol") == "http":
            translated["allow_http"] = "true"
    names = {
        "account_name": "account_name",
        "account_key": "account_key",
        "sas_token": "azure_storage_sas_key",
        "tenant_id": "azure_storage_tenant_id",
        "client_id": "azure_storage_client_id",
        "client_secret": "azure_storage_client_secret",
    }
    translated.update({names[k]: str(v) for k, v in options.items() if k in names})
    if options.get("anon") is True:
        translated["azure_skip_signature"] = "true"
    return _with_defaults(translated, "endpoint", "allow_http")


def _gcs_options(options: dict[str, Any]) -> dict[str, str]:
    translated: dict[str, str] = {}
    token = options.get("token")
    if isinstance(token, str) and token not in ("anon", "google_default", "cloud", "browser"):
        translated["GOOGLE_SERVICE_ACCOUNT"] = token
    return _with_defaults(translated, "", "")


def _with_defaults(translated: dict[str, str], endpoint: str, allow_http: str) -> dict[str, str]:
    """Options with an ``http://`` endpoint allowed."""
    if endpoint and translated.get(endpoint, "").startswith("http://"):
        translated[allow_http] = "true"
    return translated


def _stats(move: Move) -> str:
    """A file's add-action statistics: those its task worked out from the file's footer, or the
    row count alone (a publication recorded before the tasks worked them out)."""
    return move.stats or json.dumps({"numRecords": move.rows or 0})
