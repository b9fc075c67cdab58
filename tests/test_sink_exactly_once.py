"""Exactly once and persistence (docs/SEMANTICS.md, rules 6 and 7) on real streams.

Restarts from the checkpoint, a batch re-run after its sink commit, a fresh query on an
existing store (with and without releasing the owner lease), and task failures: every input row
must land in exactly one port exactly once, equal to the reference model over all input.

The task-failure tests need Spark's task retries, which ``local[2]`` disables; they run this
module as a script in a child process with its own ``local[2,2]`` session (``python
tests/test_sink_exactly_once.py '<json>'``), where a small subclass of the sink, registered as
``dedup_flaky``, fails chosen task attempts after they have staged all their output.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import StructType
from streams import (
    PORT_NAMES,
    Output,
    arrow_counts,
    as_remote,
    assert_matches_reference,
    check_ports,
    files_under,
    output_listing,
    reference_outputs,
    run_jobs,
    run_script,
    run_stream,
    sink_target,
    start_stream,
    windows_of,
    write_batches,
)

import dedupsink
from dedupsink.sink.datasource import DedupCommitMessage, DedupDataSource, DedupStreamWriter
from dedupsink.sink.plan import SinkPlan

COLUMNS = ("id", "seq", "body")
ORDERED = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10"}


def batch(ids: list[int | None], seqs: list[int | None]) -> pa.Table:
    """Rows whose body is a function of the key, so re-sent copies are identical rows."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "seq": pa.array(seqs, pa.int64()),
            "body": [f"event {i}" for i in ids],
        }
    )


def events() -> list[pa.Table]:
    return [
        batch([1, 2, 2, 3], [10, 11, 11, 12]),
        batch([4, 1, 5, None], [15, 10, 16, 17]),
        batch([6, 2, 7, 7], [20, 11, 22, 22]),
        batch([8, 3, 9, 10], [25, 12, 26, None]),
        batch([11, 6, 12, 9], [30, 20, 31, 26]),
        batch([13, 14, 13, 1], [33, 34, 33, 10]),
    ]


def expected(windows: list[pa.Table], mode: str = "ordered") -> dict[str, Any]:
    if mode == "basic":
        return reference_outputs(windows, "basic", ["id"])
    return reference_outputs(windows, "ordered", ["id"], "seq", 10)


def port_listing(output: Output) -> dict[str, int]:
    """The files readers can see: everything in the port directories, logs included."""
    return {
        name: size
        for name, size in output_listing(output).items()
        if name.split("/", 1)[0] in PORT_NAMES
    }


def staged_files(output: Output) -> list[str]:
    return list(files_under(output, "_staging"))


# -- in this process, on the shared local[2] session -----------------------------------------


@pytest.mark.spark
def test_restart_from_checkpoint_with_more_files_continues_as_one_stream(
    spark: Any, workdir: Path, place: Output
) -> None:
    data, output, checkpoint = events(), place, workdir / "chk"
    write_batches(workdir / "in", data[:3])
    run_stream(spark, workdir / "in", output, ORDERED, checkpoint)
    assert_matches_reference(output, expected(data[:3]), COLUMNS)
    write_batches(workdir / "in", data[3:], start=3)
    run_stream(spark, workdir / "in", output, ORDERED, checkpoint)
    assert_matches_reference(output, expected(data), COLUMNS)
    check_ports(spark, output, COLUMNS, len(data))


@pytest.mark.spark
def test_batch_rerun_after_its_sink_commit_changes_nothing(
    spark: Any, workdir: Path, place: Output
) -> None:
    data, output, checkpoint = events(), place, workdir / "chk"
    write_batches(workdir / "in", data[:4])
    run_stream(spark, workdir / "in", output, ORDERED, checkpoint)
    before = port_listing(output)
    # Spark forgets that batch 3 finished: the sink committed it, the checkpoint did not.
    (checkpoint / "commits" / "3").unlink()
    (checkpoint / "commits" / ".3.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    query = start_stream(spark, workdir / "in", {**sink_target(output), **ORDERED}, checkpoint)
    query.awaitTermination()
    assert query.lastProgress["batchId"] == 3, "Spark should have run batch 3 again"
    assert (checkpoint / "commits" / "3").exists()
    assert port_listing(output) == before
    assert_matches_reference(output, expected(data[:4]), COLUMNS)
    assert not staged_files(output)
    # The stream goes on from there as if nothing had happened.
    write_batches(workdir / "in", data[4:], start=4)
    run_stream(spark, workdir / "in", output, ORDERED, checkpoint)
    assert_matches_reference(output, expected(data), COLUMNS)
    check_ports(spark, output, COLUMNS, len(data))


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["basic", "ordered"])
def test_fresh_checkpoint_after_release_finds_every_reread_row_duplicate_or_expired(
    spark: Any, workdir: Path, mode: str, place: Output
) -> None:
    data, output = events(), place
    options = {"keys": "id"} if mode == "basic" else ORDERED
    write_batches(workdir / "in", data)
    run_stream(spark, workdir / "in", output, options, workdir / "chk-1")
    first = arrow_counts(output)
    remote = as_remote(output)
    dedupsink.release(remote.url, storage_options=remote.storage_options)
    run_stream(spark, workdir / "in", output, options, workdir / "chk-2")
    # The store remembers the first query's keys: the same windows again, continuing the state.
    assert_matches_reference(output, expected(data + data, mode), COLUMNS)
    second = arrow_counts(output)
    assert second["unique"] == first["unique"]
    assert second["error"] == 2 * first["error"]
    reread = sum(data_table.num_rows for data_table in data) - first["error"]
    assert (second["duplicate"] - first["duplicate"]) + (
        second["expired"] - first["expired"]
    ) == reread
    check_ports(spark, output, COLUMNS, 2 * len(data))


