"""The four output ports on any fsspec filesystem: staging, publication, Spark's sink log.

Tasks write Parquet files under ``<path>/_staging/<query>-<batch>/<port>/`` (a ``_`` folder,
which Spark and pyarrow both skip). A committed window is *published* by moving its files into
``<path>/<port>/`` and then writing the port's entry in Spark's file-sink log
``<port>/_spark_metadata/<n>`` (its own contiguous sequence, compacted every ten entries as
Spark expects), so ``spark.read.parquet(port)`` sees whole windows only. Publication is
idempotent: it can be redone after a crash from the plan recorded in the store's manifest.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dedupsink.engine.classify import PORTS
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.settings import ERROR_COLUMN
from dedupsink.errors import StoreCorruptError

STAGING_DIR = "_staging"
SPARK_LOG_DIR = "_spark_metadata"
# A window's staging folder is flat (its ports' files and its staged keys side by side):
# a folder per port would cost a creation and a removal each, every window.
KEYS_SUFFIX = ".keys"
SPARK_LOG_COMPACT_INTERVAL = 10
_BLOCK_SIZE = 128 * 1024 * 1024
_URI_PATH_SAFE = "/:@&=+$,;!*'()"  # what a URI path may hold unescaped, besides [A-Za-z0-9_.~-]


def absolute_url(url: str) -> str:
    """``url`` with a local path made absolute (``file://``); other URLs are returned as given.

    Executors run in other working directories (a cluster's work dirs), so a relative path
    is resolved once, on the driver."""
    fs, path = fsspec.core.url_to_fs(url)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return str(fs.unstrip_protocol(path)) if "file" in protocols else url


def log_url(url: str) -> str:
    """A file URL as Spark's sink log must hold it: a URI whose path is percent-encoded.

    Spark reads each entry with ``new Path(new URI(path))``, so a space, ``%`` or ``#`` in the
    output path must be escaped as Hadoop's ``Path.toUri`` does, or the port cannot be read.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return quote(url, safe=_URI_PATH_SAFE)
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority}{slash}{quote(path, safe=_URI_PATH_SAFE)}"


def port_schema(port: str, schema: pa.Schema) -> pa.Schema:
    if port == "error":
        return schema.append(pa.field(ERROR_COLUMN, pa.string(), nullable=False))
    return schema


# Dictionary encoding pays off for repetitive columns (a user, a country) and is wasted on
# nearly distinct ones (ids, payloads, timestamps): Parquet tries it, overflows the dictionary
# page and falls back, which made writing a port file about 40% slower. A column's first rows
# decide, as in Spark's writer the first page does.
_DICTIONARY_SAMPLE_ROWS = 1024
_DICTIONARY_MAX_DISTINCT = 0.5


def dictionary_columns(data: pa.Table | pa.RecordBatch) -> list[str]:
    """The flat columns worth dictionary-encoding: few distinct values among the first rows."""
    sample = data.slice(0, _DICTIONARY_SAMPLE_ROWS)
    chosen = []
    for index, field in enumerate(sample.schema):
        if pa.types.is_nested(field.type) or sample.num_rows == 0:
            continue
        try:
            distinct = pc.count_distinct(sample.column(index), mode="all").as_py()
        except pa.ArrowException:
            continue  # a type Arrow cannot count (e.g. an extension type): plain encoding
        if distinct <= _DICTIONARY_MAX_DISTINCT * sample.num_rows:
            chosen.append(field.name)
    return chosen


def open_parquet_writer(handle: Any, first: pa.Table | pa.RecordBatch) -> pq.ParquetWriter:
    """The Parquet writer of every port file, with its encodings chosen from its first rows."""
    return pq.ParquetWriter(handle, first.schema, use_dictionary=dictionary_columns(first))


def _staged_stem(partition: int, attempt: int) -> str:
    """How a task's staged files begin: ``p<partition>-a<attempt>-<id>`` (the commit reads the
    partition back from the first field)."""
    return f"p{partition:05d}-a{attempt}-{uuid.uuid4().hex[:12]}"


class Output:
    """The output root of one sink; pickles as its URL."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Output, (self.url,))

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def staging(self, token: str) -> str:
        return f"{STAGING_DIR}/{token}"

    def new_staging_file(self, token: str, port: str, partition: int, attempt: int) -> str:
        return f"{STAGING_DIR}/{token}/{_staged_stem(partition, attempt)}.{port}.parquet"

    def write_unique_keys(self, token: str, partition: int, attempt: int, fps: Fingerprints) -> str:
        """Stage a task's new keys (16 bytes a key) in the order the commit's settlement reads
        them, so it can find a row by its key without reading or hashing the rows. The name
        carries the count: a task of another partition reading the file while it is being
        written can tell that it is not complete yet."""
        name = f"{_staged_stem(partition, attempt)}-n{len(fps)}{KEYS_SUFFIX}"
        relative = f"{STAGING_DIR}/{token}/{name}"
        full = self.path(relative)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(full, "wb") as handle:
            handle.write(fps.packed())
        return relative

    def read_unique_keys(self, relative: str, count: int) -> Fingerprints:
        data = self.fs.cat_file(self.path(relative))
        if len(data) != 16 * count:
            raise StoreCorruptError(
                self.path(relative), f"holds {len(data)} bytes for {count} keys of 16 bytes"
            )
        return Fingerprints.from_packed(data)

    def other_partitions_keys(self, token: str, partition: int, limit: int) -> Fingerprints | None:
        """Every key that tasks of other partitions of this window have staged so far (any
        attempt; files still being written are left out), or None when more than ``limit``
        such files are there (reading them all would cost more than it saves)."""
        try:
            names = self.fs.ls(self.path(f"{STAGING_DIR}/{token}"), detail=False)
        except FileNotFoundError:
            names = []
        others = []
        for name in names:
            if not name.endswith(KEYS_SUFFIX):
                continue
            fields = name.rsplit("/", 1)[-1].removesuffix(KEYS_SUFFIX).split("-")
            if len(fields) == 4 and fields[0] != f"p{partition:05d}" and fields[3][1:].isdigit():
                others.append((name, int(fields[3][1:])))
        if len(others) > limit:
            return None
        complete = [
            data for name, count in others if len(data := self.fs.cat_file(name)) == 16 * count
        ]
        return Fingerprints.from_packed(b"".join(complete))

    def write_table(self, relative: str, table: pa.Table | pa.RecordBatch) -> None:
        full = self.path(relative)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(full, "wb") as handle, open_parquet_writer(handle, table) as writer:
            writer.write(table)

    def read_table(self, relative: str) -> pa.Table:
        with self.fs.open(self.path(relative), "rb") as handle:
            return pq.read_table(handle)

    def port_files(self, port: str) -> list[str]:
        try:
            names = self.fs.ls(self.path(port), detail=False)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.rstrip("/").rsplit("/", 1)[-1].endswith(".parquet"))

    def has_windows(self) -> bool:
        """Whether a port already logs a window (every window logs an entry in every port)."""
        return any(self.fs.exists(self.path(f"{port}/{SPARK_LOG_DIR}/0")) for port in PORTS)

    # -- publication -----------------------------------------------------------------------

    def publish(self, plan: dict[str, Any]) -> None:
        """Move a committed window's files into its ports and log them; safe to repeat."""
        for source, target in plan["moves"]:
            self._move_once(source, target)
        for port, (log_id, files, *logged) in plan["logs"].items():
            self._write_log_entry(port, int(log_id), files, int(logged[0]) if logged else None)

    def _move_once(self, source: str, target: str) -> None:
        src, dst = self.path(source), self.path(target)
        if self.fs.exists(src):
            self.fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
            self.fs.mv(src, dst)
        elif not self.fs.exists(dst):
            raise FileNotFoundError(f"cannot publish {dst}: its staged file {src} is gone")

    def remove_staging(self, token: str) -> None:
        staging = self.path(self.staging(token))
        if self.fs.exists(staging):
            self.fs.rm(staging, recursive=True)

    def remove_stale_staging(self, keep: str) -> None:
        """Remove staged files of batches that never committed (failed queries, old attempts)."""
        try:
            tokens = self.fs.ls(self.path(STAGING_DIR), detail=False)
        except FileNotFoundError:
            return
        for full in tokens:
            if full.rstrip("/").rsplit("/", 1)[-1] != keep:
                self.fs.rm(full, recursive=True)

    # -- Spark's file-sink log -------------------------------------------------------------

    def _log_path(self, port: str, log_id: int) -> str:
        compact = (log_id + 1) % SPARK_LOG_COMPACT_INTERVAL == 0
        return self.path(f"{port}/{SPARK_LOG_DIR}/{log_id}{'.compact' if compact else ''}")

    def _write_log_entry(
        self, port: str, log_id: int, files: list[str], logged_before: int | None = None
    ) -> None:
        """Write entry ``log_id`` listing ``files``; a compaction entry also lists every file
        logged before (``logged_before`` of them, per the store, when the plan records it)."""
        target = self._log_path(port, log_id)
        if self.fs.exists(target):
            return
        lines = [self._status_line(relative) for relative in files]
        if target.endswith(".compact"):
            lines = self._entries_before(port, log_id, logged_before) + lines
        staged = f"{target.rsplit('/', 1)[0]}/.{log_id}.{uuid.uuid4().hex[:8]}.tmp"
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(staged, ("v1\n" + "\n".join(lines)).encode())
        self.fs.mv(staged, target)

    def _status_line(self, relative: str) -> str:
        full = self.path(relative)
        info = self.fs.info(full)
        modified = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
        if not isinstance(modified, int | float):
            modified = modified.timestamp()
        status = {
            "path": log_url(str(self.fs.unstrip_protocol(full))),
            "size": int(info.get("size") or 0),
            "isDir": False,
            "modificationTime": int(float(modified) * 1000),
            "blockReplication": 1,
            "blockSize": _BLOCK_SIZE,
            "action": "add",
        }
        return json.dumps(status, separators=(",", ":"))

    def _entries_before(self, port: str, log_id: int, logged_before: int | None) -> list[str]:
        """Every entry logged before ``log_id``: the last compaction and the deltas after it.

        A compaction copies them forward and Spark's readers stop reading what it replaces, so
        each is checked first: damage is refused here, naming the entry, instead of being
        copied forward or silently hiding files from Spark's readers. Every line must be a file
        status; a delta's files must be in the port with their logged sizes; the count must be
        what the store published before (a lost line leaves valid JSON behind)."""
        start = max(log_id - SPARK_LOG_COMPACT_INTERVAL, 0)
        lines: list[str] = []
        for earlier in range(start, log_id):
            entry = self.read_log_entry(port, earlier)
            if not self._log_path(port, earlier).endswith(".compact"):
                self._check_logged_files(port, earlier, [status for _, status in entry])
            lines.extend(line for line, _ in entry)
        if logged_before is not None and len(lines) != logged_before:
            raise StoreCorruptError(
                self._suspect_entry(port, start, log_id),
                f"Spark's sink log entries {start} to {log_id - 1} of port {port} list "
                f"{len(lines)} files, but {logged_before} were published before entry {log_id}",
            )
        return lines

    def read_log_entry(self, port: str, log_id: int) -> list[tuple[str, dict[str, Any]]]:
        """The lines of one sink log entry with their file statuses, checked for damage."""
        path = self._log_path(port, log_id)
        try:
            text = self.fs.cat_file(path).decode()
        except FileNotFoundError as exc:
            raise StoreCorruptError(path, "Spark's sink log entry is missing") from exc
        except UnicodeDecodeError as exc:
            raise StoreCorruptError(path, f"Spark's sink log entry is not text: {exc}") from exc
        lines = text.split("\n")
        if lines[0] != "v1":
            raise StoreCorruptError(path, "Spark's sink log entry does not start with 'v1'")
        numbered = [(number, line) for number, line in enumerate(lines[1:], 2) if line.strip()]
        # One parse of all lines (a compaction holds every file the port ever logged); the
        # line-by-line parse below runs only to name a damaged line.
        try:
            statuses = json.loads("[" + ",".join(line for _, line in numbered) + "]")
        except ValueError:
            statuses = None
        if (
            isinstance(statuses, list)
            and len(statuses) == len(numbered)
            and all(_is_file_status(status) for status in statuses)
        ):
            return [(line, status) for (_, line), status in zip(numbered, statuses, strict=True)]
        for number, line in numbered:
            try:
                status = json.loads(line)
            except ValueError:
                status = None
            if not _is_file_status(status):
                raise StoreCorruptError(path, f"line {number} is not a file status: {line[:200]!r}")
        raise StoreCorruptError(path, "Spark's sink log entry does not parse line by line")

    def _check_logged_files(self, port: str, log_id: int, statuses: list[dict[str, Any]]) -> None:
        for status in statuses:
            name = status["path"].rsplit("/", 1)[-1]
            try:
                size = int(self.fs.info(self.path(f"{port}/{name}")).get("size") or 0)
            except FileNotFoundError:
                size = None
            if size != status["size"]:
                raise StoreCorruptError(
                    self._log_path(port, log_id),
                    f"it lists {name} of {status['size']} bytes; the port holds "
                    + ("no such file" if size is None else f"{size} bytes"),
                )

    def _suspect_entry(self, port: str, start: int, end: int) -> str:
        """The entry that lost a line: the one listing other files of the unlisted files'
        window (or an empty one); the log directory when that cannot be told."""
        listed: dict[int, set[str]] = {}
        for log_id in range(start, end):
            names = {s["path"].rsplit("/", 1)[-1] for _, s in self.read_log_entry(port, log_id)}
            listed[log_id] = names
        everything = set().union(*listed.values())
        windows = {
            _window_of_part(n.rsplit("/", 1)[-1])
            for n in self.port_files(port)
            if n.rsplit("/", 1)[-1] not in everything
        }
        for log_id, names in listed.items():
            if {_window_of_part(n) for n in names} & windows:
                return self._log_path(port, log_id)
        empty = [log_id for log_id, names in listed.items() if not names]
        if len(empty) == 1:
            return self._log_path(port, empty[0])
        return self.path(f"{port}/{SPARK_LOG_DIR}")

    def log_entry_matches(
        self, port: str, log_id: int, files: list[str], logged_before: int | None
    ) -> bool:
        """Whether entry ``log_id`` is intact and lists ``files`` (after ``logged_before``
        earlier ones, for a compaction) with the sizes they have in the port."""
        try:
            statuses = [status for _, status in self.read_log_entry(port, log_id)]
            names = [f.rsplit("/", 1)[-1] for f in files]
            sizes = {s["path"].rsplit("/", 1)[-1]: s for s in statuses}
            self._check_logged_files(port, log_id, [sizes[n] for n in names if n in sizes])
        except StoreCorruptError:
            return False
        if not self._log_path(port, log_id).endswith(".compact"):
            return sorted(sizes) == sorted(names) and len(statuses) == len(names)
        expected = None if logged_before is None else logged_before + len(names)
        return set(names) <= set(sizes) and expected in (None, len(statuses))

    def rewrite_log_entry(
        self, port: str, log_id: int, files: list[str], logged_before: int | None
    ) -> None:
        """Replace entry ``log_id`` (damaged or missing) with one listing ``files``."""
        target = self._log_path(port, log_id)
        if self.fs.exists(target):
            self.fs.rm_file(target)
        self._write_log_entry(port, log_id, files, logged_before)

    def logged_files(self, port: str) -> list[str]:
        """The files Spark's log lists for a port (as the log's own URLs)."""
        try:
            names = self.fs.ls(self.path(f"{port}/{SPARK_LOG_DIR}"), detail=False)
        except FileNotFoundError:
            return []
        ids = sorted(
            int(n.rsplit("/", 1)[-1].split(".")[0])
            for n in names
            if n.rsplit("/", 1)[-1].split(".")[0].isdigit()
        )
        if not ids:
            return []
        latest = ids[-1]
        first = latest - (latest + 1) % SPARK_LOG_COMPACT_INTERVAL
        paths: list[str] = []
        for log_id in range(max(first, 0), latest + 1):
            paths.extend(status["path"] for _, status in self.read_log_entry(port, log_id))
        return paths


def _window_of_part(name: str) -> int:
    """The window number of a published file ``part-<window>-...``; -1 for other names."""
    parts = name.split("-")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "part" and parts[1].isdigit() else -1


@dataclass
class PortFile:
    """A staged Parquet file of one port with its row count."""

    port: str
    path: str
    rows: int


class PortWriters:
    """One lazily opened Parquet writer per port for one task attempt."""

    def __init__(self, output: Output, token: str, partition: int, attempt: int) -> None:
        self.output = output
        self.token = token
        self.partition = partition
        self.attempt = attempt
        self._open: dict[str, tuple[Any, pq.ParquetWriter, PortFile]] = {}

    def write(self, port: str, batch: pa.RecordBatch) -> None:
        if port not in self._open:
            relative = self.output.new_staging_file(self.token, port, self.partition, self.attempt)
            full = self.output.path(relative)
            self.output.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
            handle = self.output.fs.open(full, "wb")
            writer = open_parquet_writer(handle, batch)
            self._open[port] = (handle, writer, PortFile(port, relative, 0))
        _, writer, record = self._open[port]
        writer.write_batch(batch)
        record.rows += batch.num_rows

    def close(self) -> list[PortFile]:
        files = []
        for handle, writer, record in self._open.values():
            writer.close()
            handle.close()
            files.append(record)
        self._open.clear()
        return files

    def discard(self) -> None:
        for handle, writer, _ in self._open.values():
            try:
                writer.close()
            finally:
                handle.close()
        self._open.clear()


def _is_file_status(status: Any) -> bool:
    return (
        isinstance(status, dict)
        and isinstance(status.get("path"), str)
        and isinstance(status.get("size"), int)
        and status.get("action") == "add"
    )


def port_order(files: Iterable[PortFile]) -> dict[str, list[PortFile]]:
    grouped: dict[str, list[PortFile]] = {port: [] for port in PORTS}
    for record in files:
        grouped[record.port].append(record)
    return grouped
