"""Windows through the sink in this process, without Spark: tasks one after another, then the
commit.

What Spark does for one micro-batch, minus its transport of rows: ``start`` is a query's start
(the plan checked against the store, a new run), ``task`` is one task (``run_task``), ``commit``
the driver's commit (``commit_window``), and ``window`` deals a table's rows round-robin over
partitions and does all three. Tests, benchmarks and tools drive the sink with it exactly and
fast.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from dedupsink.sink.commit import CommitReport, commit_window
from dedupsink.sink.plan import SinkPlan, TaskIdentity, plan_for
from dedupsink.sink.task import TaskSummary, run_task


class LocalSink:
    """One query over a store, run in this process."""

    def __init__(
        self, options: Mapping[str, str], schema: pa.Schema, query_id: str = "local-query"
    ) -> None:
        self.options = dict(options)
        self.schema = schema
        self.query_id = query_id
        self._plan: SinkPlan | None = None

    @property
    def plan(self) -> SinkPlan:
        return self._plan or self.start()

    def start(self, run: str | None = None) -> SinkPlan:
        """What a query's (re)start from its checkpoint does: a new run of the same query."""
        self._plan = plan_for(self.options, self.schema, run or uuid.uuid4().hex[:16])
        return self._plan

    def task(
        self,
        batch_id: int,
        partition: int,
        batches: Iterable[pa.RecordBatch],
        attempt: int = 0,
    ) -> TaskSummary:
        plan = self.plan
        identity = TaskIdentity(self.query_id, plan.run, batch_id, partition, attempt)
        with plan.options.masking():
            return run_task(plan, identity, iter(batches))

    def commit(self, batch_id: int, summaries: Sequence[TaskSummary | None]) -> CommitReport | None:
        plan = self.plan
        with plan.options.masking():
            return commit_window(plan, summaries, batch_id)

    def tasks(
        self, batch_id: int, table: pa.Table, partitions: int = 1, attempt: int = 0
    ) -> list[TaskSummary]:
        """One task per partition over ``table``'s rows, dealt round-robin."""
        return [
            self.task(batch_id, partition, deal(table, partition, partitions).to_batches(), attempt)
            for partition in range(partitions)
        ]

    def window(
        self, batch_id: int, table: pa.Table, partitions: int = 1, attempt: int = 0
    ) -> CommitReport | None:
        return self.commit(batch_id, self.tasks(batch_id, table, partitions, attempt))


def deal(table: pa.Table, partition: int, partitions: int) -> pa.Table:
    """The rows of ``table`` that partition ``partition`` of ``partitions`` gets, round-robin."""
    if partitions == 1:
        return table
    return table.take(pa.array(range(partition, table.num_rows, partitions), pa.int64()))
