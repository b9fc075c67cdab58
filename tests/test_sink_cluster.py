"""The dedup sink on a real multi-process cluster: ``local-cluster[2,1,1024]``.

Two executor JVMs, each with its own Python workers, run the tasks of one window; they share
only the filesystem. Copies of one key are spread over four partitions, so they reach different
processes in the same window, and must still give exactly one unique row, the reference model's
result and ports every reader agrees on.

A Spark driver holds one SparkContext, and the test session already has its ``local[2]`` one, so
the cluster job runs this module as a script in a child process (``python
tests/test_sink_cluster.py '<json>'``); the checks then read the outputs from the test process.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql.types import StructType
from streams import (
    assert_matches_reference,
    check_ports,
    read_port,
    reference_outputs,
    run_jobs,
    run_script,
    windows_of,
    write_batches,
)

from dedupsink.sink.datasource import DedupCommitMessage, DedupDataSource, DedupStreamWriter
from dedupsink.sink.plan import SinkPlan

# A cluster of two executor JVMs takes 36 s to start on this 2-core host: the distributed
# cases are slow tests, which CI runs with `make test-slow`.
pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow]

MASTER = "local-cluster[2,1,1024]"
HOUR_MICROS = 3_600_000_000
START = datetime(2024, 3, 1, tzinfo=UTC)
COLUMNS = ("id", "at", "body")


def events() -> list[pa.Table]:
    """Three windows; every key comes three times in its window, some come back later."""

    def window(ids: list[int], hours: list[float]) -> pa.Table:
        at = [START + timedelta(hours=h) for h in hours]
        return pa.table(
            {
                "id": pa.array(ids * 3, pa.int64()),
                "at": pa.array(at * 3, pa.timestamp("us", tz="UTC")),
                "body": [f"event {i}" for i in ids] * 3,
            }
        )

    return [
        window(list(range(0, 10)), [i / 10 for i in range(0, 10)]),
        window(list(range(5, 15)), [i / 10 for i in range(5, 15)]),
        window([*range(0, 20, 2), 30], [*(i / 10 for i in range(0, 20, 2)), 3.0]),
    ]


STREAMS = {
    "basic": ({"keys": "id"}, "basic", None),
    "tupleTime": (
        {"keys": "id", "expiryKey": "at", "expiryPeriod": "1 hour"},
        "tupleTime",
        HOUR_MICROS,
    ),
}


class TracedWriter(DedupStreamWriter):
    """The sink's writer, noting which executor's Python daemon ran each task."""

    def __init__(self, plan: SinkPlan, trace_dir: str) -> None:
        super().__init__(plan)
        self.trace_dir = trace_dir

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        context = TaskContext.get()
        assert context is not None
        # Python workers are forked by one daemon per executor: the parent pid names the executor.
        Path(self.trace_dir, f"daemon-{os.getppid()}-partition-{context.partitionId()}").touch()
        return super().write(iterator)


class TracedDedupDataSource(DedupDataSource):
    """``format("dedup_traced")``: the dedup sink with a ``traceDir`` option."""

    @classmethod
    def name(cls) -> str:
        return "dedup_traced"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TracedWriter:
        trace_dir = self.options.pop("traceDir")
        return TracedWriter(super().streamWriter(schema, overwrite).plan, trace_dir)


def cluster_session() -> Any:
    """conftest's session settings on the cluster master, with no wait for task locality.

    One input file makes one map task, so all shuffle output sits on one executor; without these
    two settings that executor may run every task of a short window by itself.
    """
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(MASTER)
        .appName("dedupsink-cluster-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.locality.wait", "0")
        .config("spark.shuffle.reduceLocality.enabled", "false")
        .getOrCreate()
    )


def main(argument: str) -> None:
    """Child process: run the streams of ``argument`` on the cluster; note its executors."""
    job = json.loads(argument)
    spark = cluster_session()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(TracedDedupDataSource)
    try:
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        Path(job["report"]).write_text(json.dumps({"executors": executors}))
        run_jobs(spark, job["streams"])
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster")
    write_batches(root / "in", events())
    streams = []
    for name, (options, _, _) in STREAMS.items():
        (root / name / "trace").mkdir(parents=True)
        streams.append(
            {
                "input": str(root / "in"),
                "output": str(root / name / "out"),
                "checkpoint": str(root / name / "chk"),
                "format": "dedup_traced",
                "repartition": 4,
                "options": {**options, "traceDir": str(root / name / "trace")},
            }
        )
    run_script(Path(__file__), {"report": str(root / "report.json"), "streams": streams})
    return root


def test_cluster_has_two_executor_processes_that_both_ran_sink_tasks(cluster_run: Path) -> None:
    assert json.loads((cluster_run / "report.json").read_text())["executors"] == 2
    for name in STREAMS:
        traces = [p.name.split("-") for p in (cluster_run / name / "trace").iterdir()]
        assert len({daemon for _, daemon, _, _ in traces}) == 2, traces
        assert {int(partition) for *_, partition in traces} == {0, 1, 2, 3}


@pytest.mark.parametrize("name", list(STREAMS))
def test_copies_in_different_processes_give_one_unique_and_the_reference_result(
    spark: Any, cluster_run: Path, name: str
) -> None:
    _, mode, period = STREAMS[name]
    output = cluster_run / name / "out"
    windows = windows_of(events())
    expected = reference_outputs(windows, mode, ["id"], "at" if period else None, period)
    assert_matches_reference(output, expected, COLUMNS)
    assert set(Counter(read_port(output, "unique").column("id").to_pylist()).values()) == {1}
    check_ports(spark, output, COLUMNS, len(windows))


if __name__ == "__main__":
    main(sys.argv[1])
