"""The Spark data source ``dedup``: the only module of dedupsink that imports pyspark.

``DedupDataSource.streamWriter`` runs on the driver before the first batch: it parses and
resolves the options against the stream's schema, opens (or creates) the bucket store, checks
its settings and finishes any publication a crash interrupted, so a bad option ends the query
before anything is written. The writer it returns is pickled to the executors, where ``write``
learns the window (query id, batch id) from the task context and runs ``run_task``; the driver
runs ``commit`` on a fresh copy each batch, which is why no state lives on the writer.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from dedupsink.errors import DedupError

if TYPE_CHECKING:
    import pyarrow as pa

    from dedupsink.sink.task import SinkPlan, TaskIdentity, TaskSummary

# The sink's engine, store and Parquet modules are imported by the methods that use them:
# Spark imports this module in every session that has dedupsink installed (to find the
# "dedup" format), and in several short-lived Python processes per query, most of which only
# need the class.

log = logging.getLogger("dedupsink")


class DedupCommitMessage(WriterCommitMessage):
    """A task's summary on its way to the driver."""

    def __init__(self, summary: TaskSummary) -> None:
        self.summary = summary


class DedupStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        from dedupsink.sink.task import run_task

        _exempt_long_lived_objects_from_gc()
        return DedupCommitMessage(run_task(self.plan, current_task(), iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from dedupsink.sink.commit import commit_window

        _exempt_long_lived_objects_from_gc()
        _log_to_stderr_if_unconfigured()
        summaries = [m.summary if isinstance(m, DedupCommitMessage) else None for m in messages]
        commit_window(self.plan, summaries, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Staged files stay invisible; the next commit of this batch or a later sweep removes them.
        log.warning("dedup batch %s aborted; nothing was published", batchId)


def _exempt_long_lived_objects_from_gc() -> None:
    """In a Python worker of Spark's daemon, move every object alive now out of the cycle
    collector's reach (``gc.freeze``).

    The daemon runs a full ``gc.collect()`` after every task, planning call and commit it
    serves. With pyspark, pyarrow and numpy loaded, that walks some 60,000 module-level objects
    each time: 10-40 ms of CPU per call, four calls a micro-batch, on cores the tasks need.
    Frozen, a collection walks only what was created since. Frozen objects are still freed by
    reference counting; only a reference cycle among them would never be collected, and the
    daemon has just collected when a call starts. Elsewhere (no daemon, or this sink's code
    run in an application's own process) nothing is changed."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == "pyspark.daemon":
        gc.freeze()


def _log_to_stderr_if_unconfigured() -> None:
    """Spark runs the commit in a Python worker with no logging set up; give the sink's
    one-line-per-batch summary a stderr handler there (Spark shows a worker's stderr in the
    driver's log), unless the application configured logging itself."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def current_task() -> TaskIdentity:
    """The window and attempt of the running task, from Spark's task context."""
    from dedupsink.sink.task import TaskIdentity

    context = TaskContext.get()
    if context is None:
        raise DedupError("the dedup sink's write() must run inside a Spark task")
    batch_id = context.getLocalProperty("streaming.sql.batchId")
    query_id = context.getLocalProperty("sql.streaming.queryId")
    if batch_id is None or query_id is None:
        raise DedupError("the dedup sink is a streaming sink: use df.writeStream.format('dedup')")
    return TaskIdentity(query_id, int(batch_id), context.partitionId(), context.attemptNumber())


class DedupDataSource(DataSource):
    """``df.writeStream.format("dedup")``: split each micro-batch into four ports."""

    @classmethod
    def name(cls) -> str:
        return "dedup"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DedupStreamWriter:
        from pyspark.sql.pandas.types import to_arrow_schema

        from dedupsink.engine.settings import resolve
        from dedupsink.errors import DedupOptionError
        from dedupsink.options import STORE_PATH, DedupOptions
        from dedupsink.sink.commit import finish_publication
        from dedupsink.sink.ports import absolute_url
        from dedupsink.sink.task import SinkPlan, lease_is_live

        _exempt_long_lived_objects_from_gc()
        parsed = DedupOptions.parse(dict(self.options))
        options = replace(
            parsed, path=absolute_url(parsed.path), store_path=absolute_url(parsed.store_path)
        )
        arrow_schema = to_arrow_schema(schema, timezone="UTC")
        settings = resolve(options, arrow_schema)
        plan = SinkPlan(options, settings, arrow_schema)
        existing = plan.store.read()
        if (existing is None or not existing.ports) and plan.output.has_windows():
            # A store that never published next to ports that hold windows (storePath changed,
            # or the store deleted): its window numbers would overwrite those ports' files.
            raise DedupOptionError(
                STORE_PATH,
                options.store_path,
                f"the store the ports under {options.path} were written with; they hold windows "
                "this store never committed (write to a new path, or remove the ports too)",
            )
        manifest = plan.store.open(settings)
        if not lease_is_live(manifest, options.owner_timeout.micros // 1000):
            # Under a live lease the owner (or this query, restarted) finishes it in its next
            # commit; another query publishing now would race the owner's own publication.
            finish_publication(plan.store, plan.output, manifest)
        return DedupStreamWriter(plan)
