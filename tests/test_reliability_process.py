"""Process faults: real processes killed with real signals, then restarted from their checkpoint.

* A Spark Python worker SIGKILLs itself in the middle of ``write()`` (master ``local[2,3]``,
  so Spark retries the task): the batch succeeds on the retry.
* The whole driver (its process group: Python, JVM, Python workers) is SIGKILLed before the
  sink commit, at a step inside it, and after it but before Spark's checkpoint commit; the job
  is restarted from its checkpoint.
* Every step of the commit, in turn, through the direct engine of ``reliability_driver.py``
  (the sink's batch code without Spark's transport, in a process of its own, killed the same
  way), including kills while a restart is still finishing an interrupted publication.
* Ownership: a second query on an owned store fails fast; once the owner is gone, a new query
  takes over after ``dedupsink.release`` or when the owner's ``ownerTimeout`` lapses.

Every scenario ends with each input row in exactly one port exactly once, the ports equal to the
reference model (in the order the windows were committed), and Spark's readers (through the
sink log) seeing exactly what pyarrow sees in the directories. The fault plans and the driver
script are in ``tests/faults.py`` and ``tests/reliability_driver.py``.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from faults import (
    ORDERED_OPTIONS,
    PORTS,
    ROW_SCHEMA_DDL,
    Control,
    DriverProcess,
    DriverRun,
    FaultPoint,
    assert_exactly_once,
    commit_order,
    fault_url,
    logged_rows_by_port,
    ordered_batch,
    rows_by_port,
    run_driver,
    stray_files,
    wait_for,
    write_inputs,
)
from streams import PORT_NAMES, port_rows, reference_outputs

import dedupsink
from dedupsink.store.records import now_ms
from dedupsink.store.store import BucketStore

MAX_RUNS = 60


class Job:
    """A stream of ordered-mode windows through the sink, run and re-run by the driver script."""

    def __init__(self, root: Path, batches: int, *, engine: str = "spark", **config: Any) -> None:
        self.root = root
        self.inputs = [ordered_batch(b) for b in range(batches)]
        self.output = root / "out"
        self.control = Control(root / "control").setup()
        write_inputs(root / "in", self.inputs)
        checkpoint = root / ("chk" if engine == "spark" else "chk.json")
        self.config: dict[str, Any] = {
            "engine": engine,
            "input": str(root / "in"),
            "output": fault_url(self.output),
            "checkpoint": str(checkpoint),
            "options": dict(ORDERED_OPTIONS),
            "schema": ROW_SCHEMA_DDL,
            "read_back": str(self.output),
            **config,
        }
        self.runs: list[DriverRun] = []

    def run(self, **overrides: Any) -> DriverRun:
        config = {**self.config, "attempt": len(self.runs), **overrides}
        done = run_driver(config, self.control, self.root)
        self.runs.append(done)
        return done

    def run_until_done(self, check_between: bool = True) -> DriverRun:
        """Restart after every kill (as an operator or a scheduler would) until the job ends."""
        for _ in range(MAX_RUNS):
            done = self.run()
            if not done.killed:
                assert done.returncode == 0, f"{done.result}\n{done.stderr}"
                return done
            if check_between:
                assert_consistent_after_crash(self.output)
        raise AssertionError(f"still killed after {MAX_RUNS} runs")


def assert_consistent_after_crash(output: Path) -> None:
    """What holds right after a kill: the store reads back, no row is visible twice, and Spark's
    readers (the sink log) see no row that the directory does not hold."""
    BucketStore(str(output / "_store")).read()
    visible = rows_by_port(output)
    assert_no_row_twice(visible)
    logged = logged_rows_by_port(output)
    for port in PORTS:
        assert set(logged[port]) <= set(visible[port]), port


def assert_no_row_twice(by_port: dict[str, list[int]]) -> None:
    everything = [rid for rids in by_port.values() for rid in rids]
    assert len(everything) == len(set(everything)), "a row is visible twice"


def assert_final_state(job: Job, spark_counts: dict[str, int] | None) -> None:
    """Each input row in exactly one port exactly once; the reference model in commit order;
    Spark (sink log) and pyarrow (directory) agree; nothing stray left for readers."""
    output = job.output
    visible = rows_by_port(output)
    assert_exactly_once(visible, job.inputs)
    assert logged_rows_by_port(output) == visible
    if spark_counts is not None:
        assert spark_counts == {port: len(visible[port]) for port in PORTS}
    assert_reference(output, job.inputs, commit_order(output, job.inputs))
    assert stray_files(output) == []


def assert_reference(output: Path, inputs: Sequence[pa.Table], order: Sequence[int]) -> None:
    """Ports equal the reference over (id, n): which copy of a key is unique is not compared."""
    windows = [inputs[i].drop_columns(["rid"]) for i in order]
    expected = reference_outputs(windows, "ordered", ["id"], "n", 10)
    actual = {port: port_rows(output, port, ["id", "n"]) for port in PORT_NAMES}
    assert actual == dict(expected)


# -- Spark: Python workers killed in write(), the driver killed around the sink commit ----------


@pytest.mark.spark
@pytest.mark.slow  # 100 s: CI runs it with `make test-slow`
def test_spark_worker_killed_mid_write_and_driver_killed_around_the_commit_lose_nothing(
    tmp_path: Path,
) -> None:
    """One job (master ``local[2,3]``: tasks are retried; two partitions a window) suffers two
    Python worker kills inside ``write()``, which Spark's task retries absorb within the run, and
    three driver kills, each followed by a restart from the checkpoint: before the sink commit,
    inside it (window committed, two of four ports' log entries written), and after it but before
    Spark's own checkpoint commit."""
    job = Job(tmp_path, 5, master="local[2,3]", repartition=2)
    job.control.set_points(
        [
            # The first task of window 0 to reach its fourth filesystem call dies there: one
            # port file staged, the next being opened (or its new keys being written).
            FaultPoint("worker-staging", "task", batch=0, step=4),
            # A task of window 1 dies after staging every port, writing its new keys.
            FaultPoint("worker-keys", "task", batch=1, op="open(wb)", path_part="/data/"),
            FaultPoint("driver-before", "before-commit", batch=1),
            FaultPoint("driver-inside", "commit", batch=2, op="link", path_part="expired/_spark"),
            FaultPoint("driver-after", "after-commit", batch=3),
        ]
    )
    done = job.run_until_done()
    fired = job.control.fired()
    assert set(fired) == {
        "worker-staging", "worker-keys", "driver-before", "driver-inside", "driver-after"
    }  # fmt: skip
    assert fired["worker-staging"]["op"] in ("open(wb)", "pipe_file")
    assert fired["worker-staging"]["kind"] == fired["worker-keys"]["kind"] == "task"
    assert [r.killed for r in job.runs] == [True, True, True, False]
    assert_final_state(job, done.result["spark_counts"])


# -- the direct engine: a kill at every step of the commit ------------------------------------


def signature(step: dict[str, Any], root: Path) -> str:
    """A commit step with window numbers, random ids and the port blanked: the same step of any
    window (the four ports take one code path)."""
    path = step["path"].replace(str(root.resolve()), "")
    path = re.sub(r"/(unique|duplicate|expired|error)/", "/<port>/", path)
    return f"{step['op']} {re.sub(r'[0-9a-f]{8,}|[0-9]+', '#', path)}"


def every_step_points(steps: list[dict[str, Any]], root: Path, batches: int) -> list[FaultPoint]:
    """One kill per window, at a step of its commit of a kind not killed at yet (the rarest
    first), until every kind of step that changes the disk has had its kill."""
    commits: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for step in steps:
        if step["kind"] == "commit" and 0 < step["batch"] < batches - 1 and step["changes"]:
            commits[step["batch"]].append(step)
    frequency = Counter(signature(s, root) for b in commits for s in commits[b])
    covered: set[str] = set()
    points = []
    for batch in sorted(commits):
        fresh = [s for s in commits[batch] if signature(s, root) not in covered]
        if not fresh:
            continue
        step = min(fresh, key=lambda s: (frequency[signature(s, root)], s["step"]))
        covered.add(signature(step, root))
        points.append(FaultPoint(f"w{batch:02d}", "commit", batch=batch, step=step["step"]))
    missing = set(frequency) - covered
    assert not missing, f"not enough windows to kill at every step: {missing}"
    return points


@pytest.mark.spark
@pytest.mark.slow  # a kill at each of about twenty kinds of step: CI runs it with test-slow
def test_driver_killed_at_every_step_of_the_commit_restarts_exactly_once(
    tmp_path: Path, spark: Any
) -> None:
    # Eight garbage collections (versions 16 to 128: old manifests, dropped and orphaned window
    # files, stale staging, folded history records), twelve log compactions.
    batches = 130
    rehearsal = Job(tmp_path / "rehearsal", batches, engine="direct")
    rehearsal.control.set_points([], record=True)
    assert rehearsal.run().returncode == 0
    points = every_step_points(rehearsal.control.steps(), rehearsal.output, batches)
    planned = {
        p.name: next(
            s
            for s in rehearsal.control.steps()
            if s["kind"] == "commit" and s["batch"] == p.batch and s["step"] == p.step
        )
        for p in points
    }
    kinds = {signature(s, rehearsal.output).split(" ")[0] for s in rehearsal.control.steps()}
    assert {"open(wb)", "link", "mv", "rm", "rm_file"} <= kinds

    job = Job(tmp_path / "crash", batches, engine="direct")
    # Kill again while the restarted job finishes the publication a kill interrupted (at the
    # first move into a port: the re-run of that batch redoes the moves in its commit), and
    # around the commit's edges.
    interrupted = next(p for p in points if "/unique/part-" in planned[p.name]["path"])
    extra = [
        FaultPoint("recovering", "commit", batch=interrupted.batch, step=2, after=interrupted.name),
        FaultPoint("before", "before-commit", batch=batches - 2),
        FaultPoint("after", "after-commit", batch=batches - 1),
    ]
    job.control.set_points([*points, *extra])
    job.run_until_done()
    fired = job.control.fired()
    assert set(fired) == {p.name for p in [*points, *extra]}
    for point in points:
        assert fired[point.name]["op"] == planned[point.name]["op"], point
    assert sum(r.killed for r in job.runs) == len(points) + len(extra)
    assert fired["recovering"]["op"] == "mv" and "/unique/part-" in fired["recovering"]["path"]
    spark_counts = {p: spark.read.parquet(str(job.output / p)).count() for p in PORTS}
    assert_final_state(job, spark_counts)
    assert not list((job.output / "_store" / "_log").glob(".*.tmp")), "stray manifest temp files"


# -- ownership (fast: the direct engine, no JVM) ------------------------------------------------


def test_release_of_an_owner_killed_mid_publication_keeps_its_window(tmp_path: Path) -> None:
    """``dedupsink release`` after the owner died between its commit point and the end of its
    publication: the window it committed still reaches the ports, exactly once, whoever runs
    next (a new query on the store, then the old one restarted from its checkpoint)."""
    owner = Job(tmp_path, 4, engine="direct", query_id="owner")
    owner.control.set_points(
        [FaultPoint("mid", "commit", batch=1, op="mv", path_part="/duplicate/part-")]
    )
    assert owner.run().killed
    dedupsink.release(str(owner.output))
    newcomer_inputs = [ordered_batch(b) for b in range(4, 6)]
    write_inputs(tmp_path / "newcomer-in", newcomer_inputs)
    newcomer = owner.run(
        input=str(tmp_path / "newcomer-in"),
        checkpoint=str(tmp_path / "newcomer-chk.json"),
        query_id="newcomer",
    )
    assert newcomer.returncode == 0, newcomer.result
    dedupsink.release(str(owner.output))
    resumed = owner.run()
    assert resumed.returncode == 0, resumed.result
    every = [*owner.inputs, *newcomer_inputs]
    visible = rows_by_port(owner.output)
    assert_exactly_once(visible, every)
    assert logged_rows_by_port(owner.output) == visible
    assert_reference(owner.output, every, commit_order(owner.output, every))


def test_a_paused_owner_whose_store_was_taken_over_cannot_commit(tmp_path: Path) -> None:
    """A zombie: the owner pauses just before its commit point (a long GC pause, a stopped
    VM); its lease lapses and another query takes the store over and commits. Resumed, the owner
    finds its version taken (the conditional create fails) and stops, naming the other query;
    restarted from its checkpoint it continues, and every row is in one port exactly once."""
    from dedupsink.sink.local import LocalSink

    owner = Job(tmp_path, 4, engine="direct", query_id="owner")
    owner.config["options"]["ownerTimeout"] = "2 s"
    owner.control.set_points(
        [FaultPoint("hold", "commit", batch=2, op="open(wb)", path_part="/_log/.", action="pause")]
    )
    running = DriverProcess({**owner.config, "attempt": 0}, owner.control, tmp_path)
    intruder_input = ordered_batch(9)
    try:
        wait_for(lambda: owner.control.is_paused("hold"), 120, "the owner to reach its commit")
        intruder = LocalSink(
            {"path": str(owner.output), **ORDERED_OPTIONS}, intruder_input.schema, "intruder"
        )
        started = now_ms()
        report = intruder.window(0, intruder_input)  # waits out the owner's 2 s lease
        assert report is not None and report.version == 3
        assert now_ms() - started < 10_000
    finally:
        owner.control.resume("hold")
    zombie = running.wait()
    assert zombie.returncode == 1
    assert "StoreConflictError" in zombie.result["error"]
    assert "committed it first" in zombie.result["error"] and "intruder" in zombie.result["error"]
    dedupsink.release(str(owner.output))
    done = owner.run()
    assert done.returncode == 0, f"{done.result}\n{done.stderr}"
    every = [*owner.inputs, intruder_input]
    visible = rows_by_port(owner.output)
    assert_exactly_once(visible, every)
    assert logged_rows_by_port(owner.output) == visible


def listing(output: Path) -> dict[str, int]:
    return {str(p.relative_to(output)): p.stat().st_size for p in output.rglob("*") if p.is_file()}


# -- ownership with Spark (slow) ------------------------------------------------------------


def start_plain_query(
    spark: Any, inputs: Path, output: Path, checkpoint: Path, **options: str
) -> Any:
    """A query of the plain ``dedup`` format in this test process's Spark session."""
    frame = (
        spark.readStream.schema(ROW_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    )
    writer = frame.writeStream.format("dedup").option("path", str(output))
    for key, value in {**ORDERED_OPTIONS, **options}.items():
        writer = writer.option(key, value)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


@pytest.mark.slow
@pytest.mark.spark
def test_a_new_query_takes_over_from_an_owner_killed_mid_publication_without_release(
    tmp_path: Path, spark: Any
) -> None:
    """The owner dies half-way through publishing a window. A new query (no release) waits at
    most the owner's ownerTimeout, finishes the dead owner's publication and runs; the old query,
    restarted from its checkpoint later, re-runs nothing it committed and continues."""
    owner = Job(tmp_path / "a", 6)
    owner.control.set_points(
        [FaultPoint("mid", "commit", batch=3, op="mv", path_part="/expired/part-")]
    )
    assert owner.run().killed
    second_inputs = [ordered_batch(b) for b in range(6, 9)]
    write_inputs(tmp_path / "b" / "in", second_inputs)
    started = now_ms()
    start_plain_query(
        spark, tmp_path / "b" / "in", owner.output, tmp_path / "b" / "chk", ownerTimeout="3 s"
    ).awaitTermination()
    assert now_ms() - started < 60_000
    done = owner.run()
    assert done.returncode == 0, f"{done.result}\n{done.stderr}"
    every = [*owner.inputs, *second_inputs]
    visible = rows_by_port(owner.output)
    assert_exactly_once(visible, every)
    assert logged_rows_by_port(owner.output) == visible
    assert done.result["spark_counts"] == {port: len(visible[port]) for port in PORTS}
    assert_reference(owner.output, every, commit_order(owner.output, every))


@pytest.mark.slow
@pytest.mark.spark
def test_owner_killed_mid_commit_a_new_query_takes_over_when_its_lease_lapses(
    tmp_path: Path, spark: Any
) -> None:
    owner = Job(tmp_path / "a", 5)
    owner.config["options"]["ownerTimeout"] = "3 s"
    owner.control.set_points(
        [FaultPoint("mid", "commit", batch=2, op="link", path_part="error/_spark_metadata/")]
    )
    assert owner.run().killed
    second_inputs = [ordered_batch(b) for b in range(5, 8)]
    write_inputs(tmp_path / "b" / "in", second_inputs)
    start_plain_query(
        spark, tmp_path / "b" / "in", owner.output, tmp_path / "b" / "chk", ownerTimeout="3 s"
    ).awaitTermination()
    every = [*owner.inputs[:3], *second_inputs]
    visible = rows_by_port(owner.output)
    assert_exactly_once(visible, every)
    assert logged_rows_by_port(owner.output) == visible
    assert {p: spark.read.parquet(str(owner.output / p)).count() for p in PORTS} == {
        p: len(visible[p]) for p in PORTS
    }
    assert_reference(owner.output, every, commit_order(owner.output, every))


# -- Spark: a kill at every kind of commit step (slow) ----------------------------------------

# (name, batch, operation, part of the path): one kill per window at a kind of commit step; the
# commit of batch 15 makes version 16, which collects garbage. Each kind once, at one port: the
# direct engine's test above kills every step of every port, and each kill here costs a Spark
# restart (a second move and a second log link took 40 s and proved nothing more).
SPARK_COMMIT_POINTS = (
    ("manifest-write", 2, "open(wb)", "/_store/_log/."),
    ("manifest-link", 3, "link", ".manifest"),
    ("move-unique", 4, "mv", "/unique/part-"),
    ("log-write-unique", 6, "open(wb)", "unique/_spark_metadata/."),
    ("log-link-error", 8, "link", "error/_spark_metadata/"),
    ("log-aside-removal", 9, "rm_file", "expired/_spark_metadata/."),
    ("staging-removal", 10, "rm", "/_staging/"),
    ("garbage-window-file", 15, "rm_file", "/_store/data/"),
)


@pytest.mark.slow
@pytest.mark.spark
def test_spark_driver_killed_at_every_kind_of_commit_step_restarts_exactly_once(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, 18)
    job.control.set_points(
        [
            FaultPoint(name, "commit", batch=batch, op=op, path_part=part)
            for name, batch, op, part in SPARK_COMMIT_POINTS
        ]
    )
    done = job.run_until_done()
    assert set(job.control.fired()) == {name for name, _, _, _ in SPARK_COMMIT_POINTS}
    assert_final_state(job, done.result["spark_counts"])
