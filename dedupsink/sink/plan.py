"""What a write carries from the driver to its tasks and commit, and who a task is.

A ``SinkPlan`` is built once on the driver (``streamWriter`` or ``writer``), pickled with the
writer to every task, and rebuilt by the driver for each commit. ``plan_for`` builds it in one
pass down the layers: options parsed, their paths made absolute, resolved against the schema
(engine), then the store and the ports checked. A ``TaskIdentity`` is where a task stands: the
query and its run, the window's batch, the partition and the attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import pyarrow as pa
from fsspec.implementations.local import make_path_posix

from dedupsink.engine.settings import Settings, resolve
from dedupsink.errors import DedupOptionError
from dedupsink.options import PATH, STORE_PATH, DedupOptions
from dedupsink.ports.base import PortFormat, recorded_schema
from dedupsink.ports.formats import port_format
from dedupsink.ports.output import FileStats, Output
from dedupsink.runtime import RUNTIME
from dedupsink.store.format import Manifest
from dedupsink.store.ownership import BATCH_WRITE_PREFIX, Writer
from dedupsink.store.records import Publication
from dedupsink.store.store import BucketStore, check_settings

# The configurations this process has checked against their store. Spark plans every
# micro-batch again (and once more for its commit): the checks, a few requests on an object
# store, are made once a process; tasks and commits check what they rely on themselves.
_checked: set[tuple[str, ...]] = RUNTIME.cache("sink.checked_plans", set)
# The statistics each output's port files get (by output URL and storage options), read from
# its tables once a process: tasks work them out as they write (a table's stats columns
# changed while a query runs apply from its next start).
_file_stats: dict[tuple[str, str], FileStats] = RUNTIME.cache("sink.file_stats", dict)


@dataclass(frozen=True)
class SinkPlan:
    """Everything tasks and commits need; ``run`` names this start of the query (a new one
    each time the query starts from its checkpoint; a batch write's own id)."""

    options: DedupOptions
    settings: Settings
    schema: pa.Schema
    run: str = ""
    file_stats: FileStats = None  # which columns of each port's files get statistics

    @property
    def store(self) -> BucketStore:
        options = self.options
        return BucketStore(
            options.store_path, options.storage_options, STORE_PATH, options.storage_bounds
        )

    @property
    def ports(self) -> PortFormat:
        return port_format(self.options, self.file_stats)

    @property
    def output(self) -> Output:
        return self.ports.output

    def writer(self, query_id: str, run: str) -> Writer:
        timeout_ms = self.options.owner_timeout.micros // 1000
        if query_id.startswith(BATCH_WRITE_PREFIX):
            return Writer(query_id, run, timeout_ms, "batch write", keeps_store=False)
        return Writer(query_id, run, timeout_ms)


@dataclass(frozen=True)
class TaskIdentity:
    """Where a task stands: the query, its run, the batch, the partition and the attempt."""

    query_id: str
    run: str
    batch_id: int
    partition: int
    attempt: int


Checks = Literal["always", "once", "never"]


def plan_for(
    raw: Mapping[str, str], schema: pa.Schema, run: str, check: Checks = "always"
) -> SinkPlan:
    """A write's plan from Spark's string options and the input's Arrow schema: options parsed,
    resolved against the schema, and the store and the ports reached and checked (``always``,
    ``once`` a process for a configuration, or ``never``). Raises before anything is
    written."""
    options = with_absolute_paths(DedupOptions.parse(raw))
    plan = SinkPlan(options, resolve(options, schema), schema, run)
    with options.masking():
        if check != "never":
            prepare_store_and_ports(plan, once=check == "once")
        return replace(plan, file_stats=file_stats_of(plan))


def file_stats_of(plan: SinkPlan) -> FileStats:
    """The statistics the plan's port files get, asked of its ports once a process."""
    options = plan.options
    key = (options.path, repr(sorted(options.storage_options.items())))
    if key not in _file_stats:
        _file_stats[key] = plan.ports.file_stats()
    return _file_stats[key]


def with_absolute_paths(options: DedupOptions) -> DedupOptions:
    """``options`` with a relative local ``path`` and ``storePath`` made absolute: executors
    run in other working directories (a cluster's work dirs), so they are resolved once, on
    the driver."""
    return replace(
        options, path=absolute_url(options.path), store_path=absolute_url(options.store_path)
    )


def absolute_url(url: str) -> str:
    """``url`` with a local path made absolute (``file://``); other URLs are returned as given."""
    if "://" in url:
        return url
    return "file://" + make_path_posix(url)


def prepare_store_and_ports(plan: SinkPlan, once: bool = False) -> None:
    """The store and the ports can be reached, and the store fits the options."""
    options = plan.options
    # The input's schema belongs to the key: a later query of this process over the same
    # output with another column must meet the tables' check (a Delta table would otherwise
    # take files with a column its schema does not declare, invisible to its readers).
    key = (
        options.store_path,
        options.path,
        repr(sorted(plan.settings.identity().items())),
        repr(sorted(options.storage_options.items())),
        plan.schema.to_string(show_schema_metadata=False),
    )
    if once and key in _checked:
        return
    ports, store = plan.ports, plan.store  # path first: storePath follows from it by default
    output = ports.output
    output.storage.check_reachable(PATH)
    store.storage.check_reachable(STORE_PATH)
    existing = store.read()
    if existing is not None:
        check_settings(existing.settings, plan.settings, store.url)
    ports.check_tables(plan.schema)
    recorded = None if existing is None else recorded_schema(existing.publication)
    if recorded is not None:
        ports.check_recorded(plan.schema, recorded)
    if (existing is None or not existing.ports) and ports.has_windows():
        # A store that never published next to ports that hold windows (storePath changed,
        # or the store deleted): its window numbers would overwrite those ports' files.
        raise DedupOptionError(
            STORE_PATH,
            options.store_path,
            f"the store the ports under {options.path} were written with; they hold windows "
            "this store never committed (write to a new path, or remove the ports too)",
        )
    if existing is not None and _published_elsewhere(ports, existing):
        raise DedupOptionError(
            STORE_PATH,
            options.store_path,
            f"a store for this output alone: version {existing.version} of this store was "
            f"published to another output (none of its files are under {options.path}), and a "
            "store numbers its windows for the ports of one output",
        )
    store.open(plan.settings)
    ports.create_tables(plan.schema)
    _checked.add(key)


def _published_elsewhere(ports: PortFormat, manifest: Manifest) -> bool:
    """Whether a store's latest publication belongs to another output: not complete here, and
    no file of it here, staged or in place (after a crash it is finished from the staged files)."""
    publication: Publication | None = manifest.publication
    if publication is None or not publication.moves:
        return False
    if ports.is_published(publication, manifest.store_id):
        return False
    output = ports.output
    return not any(
        output.storage.exists(output.path(move.staged))
        or output.storage.exists(output.path(move.target))
        for move in publication.moves
    )
