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

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from dedupsink.engine.classify import PORTS
from dedupsink.engine.settings import ERROR_COLUMN

STAGING_DIR = "_staging"
SPARK_LOG_DIR = "_spark_metadata"
SPARK_LOG_COMPACT_INTERVAL = 10
_BLOCK_SIZE = 128 * 1024 * 1024


def absolute_url(url: str) -> str:
    """``url`` with a local path made absolute (``file://``); other URLs are returned as given.

    Executors run in other working directories (a cluster's work dirs), so a relative path
    is resolved once, on the driver."""
    fs, path = fsspec.core.url_to_fs(url)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return str(fs.unstrip_protocol(path)) if "file" in protocols else url


def port_schema(port: str, schema: pa.Schema) -> pa.Schema:
    if port == "error":
        return schema.append(pa.field(ERROR_COLUMN, pa.string(), nullable=False))
    return schema


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
        name = f"p{partition:05d}-a{attempt}-{uuid.uuid4().hex[:12]}.parquet"
        return f"{STAGING_DIR}/{token}/{port}/{name}"

    def write_table(self, relative: str, table: pa.Table | pa.RecordBatch) -> None:
        full = self.path(relative)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(full, "wb") as handle:
            pq.write_table(
                table if isinstance(table, pa.Table) else pa.Table.from_batches([table]), handle
            )

    def read_table(self, relative: str) -> pa.Table:
        with self.fs.open(self.path(relative), "rb") as handle:
            return pq.read_table(handle)

    def port_files(self, port: str) -> list[str]:
        try:
            names = self.fs.ls(self.path(port), detail=False)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.rstrip("/").rsplit("/", 1)[-1].endswith(".parquet"))

    # -- publication -----------------------------------------------------------------------

    def publish(self, plan: dict[str, Any]) -> None:
        """Move a committed window's files into its ports and log them; safe to repeat."""
        for source, target in plan["moves"]:
            self._move_once(source, target)
        for port, (log_id, files) in plan["logs"].items():
            self._write_log_entry(port, int(log_id), files)

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

    def _write_log_entry(self, port: str, log_id: int, files: list[str]) -> None:
        target = self._log_path(port, log_id)
        if self.fs.exists(target):
            return
        lines = [self._status_line(relative) for relative in files]
        if target.endswith(".compact"):
            lines = self._entries_before(port, log_id) + lines
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
            "path": self.fs.unstrip_protocol(full),
            "size": int(info.get("size") or 0),
            "isDir": False,
            "modificationTime": int(float(modified) * 1000),
            "blockReplication": 1,
            "blockSize": _BLOCK_SIZE,
            "action": "add",
        }
        return json.dumps(status, separators=(",", ":"))

    def _entries_before(self, port: str, log_id: int) -> list[str]:
        """Every entry logged before ``log_id``: the last compaction and the deltas after it."""
        start = log_id - SPARK_LOG_COMPACT_INTERVAL
        lines: list[str] = []
        for earlier in range(max(start, 0), log_id):
            text = self.fs.cat_file(self._log_path(port, earlier)).decode()
            lines.extend(line for line in text.splitlines()[1:] if line.strip())
        return lines

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
            text = self.fs.cat_file(self._log_path(port, log_id)).decode()
            paths.extend(json.loads(line)["path"] for line in text.splitlines()[1:] if line.strip())
        return paths


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
            writer = pq.ParquetWriter(handle, batch.schema)
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


def port_order(files: Iterable[PortFile]) -> dict[str, list[PortFile]]:
    grouped: dict[str, list[PortFile]] = {port: [] for port in PORTS}
    for record in files:
        grouped[record.port].append(record)
    return grouped
