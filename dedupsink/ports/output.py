"""Where a task's port files go on any supported filesystem: the output root, staging, writers.

Tasks write each port's rows as Parquet files that no reader sees until the window's commit.
Where they go is the port format's ``Layout``: under the window's staging folder
``<path>/_staging/w<version>-<query>-<batch>-<run>/`` (a ``_`` folder, which Spark and pyarrow
both skip) for plain Parquet ports, which the commit then publishes under their final names;
straight into the table's folder for Delta and Iceberg, whose readers see only the files a
table commit names. Staged keys (``settle``) always go to the staging folder.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from dedupsink.options import PATH
from dedupsink.ports.encoding import dictionary_columns, open_parquet_writer, read_parquet
from dedupsink.ports.stats import StatsColumns, delta_stats
from dedupsink.store.storage import Storage, StorageBounds, basename

STAGING_DIR = "_staging"


def staged_stem(partition: int, attempt: int) -> str:
    """How a task's staged files begin: ``p<partition>-a<attempt>-<id>`` (the commit reads the
    partition back from the first field)."""
    return f"p{partition:05d}-a{attempt}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Layout:
    """Where a port format's tasks write their port files. ``in_table``: straight into the
    port's folder (under ``data_folder``), invisible until a table commit names them; else in
    the window's staging folder, published under final names by the commit."""

    in_table: bool = False
    data_folder: str = ""

    def staged_file(self, folder: str, port: str, stem: str) -> str:
        """A new port file's path, relative to the output root, for a task staging in
        ``folder`` (whose name carries the window) under the name stem ``stem``."""
        if not self.in_table:
            return f"{folder}/{stem}.{port}.parquet"
        window = staging_window(basename(folder))
        data = f"{port}/{self.data_folder}/" if self.data_folder else f"{port}/"
        return f"{data}part-{window:010d}-{stem}.parquet"


STAGED = Layout()


# Which columns of each port get Delta statistics in a file's add action, by port (None: the
# format keeps no per-file statistics of its own).
FileStats = tuple[tuple[str, StatsColumns], ...] | None


@dataclass
class PortFile:
    """A staged Parquet file of one port: its path (relative to the output root), rows, bytes,
    and the statistics its Delta add action carries (None for other formats)."""

    port: str
    path: str
    rows: int
    size: int
    stats: str | None = None


