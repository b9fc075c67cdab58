"""The seam between the commit and the ports: one ``PortFormat`` class per output format.

A format decides where a task's port files go (``Layout``), what a window's publication lists
per port (``plan_port``), how a committed window becomes readable (``publish``, idempotent),
and checks and creates its tables when a query starts (``check_tables``, ``create_tables``).
A new format is one module with one such class, named in ``formats.FORMATS``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from dedupsink.errors import DedupOptionError
from dedupsink.options import OUTPUT_FORMAT, PATH, DedupOptions
from dedupsink.ports.encoding import port_schema
from dedupsink.ports.output import STAGED, FileStats, Layout, Output, PortFile
from dedupsink.store.format import PortState
from dedupsink.store.records import LogEntry, Move, Publication
from dedupsink.store.storage import join

if TYPE_CHECKING:
    from dedupsink.ports.repair import LogRepair
    from dedupsink.store.store import BucketStore

Call = Callable[[], object]


class PortFormat(ABC):
    """How the four ports of one output are written and published."""

    name: ClassVar[str]
    layout: ClassVar[Layout] = STAGED
    # Whether a port with no rows in the store's first window needs an empty file to show its
    # schema (plain Parquet); tables are created with theirs.
    schema_files: ClassVar[bool] = False

    def __init__(self, options: DedupOptions, file_stats: FileStats = None) -> None:
        self.options = options
        self.output = Output(
            options.path,
            options.storage_options,
            PATH,
            self.layout,
            file_stats,
            options.storage_bounds,
        )

    # -- at query start (driver, before any output) ------------------------------------------

    @abstractmethod
    def check_tables(self, schema: pa.Schema) -> None:
        """Refuse what would fail later: a missing package, a table of another schema."""

    @abstractmethod
    def create_tables(self, schema: pa.Schema) -> None:
        """Create the port tables that are missing (idempotent)."""

    def create_deferred_tables(self, schema: pa.Schema) -> None:
        """At a commit, before anything else: create the tables ``create_tables`` left for the
        first commit (a format whose query start has nothing to check on a new output)."""
        return None

    def check_recorded(self, schema: pa.Schema, recorded: pa.Schema) -> None:
        """Refuse an input whose columns differ from the schema the store recorded its latest
        window with, where no table of the format keeps one (Parquet folders)."""
        return None

    def file_stats(self) -> FileStats:
        """Which columns of each port get statistics in the format's own record of a file
        (Delta's add actions), worked out by the tasks as they write it; None: none."""
        return None

    @abstractmethod
    def has_windows(self) -> bool:
        """Whether the ports already hold a published window (of whichever store)."""

    # -- the commit ------------------------------------------------------------------------------

    def plan_port(
        self, port: str, state: PortState, files: list[PortFile], version: int, now_ms: int
    ) -> tuple[list[Move], LogEntry | None]:
        """The publication of one port's files of window ``version``, ``state`` advanced past
        it. Table formats publish each file where its task wrote it."""
        state.files += len(files)
        state.rows += sum(f.rows for f in files)
        state.next_log += 1  # windows published to the port (Parquet's log ids count the same)
        return [Move(f.path, f.path, f.size, f.rows, f.stats) for f in files], None

    def publish(self, publication: Publication, store_id: str, beside: Sequence[Call] = ()) -> None:
        """Make a committed window readable in every port (adding nothing if it already is),
        and make the calls ``beside`` at the same time as its last requests: calls that need
        the window's files where the publication leaves them (its staging discarded, its
        history record), which on an object store then cost no round trip of their own. A
        table format's files are in place before it starts: they go beside the whole of it."""
        self.output.storage.together([partial(self.publish_tables, publication, store_id), *beside])

    @abstractmethod
    def publish_tables(self, publication: Publication, store_id: str) -> None:
        """Make a committed window readable in every port; adds nothing if it already is."""

    @abstractmethod
    def is_published(self, publication: Publication, store_id: str) -> bool:
        """Whether every port shows the window."""

    # -- operating -------------------------------------------------------------------------------

    address_heading: ClassVar[str] = "Parquet files"

    def address(self, port: str) -> str:
        """Where a person finds the port: its folder, Delta table or Iceberg table."""
        return join(self.options.path, port)

    def describe(self, port: str, store_id: str) -> dict[str, Any]:
        """What ``inspect`` shows of one port beyond the store's own counts."""
        return {}

    def catalog_info(self) -> CatalogInfo | None:
        """The catalog that names the port tables, for those who read them; None without one."""
        return None

    def repair(self, store: BucketStore, dry_run: bool = False) -> list[LogRepair]:
        """Rewrite what the store can vouch for and the ports lost (Spark's sink log); table
        formats keep their own log, which nothing here rewrites."""
        return []


def missing_extra(format_name: str, package: str, exc: ImportError) -> DedupOptionError:
    """The error for a format whose optional package is not installed."""
    return DedupOptionError(
        OUTPUT_FORMAT,
        format_name,
        f"a format whose package is installed: {format_name} needs {package} "
        f"(pip install 'dedupsink[{format_name}]'; {exc})",
    )


def table_schema(port: str, schema: pa.Schema) -> pa.Schema:
    """A port table's schema: the port's columns, every one nullable at every depth. Spark marks
    the same column nullable in one query and not in another (a file source's are nullable, a
    literal's not); a table that required values would refuse the next query's files."""
    return pa.schema([_nullable(f) for f in port_schema(port, schema)])


def schema_record(schema: pa.Schema) -> bytes:
    """An input's schema as a publication records it: every column nullable, no metadata (two
    queries of one input then record the same bytes), as an Arrow IPC schema."""
    plain = pa.schema([_nullable(f).remove_metadata() for f in schema])
    return bytes(plain.serialize().to_pybytes())


def recorded_schema(publication: Publication | None) -> pa.Schema | None:
    """The input's schema a publication's window was written with (None: not recorded)."""
    if publication is None or publication.schema is None:
        return None
    return pa.ipc.read_schema(pa.py_buffer(publication.schema))


def all_nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column nullable at every depth (its metadata kept)."""
    return pa.schema([_nullable(f) for f in schema], metadata=schema.metadata)


def _nullable(field: pa.Field) -> pa.Field:
    kind = field.type
    if pa.types.is_struct(kind):
        kind = pa.struct([_nullable(kind.field(i)) for i in range(kind.num_fields)])
    elif pa.types.is_large_list(kind):
        kind = pa.large_list(_nullable(kind.value_field))
    elif pa.types.is_list(kind):
        kind = pa.list_(_nullable(kind.value_field))
    elif pa.types.is_map(kind):
        kind = pa.map_(_nullable(kind.key_field).with_nullable(False), _nullable(kind.item_field))
    return field.with_type(kind).with_nullable(True)


@dataclass(frozen=True)
class CatalogInfo:
    """A catalog as a reader needs it: its name and properties (secrets masked), the tables
    the ports are, and the ``load_catalog`` call that opens them."""

    name: str
    properties: dict[str, str]  # secrets masked
    tables: dict[str, str]  # port -> table identifier

    @property
    def kind(self) -> str | None:
        return self.properties.get("type")

    @property
    def uri(self) -> str | None:
        return self.properties.get("uri")

    @property
    def warehouse(self) -> str | None:
        return self.properties.get("warehouse")

    def load_call(self) -> str:
        """The Python that loads the catalog with pyiceberg (``***`` where a secret goes)."""
        given = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in self.properties.items())
        return f"load_catalog({json.dumps(self.name)}, **{{{given}}})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.kind,
            "uri": self.uri,
            "warehouse": self.warehouse,
            "properties": self.properties,
            "tables": self.tables,
            "load": f"from pyiceberg.catalog import load_catalog; {self.load_call()}",
        }
