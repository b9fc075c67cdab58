"""The Spark data source ``dedup``: the one module below the CLI that imports pyspark.

``DedupDataSource.streamWriter`` runs on the driver before the first batch and checks options,
filesystem and store, so a bad option ends the query before anything is written. Its writer is
pickled to the executors, where ``write`` runs ``run_task`` for its window; Spark calls
``streamWriter`` again on a fresh copy for every commit, so no state lives on the writer.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from dedupsink.sink.compat import check_pyspark

check_pyspark()  # before the imports that PySpark 4.0 lacks: one line naming both versions

from pyspark import TaskContext  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dedupsink.errors import DedupError, DedupOptionError  # noqa: E402
from dedupsink.sink.oneline import said_in_one_line  # noqa: E402
from dedupsink.sink.worker import COMMIT_LOG_ENV, importing_in_bulk, tune_worker_process  # noqa: E402

if TYPE_CHECKING:
    import pyarrow as pa

    from dedupsink.sink.plan import Checks, SinkPlan, TaskIdentity
    from dedupsink.sink.task import TaskSummary

# The sink's engine, store and Parquet modules are imported by the methods that use them:
# Spark imports this module in every session that has dedupsink installed (to find the
# "dedup" format), and in several short-lived Python processes per query, most of which only
# need the class.

log = logging.getLogger("dedupsink")


class DedupCommitMessage(WriterCommitMessage):
    """A task's summary on its way to the driver."""

    def __init__(self, summary: TaskSummary) -> None:
        self.summary = summary


def _write(
    plan: SinkPlan, task: TaskIdentity, iterator: Iterator[pa.RecordBatch]
) -> DedupCommitMessage:
    """One task of a stream's micro-batch or of a batch write (``run_task`` tunes the worker)."""
    from dedupsink.sink.task import run_task

    with plan.options.masking():
        return DedupCommitMessage(run_task(plan, task, iterator))