class Output:
    """The output root of one sink; pickles as its URL and storage options. ``file_stats``:
    the Delta statistics each port's files get, worked out from each file's footer as it is
    written."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        option: str = PATH,
        layout: Layout = STAGED,
        file_stats: FileStats = None,
        bounds: StorageBounds | None = None,
    ) -> None:
        self.storage = Storage.for_url(url.rstrip("/"), storage_options, option, bounds)
        self.url = self.storage.url
        self.layout = layout
        self.file_stats = file_stats
        self._stats_of = dict(file_stats or ())

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            Output,
            (
                self.url,
                self.storage.options,
                PATH,
                self.layout,
                self.file_stats,
                self.storage.bounds,
            ),
        )

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
        return self.layout.staged_file(folder, port, staged_stem(partition, attempt))

    def open_staged(self, relative: str) -> IO[bytes]:
        return self.storage.open_write(self.path(relative))

    def write_table(self, relative: str, table: pa.Table | pa.RecordBatch) -> int:
        """Write a staged Parquet file; returns its size in bytes."""
        return self._write(relative, table)[0]

    def write_port_file(self, port: str, relative: str, table: pa.Table) -> PortFile:
        """Write a staged Parquet file of ``port``: its record, statistics included."""
        size, writer = self._write(relative, table)
        return PortFile(port, relative, table.num_rows, size, self.stats(port, writer))

    def _write(
        self, relative: str, table: pa.Table | pa.RecordBatch
    ) -> tuple[int, pq.ParquetWriter]:
        with self.open_staged(relative) as handle:
            with open_parquet_writer(handle, table) as writer:
                writer.write(table)
            return int(handle.tell()), writer

    def stats(self, port: str, closed: pq.ParquetWriter) -> str | None:
        """The Delta statistics of the file ``closed`` wrote, from its footer (None where the
        format keeps none)."""
        columns = self._stats_of.get(port)
        return None if columns is None else delta_stats(closed.writer.metadata, columns)

    def read_table(self, relative: str) -> pa.Table:
        with self.storage.open_read(self.path(relative)) as handle:
            return read_parquet(handle)

    def read_schema(self, relative: str) -> pa.Schema:
        """A Parquet file's schema, from its footer."""
        with self.storage.open_read(self.path(relative)) as handle:
            return pq.read_schema(handle)

    def discard_staging(self, folder: str, known: list[str]) -> None:
        """Remove a window's staging folder, whose files are ``known`` (relative paths), and
        the known files staged elsewhere (in a table's folder, never committed)."""
        self.discard_outside(folder, known)
        inside = [self.path(f) for f in known if f.startswith(folder + "/")]
        self.storage.discard_folder(self.path(folder), inside)

    def discard_outside(self, folder: str, known: list[str]) -> None:
        """Delete those of ``known`` that were staged outside the staging folder ``folder``."""
        outside = [self.path(f) for f in known if not f.startswith(folder + "/")]
        if outside:
            self.storage.delete(outside)

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
        self._dictionaries: dict[pa.Schema, list[str]] = {}

    def write(self, port: str, batch: pa.RecordBatch | pa.Table) -> None:
        if port not in self._open:
            relative = self.output.new_staging_file(self.folder, port, self.partition, self.attempt)
            handle = self.output.open_staged(relative)
            writer = open_parquet_writer(handle, batch, self._dictionary_of(batch))
            self._open[port] = (handle, writer, PortFile(port, relative, 0, 0))
        _, writer, record = self._open[port]
        writer.write(batch)
        record.rows += batch.num_rows

    def _dictionary_of(self, batch: pa.RecordBatch | pa.Table) -> list[str]:
        """The columns the task's files of ``batch``'s schema dictionary-encode: chosen from
        the first rows it writes of that schema, once (a task writes a file per port and per
        chunk of unique rows, all of the same data; counting each file's sample again cost
        about half a millisecond a file)."""
        chosen = self._dictionaries.get(batch.schema)
        if chosen is None:
            chosen = self._dictionaries[batch.schema] = dictionary_columns(batch)
        return chosen

    def roll(self, port: str) -> None:
        """Close ``port``'s file (a later write opens a new one)."""
        if port in self._open:
            self._finish(port).close()

    def _finish(self, port: str) -> IO[bytes]:
        """``port``'s file complete and recorded; its handle, to close (which writes a
        remote file)."""
        handle, writer, record = self._open.pop(port)
        writer.close()
        record.size = int(handle.tell())
        record.stats = self.output.stats(port, writer)
        self._closed.append(record)
        return handle

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
        self._closed[at] = self.output.write_port_file(old.port, relative, rows)

    def close(self, beside: Sequence[Callable[[], object]] = ()) -> list[PortFile]:
        """Close the ports' last files, making the calls ``beside`` at the same time: on an
        object store each file is a request, and the last files of the ports go together."""
        handles = [self._finish(port) for port in list(self._open)]
        self.output.storage.together([*(handle.close for handle in handles), *beside])
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


def staging_batch(folder: str) -> tuple[str, int] | None:
    """The query and batch of a window's staging folder (``staging_folder``); None for a name
    of another form. A run and a batch hold no ``-``; a query id may."""
    head, _, rest = basename(folder).partition("-")
    query, batch, run = [*rest.rsplit("-", 2), "", ""][:3]
    if staging_window(head) < 0 or not batch.isdigit() or not query or not run:
        return None
    return query, int(batch)


def staging_window(name: str) -> int:
    """The window of a staging folder's name; -1 for a name of another form."""
    head = name.split("-", 1)[0]
    return int(head[1:]) if head.startswith("w") and head[1:].isdigit() else -1
