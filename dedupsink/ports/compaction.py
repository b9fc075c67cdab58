"""Port compaction: a table port's small files rewritten into fewer, larger ones, in one table
commit per port that changes no data (Delta: OPTIMIZE's ``remove`` and ``add`` actions with
``dataChange=false``; Iceberg: a snapshot of operation ``replace``).

Not the store's compaction (``store/compaction.py`` folds the store's key segments): this one
rewrites port files, which only the tables' readers see. A window adds at least one file per
port with rows; a day of one-minute windows leaves thousands of small files a reader opens one
by one.

Compacting one port (``compact_port``): read the table (the version a commit would follow and
its live files), plan bins of small files (``plan_bins``: files under the target size, in name
order, which is window order, packed up to the target), write each bin's rows as one new file in
the table's folder, then commit on the version read. Until that commit no table version names
the new files: a compaction killed before it leaves garbage no reader sees. A commit that lost
the race to another writer (a window's publication, another compaction) reads the table again:
if its commit is there after all (a lost reply) it is done; if every file it replaces is still
live (a window only adds files) it commits the same files on the new version; else (another
compaction replaced some) it gives up and leaves its files as garbage. Old files are never
deleted, so every earlier table version still reads (time travel); their removal is the
table's own maintenance (Delta's ``VACUUM``, Iceberg's snapshot expiry and orphan removal).
"""

from __future__ import annotations

import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from dedupsink.engine.classify import PORTS
from dedupsink.errors import PortTableError
from dedupsink.options import COMPACT_TARGET_SIZE_DEFAULT
from dedupsink.ports.base import PortFormat, all_nullable
from dedupsink.ports.encoding import open_parquet_writer
from dedupsink.ports.output import Output
from dedupsink.ports.stats import StatsColumns, delta_stats

log = logging.getLogger("dedupsink")

# Delta's OPTIMIZE and Spark's rewrite_data_files aim at files of about this size.
TARGET_SIZE_DEFAULT = COMPACT_TARGET_SIZE_DEFAULT
# A commit that lost a race commits the same files on the next version; more rounds than this
# means the table keeps changing faster than one commit.
COMMIT_ROUNDS = 8
COMPACTED_PREFIX = "compact-"


@dataclass(frozen=True)
class TableFile:
    """A live data file of a port table: path relative to the output root, bytes, rows (None
    where the table's log does not say)."""

    path: str
    size: int
    rows: int | None = None
    stats: str | None = None  # a rewritten file's Delta statistics, from its footer


@dataclass(frozen=True)
class TableState:
    """What a compaction read of one port table: the version a commit follows (Delta's table
    version, Iceberg's snapshot id), its live files and the format's handle of the table."""

    version: int
    files: tuple[TableFile, ...]
    handle: Any = None
    # Whether the latest commit is a compaction: then nothing is compacted until rows come.
    compacted_last: bool = False

    def live(self) -> set[str]:
        return {f.path for f in self.files}


@dataclass
class PortCompaction:
    """What compacting one port did."""

    port: str
    outcome: str  # "compacted", "nothing to do", "nothing new since the last compaction", "gave up"
    files_before: int = 0
    files_after: int = 0
    removed: int = 0
    added: int = 0
    bytes_rewritten: int = 0
    read_version: int | None = None
    committed_version: int | None = None
    rounds: int = 0
    seconds: float = 0.0
    version_name: str = "table version"  # what the format calls a commit

    def line(self) -> str:
        if self.outcome != "compacted":
            return f"{self.port}: {self.outcome} ({self.files_before} files)"
        return (
            f"{self.port}: {self.files_before} -> {self.files_after} files ({self.removed} "
            f"rewritten as {self.added}, {self.bytes_rewritten / 1e6:.1f} MB) in "
            f"{self.version_name} {self.committed_version}, {self.seconds:.1f} s"
        )


@dataclass
class TableCompactor(ABC):
    """One table format's side of a port compaction: read a port table, commit a rewrite."""

    version_name: ClassVar[str] = "table version"
    ports: PortFormat

    @property
    def output(self) -> Output:
        return self.ports.output

    @abstractmethod
    def read(self, port: str) -> TableState | None:
        """The port table's latest version and live files; None if there is no table."""

    @abstractmethod
    def commit(
        self,
        port: str,
        base: TableState,
        removed: Sequence[TableFile],
        added: Sequence[TableFile],
        target_size: int,
    ) -> int | None:
        """Commit ``added`` in the place of ``removed`` as the version after ``base``, changing
        no data; the version committed, or None if another commit took the table first."""

    def new_file(self, port: str, first: TableFile, index: int) -> str:
        """A new compacted file's path, relative to the output root, in the table's folder:
        ``compact-<window of its first source>-…``, so that it sorts in window order."""
        data = self.ports.layout.data_folder
        folder = f"{port}/{data}" if data else port
        window = max(window_of(first.path), 0)
        name = f"{COMPACTED_PREFIX}{window:010d}-{index:04d}-{uuid.uuid4().hex[:12]}.parquet"
        return f"{folder}/{name}"