# -- in a child process with task retries (local[2,2]) ---------------------------------------


class FlakyWriter(DedupStreamWriter):
    """The sink's writer, failing partition 0 of one batch after its output is staged."""

    def __init__(self, plan: SinkPlan, fail_dir: str, fail_batch: int, fail_times: int) -> None:
        super().__init__(plan)
        self.fail_dir = fail_dir
        self.fail_batch = fail_batch
        self.fail_times = fail_times

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        message = super().write(iterator)
        context = TaskContext.get()
        assert context is not None
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or -1)
        failures = Path(self.fail_dir)
        if (
            batch_id == self.fail_batch
            and context.partitionId() == 0
            and len(list(failures.iterdir())) < self.fail_times
        ):
            attempt = context.attemptNumber()
            (failures / f"attempt-{attempt}-{uuid.uuid4().hex}").touch()
            raise RuntimeError(f"injected failure of batch {batch_id} attempt {attempt}")
        return message


class FlakyDedupDataSource(DedupDataSource):
    """``format("dedup_flaky")``: the dedup sink with options failDir, failBatch, failTimes."""

    @classmethod
    def name(cls) -> str:
        return "dedup_flaky"

    def streamWriter(self, schema: StructType, overwrite: bool) -> FlakyWriter:
        fail_dir = self.options.pop("failDir")
        fail_batch = int(self.options.pop("failBatch"))
        fail_times = int(self.options.pop("failTimes"))
        writer = super().streamWriter(schema, overwrite)
        return FlakyWriter(writer.plan, fail_dir, fail_batch, fail_times)


def main(argument: str) -> None:
    """Child process: run the streams of ``argument`` on a session with task retries."""
    from conftest import build_session

    job = json.loads(argument)
    spark = build_session(job["master"], "dedupsink-task-retries")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FlakyDedupDataSource)
    try:
        for stream in job["streams"]:
            try:
                run_jobs(spark, [stream])
            except StreamingQueryException:
                if not stream.get("expect_failure"):
                    raise
            else:
                assert not stream.get("expect_failure"), "the query should have failed"
    finally:
        spark.stop()


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs in a child process: a task failing once (retried), then twice (query fails, rerun)."""
    root = tmp_path_factory.mktemp("retries")
    data = events()
    write_batches(root / "in", data)
    streams = []
    for name, times, runs in (("once", 1, [False]), ("twice", 2, [True, False])):
        (root / name / "failures").mkdir(parents=True)
        for expect_failure in runs:
            streams.append(
                {
                    "input": str(root / "in"),
                    "output": str(root / name / "out"),
                    "checkpoint": str(root / name / "chk"),
                    "format": "dedup_flaky",
                    "files_per_batch": 2,
                    "repartition": 2,
                    "expect_failure": expect_failure,
                    "options": {
                        **ORDERED,
                        "failDir": str(root / name / "failures"),
                        "failBatch": "1",
                        "failTimes": str(times),
                    },
                }
            )
    run_script(Path(__file__), {"master": "local[2,2]", "streams": streams})
    return root


@pytest.mark.spark
@pytest.mark.slow  # their fixture runs a Spark of its own with task retries: 24 s
@pytest.mark.parametrize(("name", "failures"), [("once", 1), ("twice", 2)])
def test_failed_task_attempts_leave_no_row_twice_and_none_lost(
    spark: Any, retried: Path, name: str, failures: int
) -> None:
    """Once: Spark retries the task. Twice: the query fails and is restarted from its checkpoint.

    Either way the failed attempts staged a complete output that must never be published.
    """
    output = retried / name / "out"
    assert len(list((retried / name / "failures").iterdir())) == failures
    windows = windows_of(events(), 2)
    assert_matches_reference(output, expected(windows), COLUMNS)
    check_ports(spark, output, COLUMNS, len(windows))
    assert not staged_files(output)


if __name__ == "__main__":
    main(sys.argv[1])
