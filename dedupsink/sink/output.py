"""The four output ports on any supported filesystem: staged files and their publication.

Tasks write each port's rows as Parquet under
``<path>/_staging/w<version>-<query>-<batch>-<run>/`` (a ``_`` folder, which Spark and pyarrow
both skip), one flat folder per window. A committed window is *published* from its
``Publication`` record: every staged file made readable under its final name in
``<path>/<port>/`` (``Storage.publish``: a rename, or a server-side copy on object stores), then
one Spark sink-log entry per port, so ``spark.read.parquet(port)`` sees whole windows only and
``pyarrow.dataset`` never sees a staged file. Publication is idempotent and deterministic: it
can be redone after a crash, or by two processes at once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from dedupsink.engine.classify import PORTS
from dedupsink.options import PATH
from dedupsink.sink.parquet import open_parquet_writer, read_parquet
from dedupsink.sink.sparklog import SPARK_LOG_DIR, PortLog
from dedupsink.store.records import Publication
from dedupsink.store.storage import Storage, basename, join

STAGING_DIR = "_staging"


def absolute_url(url: str) -> str:
    """``url`` with a local path made absolute (``file://``); other URLs are returned as given.

    Executors run in other working directories (a cluster's work dirs), so a relative path
    is resolved once, on the driver."""
    if "://" in url:
        return url
    from fsspec.implementations.local import make_path_posix

    return "file://" + make_path_posix(url)


def staged_stem(partition: int, attempt: int) -> str:
    """How a task's staged files begin: ``p<partition>-a<attempt>-<id>`` (the commit reads the
    partition back from the first field)."""
    return f"p{partition:05d}-a{attempt}-{uuid.uuid4().hex[:12]}"


@dataclass
class PortFile:
    """A staged Parquet file of one port: its path (relative to the output root), rows, bytes."""

    port: str
    path: str
    rows: int
    size: int


class Output:
    """The output root of one sink; pickles as its URL and storage options."""

    def __init__(
        self, url: str, storage_options: dict[str, Any] | None = None, option: str = PATH
    ) -> None:
        self.storage = Storage.for_url(url.rstrip("/"), storage_options, option)
        self.url = self.storage.url

    def __reduce__(self) -> tuple[Any, ...]:
        return (Output, (self.url, self.storage.options))

    def path(self, relative: str) -> str:
        return self.storage.path(relative)

    def file_url(self, relative: str) -> str:
        """The URL Spark's sink log lists for a file: the output URL's own scheme (``s3a://``
        stays ``s3a://`` for Spark's S3A reader), ``file://`` for local paths."""
        full = self.storage.full_url(self.path(relative))
        scheme, separator, _ = self.url.partition("://")
        current, _, rest = full.partition("://")
        aliases = self.storage.protocol_names()
        if separator and scheme != current and {scheme, current} <= aliases:
            return f"{scheme}://{rest}"
        return full

    # -- staging -----------------------------------------------------------------------------

    def new_staging_file(self, folder: str, port: str, partition: int, attempt: int) -> str:
        return f"{folder}/{staged_stem(partition, attempt)}.{port}.parquet"

    def open_staged(self, relative: str) -> IO[bytes]:
        return self.storage.open_write(self.path(relative))

    def write_table(self, relative: str, table: pa.Table | pa.RecordBatch) -> int:
        """Write a staged Parquet file; returns its size in bytes."""
        with self.open_staged(relative) as handle:
            with open_parquet_writer(handle, table) as writer:
                writer.write(table)
            return int(handle.tell())

    def read_table(self, relative: str) -> pa.Table:
        with self.storage.fs.open(self.path(relative), "rb") as handle:
            return read_parquet(handle)

    def discard_staging(self, folder: str, known: list[str]) -> None:
        """Remove a window's staging folder, whose files are ``known`` (relative paths)."""
        self.storage.discard_folder(self.path(folder), [self.path(relative) for relative in known])

    def remove_stale_staging(self, version: int) -> None:
        """Remove the staging folders of windows up to ``version``: committed and published, or
        classified against a version that is no longer the latest, so never committable (a
        version is created once). Later windows' folders may belong to running tasks."""
        root = self.path(STAGING_DIR)
        files = self.storage.find(root)
        stale = [f for f in files if staging_window(f[len(root) + 1 :]) <= version]
        self.storage.delete(stale)
        for name in self.storage.folders(root):  # what folders are left where folders exist
            if staging_window(name) <= version:
                self.storage.delete_folder(self.path(f"{STAGING_DIR}/{name}"))

    # -- the ports ---------------------------------------------------------------------------

    def port_files(self, port: str) -> list[str]:
        names = self.storage.entries(self.path(port))
        return sorted(self.path(f"{port}/{name}") for name in names if name.endswith(".parquet"))

    def has_windows(self) -> bool:
        """Whether a port already logs a window (every window logs an entry in every port)."""
        return any(PortLog(self, port).exists(0) for port in PORTS)

    # -- publication -------------------------------------------------------------------------

    def publish(self, publication: Publication) -> None:
        """Make a committed window readable: its files, then its log entries; safe to repeat."""
        for move in publication.moves:
            self.storage.publish(self.path(move.staged), self.path(move.target), move.size)
        for entry in publication.entries:
            PortLog(self, entry.port).write(entry, publication)

    def moved(self, publication: Publication) -> bool:
        """Whether every file of a publication is in place under its final name."""
        return all(self.storage.exists(self.path(move.target)) for move in publication.moves)

    def is_published(self, publication: Publication) -> bool:
        """Whether a publication completed: its last log entry, written last, is there."""
        last = publication.entries[-1]
        return PortLog(self, last.port).exists(last.log_id)


class PortWriters:
    """One lazily opened Parquet writer per port for one task attempt; ``roll`` closes a port's
    file so that its next rows start another (a task's unique rows are one file per chunk)."""

    def __init__(self, output: Output, folder: str, partition: int, attempt: int) -> None:
        self.output = output
        self.folder = folder
        self.partition = partition
        self.attempt = attempt
        self._open: dict[str, tuple[IO[bytes], pq.ParquetWriter, PortFile]] = {}
        self._closed: list[PortFile] = []

    def write(self, port: str, batch: pa.RecordBatch | pa.Table) -> None:
        if port not in self._open:
            relative = self.output.new_staging_file(self.folder, port, self.partition, self.attempt)
            handle = self.output.open_staged(relative)
            writer = open_parquet_writer(handle, batch)
            self._open[port] = (handle, writer, PortFile(port, relative, 0, 0))
        _, writer, record = self._open[port]
        writer.write(batch)
        record.rows += batch.num_rows

    def roll(self, port: str) -> None:
        """Close ``port``'s file (a later write opens a new one)."""
        if port in self._open:
            handle, writer, record = self._open.pop(port)
            writer.close()
            record.size = int(handle.tell())
            handle.close()
            self._closed.append(record)

    def closed(self, port: str) -> list[PortFile]:
        """``port``'s closed files, in the order they were written."""
        return [record for record in self._closed if record.port == port]

    def replace(self, old: PortFile, rows: pa.Table) -> None:
        """Put a file of ``rows`` in the place of the closed file ``old`` (none if no rows)."""
        at = self._closed.index(old)
        if not rows.num_rows:
            del self._closed[at]
            return
        relative = self.output.new_staging_file(self.folder, old.port, self.partition, self.attempt)
        size = self.output.write_table(relative, rows)
        self._closed[at] = PortFile(old.port, relative, rows.num_rows, size)

    def close(self) -> list[PortFile]:
        for port in list(self._open):
            self.roll(port)
        return list(self._closed)

    def discard(self) -> None:
        for handle, writer, _ in self._open.values():
            try:
                writer.close()
            finally:
                handle.close()
        self._open.clear()


def staging_folder(window: int, query_id: str, batch_id: int, run: str) -> str:
    """A window's staging folder, relative to the output root: ``_staging/w<window>-<query>-
    <batch>-<run>`` (the window is the version its tasks' commit would create). A restarted
    query runs the batch again in a folder of its own: tasks settle with the keys staged in
    their folder, and a dead run's keys, of rows partitioned otherwise, must not be among them."""
    return f"{STAGING_DIR}/w{window:010d}-{query_id}-{batch_id}-{run}"


def staging_window(name: str) -> int:
    """The window of a staging folder's name; -1 for a name of another form."""
    head = name.split("-", 1)[0]
    return int(head[1:]) if head.startswith("w") and head[1:].isdigit() else -1


def spark_log_folder(port: str) -> str:
    return join(port, SPARK_LOG_DIR)


def part_window(name: str) -> int:
    """The window number of a published file ``part-<window>-...``; -1 for other names."""
    parts = basename(name).split("-")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "part" and parts[1].isdigit() else -1