def _commit(plan: SinkPlan, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
    with importing_in_bulk():
        from dedupsink.sink.commit import commit_window

    tune_worker_process()
    _log_to_stderr_if_unconfigured()
    summaries = [m.summary if isinstance(m, DedupCommitMessage) else None for m in messages]
    with said_in_one_line(), plan.options.masking():
        commit_window(plan, summaries, batch_id)


class DedupStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        return _write(self.plan, current_task(self.plan), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self.plan, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Staged files stay invisible; a later sweep removes them.
        log.warning("dedup batch %s aborted; nothing was published", batchId)


class DedupBatchWriter(DataSourceArrowWriter):
    """``df.write.format("dedup")``: the whole write is one window of the store."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        return _write(self.plan, batch_task(self.plan), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.plan, messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("dedup batch write %s aborted; nothing was published", self.plan.run)


def _log_to_stderr_if_unconfigured() -> None:
    """Spark runs the commit in a Python worker with no logging set up; give the sink's
    one-line-per-batch summary a stderr handler there (Spark shows a worker's stderr in the
    driver's log), unless the application configured logging itself or prints its own."""
    if os.environ.get(COMMIT_LOG_ENV, "").lower() == "off":
        return
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


_COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"
# Spark describes each micro-batch's jobs as "<name>\nid = <query>\nrunId = <run>\nbatch = <n>";
# the run id (a new one at each start of the query) is nowhere else in a task's context.
_RUN_ID = re.compile(r"^runId = (\S+)$", re.MULTILINE)


def _planning_a_commit() -> bool:
    """Whether Spark is building the writer only to run a commit on it: its commit runner plans
    the write again for every micro-batch. The commit reads and checks the store itself, so the
    start-of-query checks (a dozen requests on an object store) are left out there. Spark runs
    the runner as a program (``python -m``) or, through its daemon, as an imported module."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main is not None and main.name == _COMMIT_RUNNER:
        return True
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == _COMMIT_RUNNER:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def new_run() -> str:
    """A name for this start of a query: each start from its checkpoint is a new run."""
    import uuid

    return uuid.uuid4().hex[:16]


def batch_task(plan: SinkPlan) -> TaskIdentity:
    """A batch write's task: the write is a query of one window (batch 0), named by its id."""
    from dedupsink.sink.plan import TaskIdentity
    from dedupsink.store.ownership import BATCH_WRITE_PREFIX

    context = TaskContext.get()
    if context is None:
        raise DedupError("the dedup sink's write() must run inside a Spark task")
    query = BATCH_WRITE_PREFIX + plan.run
    return TaskIdentity(query, plan.run, 0, context.partitionId(), context.attemptNumber())


def current_task(plan: SinkPlan) -> TaskIdentity:
    """The window and attempt of the running task, from Spark's task context."""
    from dedupsink.sink.plan import TaskIdentity

    context = TaskContext.get()
    if context is None:
        raise DedupError("the dedup sink's write() must run inside a Spark task")
    batch_id = context.getLocalProperty("streaming.sql.batchId")
    query_id = context.getLocalProperty("sql.streaming.queryId")
    if batch_id is None or query_id is None:
        raise DedupError("the dedup sink is a streaming sink: use df.writeStream.format('dedup')")
    run = _RUN_ID.search(context.getLocalProperty("spark.job.description") or "")
    return TaskIdentity(
        query_id,
        run.group(1) if run else plan.run,
        int(batch_id),
        context.partitionId(),
        context.attemptNumber(),
    )


class DedupHistoryReader(DataSourceReader):
    """``spark.read.format("dedup").load(path)``: the store's history, one row per committed
    window (``store/history.py``), read in one task. The store is found when the query is
    planned, so a path without one fails there, naming it."""

    def __init__(self, options: dict[str, str], columns: list[str]) -> None:
        from dedupsink.options import STORE_PATH, parse_storage_options
        from dedupsink.store.history import SCHEMA, store_of

        unknown = [name for name in columns if name not in SCHEMA.names]
        if unknown:
            raise DedupOptionError(
                "schema", ", ".join(unknown), f"columns of the history: {', '.join(SCHEMA.names)}"
            )
        self.columns = columns
        self.storage_options = parse_storage_options(options)
        named = {key.lower(): value for key, value in options.items()}  # Spark lowers them
        path = named.get("path")
        self.store_path = named.get(STORE_PATH.lower())
        if self.store_path is None:
            self.store_path = store_of(path, self.storage_options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from dedupsink.store.history import load_history

        table = load_history(None, self.storage_options, self.store_path)
        yield from table.select(self.columns).to_batches()


# The history's columns (``store.history.COLUMNS``) in Spark's types. Spark asks a data source
# for its schema before a write too, in a process of its own (``create_data_source``) that does
# nothing else and stays for the session: spelled out here, that process imports no pyarrow
# (a large part of its memory; bench/RESULTS.md, "Memory as installed"). A test holds it equal
# to the history's Arrow schema.
_HISTORY_COLUMNS: tuple[tuple[str, Callable[[], DataType]], ...] = (
    ("version", LongType),
    ("query_id", StringType),
    ("batch_id", LongType),
    ("committed_at", TimestampType),
    ("unique", LongType),
    ("duplicate", LongType),
    ("expired", LongType),
    ("error", LongType),
    ("keys_added", LongType),
    ("keys_forgotten", LongType),
    ("keys_remembered", LongType),
    ("keys_expired_unfolded", LongType),
    ("cross_partition_duplicates", LongType),
    ("latest_point", DoubleType),
    ("latest_point_text", StringType),
    ("expiry_point", DoubleType),
    ("expiry_point_text", StringType),
    ("store_files", LongType),
    ("store_bytes", LongType),
    ("task_seconds", DoubleType),
    ("wall_seconds", DoubleType),
    ("commit_seconds", DoubleType),
    ("state_loaded_bytes", LongType),
    ("state_loaded_max_bytes", LongType),
    ("state_fetched_bytes", LongType),
    ("state_private_bytes", LongType),
    ("state_mapped_bytes", LongType),
    (
        "error_reasons",
        lambda: ArrayType(
            StructType([StructField("reason", StringType()), StructField("rows", LongType())])
        ),
    ),
    ("store_retries", LongType),
    ("store_wait_seconds", DoubleType),
    ("schema_version", LongType),
)


def history_schema() -> StructType:
    """The schema of ``spark.read.format("dedup")``: the store's history."""
    return StructType([StructField(name, kind()) for name, kind in _HISTORY_COLUMNS])


class DedupDataSource(DataSource):
    """``df.writeStream.format("dedup")`` splits each micro-batch into four ports;
    ``df.write.format("dedup").mode("append")`` writes a DataFrame as one window of the same
    store and ports (a backfill, a daily job); ``spark.read.format("dedup").load(path)`` reads
    the store's history, one row per committed window."""

    @classmethod
    def name(cls) -> str:
        return "dedup"

    def schema(self) -> StructType:
        return history_schema()

    def reader(self, schema: StructType) -> DedupHistoryReader:
        return DedupHistoryReader(dict(self.options), list(schema.fieldNames()))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DedupStreamWriter:
        # Spark plans every micro-batch, and again for its commit: the checks are made once a
        # process, and not for a commit (which checks what it relies on itself).
        check: Checks = "never" if _planning_a_commit() else "once"
        return DedupStreamWriter(_plan(self.options, schema, check))

    def writer(self, schema: StructType, overwrite: bool) -> DedupBatchWriter:
        if overwrite:
            with said_in_one_line():
                # Spark itself refuses the error and ignore modes for a Python data source; only
                # append and overwrite reach here.
                raise DedupOptionError(
                    "mode",
                    "overwrite",
                    "append: a batch write adds one window to the store and its ports, which it "
                    "never replaces (use .mode('append'))",
                )
        return DedupBatchWriter(_plan(self.options, schema, "always"))


def _plan(options: Mapping[str, str], schema: StructType, check: Checks) -> SinkPlan:
    """The sink's plan for a write of ``schema`` (a new run), built in the process Spark plans
    or commits in: the first there imports the sink's modules, with the collector paused."""
    with importing_in_bulk():
        from dedupsink.sink.compat import arrow_schema
        from dedupsink.sink.plan import plan_for

        tune_worker_process()
        converted = arrow_schema(schema)
        with said_in_one_line():
            return plan_for(dict(options), converted, new_run(), check)