def window_of(path: str) -> int:
    """The window a port file's name starts with (``part-<window>-…`` as tasks write them,
    ``compact-<window>-…`` as compactions do); -1 for a name of another form."""
    fields = path.rsplit("/", 1)[-1].split("-")
    return int(fields[1]) if len(fields) > 2 and fields[1].isdigit() else -1


def plan_bins(files: Sequence[TableFile], target_size: int) -> list[list[TableFile]]:
    """The groups of files to rewrite as one file each: files smaller than ``target_size``, in
    window order (a port file's name starts with its window, so rows keep it),
    packed greedily up to the target by their bytes, as Delta's OPTIMIZE bins them; a group of
    one file would rewrite it as itself and is left out."""
    bins: list[list[TableFile]] = []
    current: list[TableFile] = []
    size = 0
    for table_file in sorted(files, key=lambda f: (window_of(f.path), f.path)):
        if table_file.size >= target_size:
            continue
        if current and size + table_file.size > target_size:
            bins.append(current)
            current, size = [], 0
        current.append(table_file)
        size += table_file.size
    if current:
        bins.append(current)
    return [group for group in bins if len(group) > 1]


def rewrite(
    output: Output,
    sources: Sequence[TableFile],
    target: str,
    columns: StatsColumns | None = None,
) -> TableFile:
    """Write the rows of ``sources``, file after file in order, as one Parquet file ``target``
    (relative to the output root) in the sink's encoding, one source in memory at a time.
    A column is written nullable where any source has it so (two queries may differ).
    ``columns``: those the file's Delta statistics cover, as a window's files' do."""
    schemas = [output.read_schema(source.path) for source in sources]
    schema = all_nullable(pa.unify_schemas(schemas, promote_options="permissive"))
    rows = 0
    with output.open_staged(target) as handle:
        first = output.read_table(sources[0].path).cast(schema)
        with open_parquet_writer(handle, first) as writer:
            for index, source in enumerate(sources):
                table = first if index == 0 else output.read_table(source.path).cast(schema)
                writer.write_table(table)
                rows += table.num_rows
        size = int(handle.tell())
    stats = None if columns is None else delta_stats(writer.writer.metadata, columns)
    return TableFile(target, size, rows, stats)


def compact_port(compactor: TableCompactor, port: str, target_size: int) -> PortCompaction:
    """Compact one port table in one commit (see the module's docstring)."""
    started = time.monotonic()
    base = compactor.read(port)
    if base is None:
        return PortCompaction(port, "nothing to do", version_name=compactor.version_name)
    result = PortCompaction(port, "nothing to do", len(base.files), len(base.files))
    result.version_name = compactor.version_name
    result.read_version = base.version
    bins = plan_bins(base.files, target_size)
    if not bins:
        return result
    removed = [f for group in bins for f in group]
    added = []
    columns = dict(compactor.ports.file_stats() or ()).get(port)
    for index, group in enumerate(bins):
        target = compactor.new_file(port, group[0], index)
        added.append(rewrite(compactor.output, group, target, columns))
    for _ in range(COMMIT_ROUNDS):
        result.rounds += 1
        committed = compactor.commit(port, base, removed, added, target_size)
        if committed is not None:
            return _compacted(result, base, removed, added, committed, started)
        latest = compactor.read(port)
        if latest is None:
            raise PortTableError(f"the {port} table is gone under its compaction")
        live = latest.live()
        if all(f.path in live for f in added):  # our commit landed; its reply did not
            return _compacted(result, latest, removed, added, latest.version, started)
        if not all(f.path in live for f in removed):
            log.info("compaction of %s gave up: another compaction replaced its files", port)
            result.outcome = "gave up"
            return result
        base = latest  # only windows came in between: the same rewrite on the new version
    log.info("compaction of %s gave up: the table kept changing", port)
    result.outcome = "gave up"
    return result


def _compacted(
    result: PortCompaction,
    base: TableState,
    removed: Sequence[TableFile],
    added: Sequence[TableFile],
    committed: int,
    started: float,
) -> PortCompaction:
    result.outcome = "compacted"
    result.files_before = len(base.files)
    result.files_after = len(base.files) - len(removed) + len(added)
    result.removed, result.added = len(removed), len(added)
    result.bytes_rewritten = sum(f.size for f in removed)
    result.committed_version = committed
    result.seconds = time.monotonic() - started
    return result


def compact_ports(
    compactor: TableCompactor, target_size: int, only: Sequence[str] = PORTS
) -> list[PortCompaction]:
    """Compact each port table, one commit a port (``formats.compactor_for`` gives the
    compactor of an output's format)."""
    done = []
    for port in only:
        result = compact_port(compactor, port, target_size)
        log.info("dedup port compaction: %s", result.line())
        done.append(result)
    return done
