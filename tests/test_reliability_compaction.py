"""Process faults in a port compaction (``dedupsink compact``) of Delta and Iceberg ports.

The compaction runs in ``tests/reliability_driver.py`` (engine ``compact``), a process of its
own that a fault point SIGKILLs: between writing its files and its commit, in the middle of the
commit (Delta: the log entry written aside, not yet linked into place; Iceberg: the snapshot's
manifests written, the catalog not yet swapped) and right after it. Delta's compaction writes
through the counting test filesystem, so the slow test kills it at every step it takes; Iceberg's
commit goes past fsspec, so its points sit in test subclasses (``tests/faults.py``).

After each kill the tables must read as before (every input row in exactly one port, once);
a rerun must compact; and after a window more, every table must equal the reference model with
one commit of rows per window (compactions checked to change no rows). Files of a compaction
killed before its commit stay in the table's folder, named by no table version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faults import FaultPoint, assert_exactly_once, compaction_point, ordered_batch, write_inputs
from lakehouse import PortTables, check_tables, per_window
from test_reliability_tables import TableJob

from dedupsink.engine.classify import PORTS

COLUMNS = ("rid", "id", "n")


class CompactionJob(TableJob):
    """A table job whose port tables are compacted, killed and compacted again."""

    def compact(self) -> dict[str, Any]:
        from faults import run_driver

        done = run_driver({**self.config, "engine": "compact"}, self.control, self.root)
        self.runs.append(done)
        return {"killed": done.killed, **done.result}

    def add_window(self) -> None:
        self.inputs.append(ordered_batch(len(self.inputs)))
        write_inputs(self.root / "in", self.inputs)
        self.run_until_done()

    def tables(self) -> PortTables:
        return PortTables(self.format, self.output)

    def live_files(self, port: str) -> int:
        return len(self.referenced_files(port))

    def check(self) -> None:
        by_port = self.rows_by_port()
        assert_exactly_once(by_port, self.inputs)
        expected = per_window(self.inputs, "ordered", ["id"], "n", 10)
        check_tables(self.tables(), expected, COLUMNS)


def kill_compaction_then_rerun(job: CompactionJob, point: FaultPoint) -> None:
    """Kill a compaction at ``point``: the tables read as before; a rerun compacts every port
    to one file; a window more lands on top, and every table equals the reference."""
    before = job.rows_by_port()
    files_before = {port: job.data_files(port) for port in PORTS}
    job.control.set_points([point])
    killed = job.compact()
    assert killed["killed"], killed
    assert point.name in job.control.fired()
    assert job.rows_by_port() == before
    job.check()

    rerun = job.compact()
    assert not rerun["killed"] and rerun.get("ok"), rerun
    assert job.rows_by_port() == before
    for port in PORTS:
        assert job.live_files(port) <= 1, (port, job.live_files(port))
        assert files_before[port] <= job.data_files(port)  # nothing deleted: time travel
    job.add_window()
    job.check()


def delta_points(port: str) -> list[FaultPoint]:
    """Before the commit (files written), mid-commit (the log entry written aside, not linked),
    right after the link (its aside copy not yet removed), after the commit."""
    log = f"{port}/_delta_log"
    return [
        FaultPoint(f"{port}-files-written", compaction_point(port, "commit")),
        FaultPoint(f"{port}-entry-aside", "compact", op="link", path_part=log),
        FaultPoint(f"{port}-entry-linked", "compact", op="rm_file", path_part=log),
        FaultPoint(f"{port}-committed", compaction_point(port, "committed")),
    ]


def iceberg_points(port: str) -> list[FaultPoint]:
    """Before the snapshot (files written), before the catalog's swap (manifests written),
    after it."""
    return [
        FaultPoint(f"{port}-{step}", compaction_point(port, step))
        for step in ("commit", "swap", "committed")
    ]


POINTS = {"delta": delta_points, "iceberg": iceberg_points}


# Iceberg's kill chain (19 s) is a slow test: Delta's runs the same points in the regular suite.
@pytest.mark.parametrize("fmt", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_compaction_killed_before_in_and_after_its_commit(tmp_path: Path, fmt: str) -> None:
    job = CompactionJob(tmp_path, fmt)
    job.run_until_done()
    points = POINTS[fmt]("duplicate")
    for point in (points[0], points[1], points[-1]):
        kill_compaction_then_rerun(job, point)


# The ports are compacted one after another by the same code: every step of the first port's
# compaction and of the last one's (every kind of step, and the hand-over between ports) proves
# what every step of all four did, in half the kills (the four took 7.5 minutes).
KILLED_PORTS = (PORTS[0], PORTS[-1])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_compaction_killed_at_every_step(tmp_path: Path, fmt: str) -> None:
    """Delta: every filesystem call the compaction makes in the first and the last port
    (recorded from a first run), then the commit's edges; Iceberg: each point of those ports."""
    job = CompactionJob(tmp_path, fmt)
    job.run_until_done()
    points = [point for port in KILLED_PORTS for point in POINTS[fmt](port)]
    if fmt == "delta":
        job.control.set_points([], record=True)
        assert job.compact().get("ok")
        steps = [s for s in job.control.steps() if s["kind"] == "compact"]
        assert len(steps) >= 4 * len(PORTS), steps
        job.control.clear_steps()
        job.add_window()
        mine = [s for s in steps if any(f"/{port}/" in s["path"] for port in KILLED_PORTS)]
        assert len(mine) >= 8 and len(mine) < len(steps), mine
        points += [FaultPoint(f"step-{s['step']}", "compact", step=s["step"]) for s in mine]
    for point in points:
        kill_compaction_then_rerun(job, point)
