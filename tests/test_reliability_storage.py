"""Storage faults: every write, rename and delete of a micro-batch fails in turn.

The faulted window runs the way Spark runs it, minus Spark's transport (``InProcessSink``: the
data source's ``streamWriter``, ``run_task`` per partition, the writer's ``commit``) over the
local disk through ``tests/faults.py``'s filesystem, which raises ``OSError`` (ENOSPC, or EIO;
``pipe_file`` leaves half its bytes behind, as a full disk does) at one chosen call. The window
is rich on purpose: two partitions that both find one key new (the later task yields its row,
or, run again as if the tasks had not seen each other's keys, the commit rewrites a staged
file), rows for all four ports, window files due for deletion, and the sixteenth version, whose
commit also sweeps orphaned window files, stale staging directories and old manifests.

For each failing call: the batch fails with the filesystem's error (errno and path); the store
still reads, no row is visible twice, Spark's log lists nothing the directory lacks, and
nothing of the window is visible unless its manifest was committed; then a restart re-runs the
batch and later windows, and every input row ends in exactly one port exactly once, as the
reference model says (slow: it runs the window once per call). Two real Spark cases (slow) fail
a task and a commit with ENOSPC.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from faults import (
    CONTROL_ENV,
    ORDERED_OPTIONS,
    PORTS,
    ROW_SCHEMA,
    ROW_SCHEMA_DDL,
    Control,
    FaultPoint,
    InProcessSink,
    assert_exactly_once,
    fault_url,
    logged_rows_by_port,
    ordered_batch,
    rows_by_port,
    run_driver,
    stray_files,
    write_inputs,
)
from streams import PORT_NAMES, port_rows, reference_outputs

from dedupsink.errors import StoreCorruptError
from dedupsink.ports.output import Output
from dedupsink.ports.repair import repair
from dedupsink.ports.sparklog import parse_entry, status_line
from dedupsink.runtime import RUNTIME
from dedupsink.sink import settle as settle_module
from dedupsink.sink.plan import TaskIdentity
from dedupsink.sink.task import run_task
from dedupsink.store.store import GARBAGE_EVERY, KEEP_MANIFESTS, BucketStore

WINDOWS = 18
FAULTED = 15  # its commit makes version 16: garbage collection and the periodic sweeps
PARTITIONS = 2
INPUTS = [ordered_batch(b) for b in range(WINDOWS)]


@pytest.fixture
def ctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Control:
    control = Control(tmp_path / "control").setup()
    monkeypatch.setenv(CONTROL_ENV, str(control.dir))
    return control


def sink_at(root: Path) -> InProcessSink:
    return InProcessSink(fault_url(root / "out"), ORDERED_OPTIONS, ROW_SCHEMA)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Windows 0..14 committed, plus what a failed query left: an orphaned window file and a
    stale staging directory (a task of another query that never committed)."""
    root = tmp_path_factory.mktemp("storage-template")
    sink = sink_at(root)
    sink.window(0, INPUTS[0], PARTITIONS)
    # After the run's first commit, which sweeps what earlier runs staged for committed windows.
    ghost = InProcessSink(fault_url(root / "out"), ORDERED_OPTIONS, ROW_SCHEMA, "ghost")
    ghost.task(0, 0, INPUTS[3].to_batches())
    for batch in range(1, FAULTED):
        sink.window(batch, INPUTS[batch], PARTITIONS)
    assert list((root / "out" / "_staging").glob("*-ghost-*"))
    return root


def copy_of(template: Path, target: Path) -> Path:
    shutil.copytree(template, target)
    return target


def committed_rows(upto: int) -> set[int]:
    return {rid for table in INPUTS[:upto] for rid in table.column("rid").to_pylist()}


def assert_consistent_after_failure(out: Path) -> int:
    """The state a failed batch leaves; returns the store's latest version."""
    manifest = BucketStore(str(out / "_store")).read()
    assert manifest is not None
    assert manifest.version in (FAULTED, FAULTED + 1)
    visible = rows_by_port(out)
    everything = [rid for rids in visible.values() for rid in rids]
    assert len(everything) == len(set(everything)), "a row is visible twice"
    logged = logged_rows_by_port(out)
    for port in PORTS:
        assert set(logged[port]) <= set(visible[port]), port
    if manifest.version == FAULTED:  # not committed: nothing of the window is visible
        assert set(everything) == committed_rows(FAULTED)
    else:
        assert committed_rows(FAULTED) <= set(everything) <= committed_rows(FAULTED + 1)
    return manifest.version


def assert_complete(out: Path) -> None:
    visible = rows_by_port(out)
    assert_exactly_once(visible, INPUTS)
    assert logged_rows_by_port(out) == visible
    windows = [table.drop_columns(["rid"]) for table in INPUTS]
    expected = reference_outputs(windows, "ordered", ["id"], "n", 10)
    assert {port: port_rows(out, port, ["id", "n"]) for port in PORT_NAMES} == dict(expected)
    # The ghost's leftovers go at the next sweep (version 16, or 32 if a fault hit that commit
    # before its sweep: see test_store_cleanup_failures_are_retried_by_a_later_sweep).
    assert [path for path in stray_files(out) if "-ghost-" not in path] == []


def faulted_steps(template: Path, tmp_path: Path, ctl: Control) -> list[dict[str, Any]]:
    """Every mutating call of the faulted window when nothing fails, in order."""
    root = copy_of(template, tmp_path / "rehearsal")
    ctl.set_points([], record=True)
    sink_at(root).window(FAULTED, INPUTS[FAULTED], PARTITIONS)
    steps = [s for s in ctl.steps() if s["batch"] == FAULTED]
    ctl.clear_steps()
    return steps


# Every call of a rich window in turn: 40-50 s each, so in the slow tier (CI runs it).
@pytest.mark.slow
@pytest.mark.parametrize("settled_by", ["task", "commit"])
def test_every_failing_write_rename_and_delete_of_a_batch_fails_it_and_a_rerun_loses_nothing(
    template: Path, tmp_path: Path, ctl: Control, settled_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if settled_by == "commit":  # as when the two tasks finish too close to see each other's keys
        monkeypatch.setattr(settle_module, "SETTLE_WITH_AT_MOST", 0)
    steps = faulted_steps(template, tmp_path, ctl)
    ops = {s["op"] for s in steps}
    assert {"open(wb)", "link", "mv", "rm", "rm_file", "makedirs"} <= ops, ops
    assert {s["kind"] for s in steps} == {"task", "commit"}
    # A key found new by both partitions: the later task yields its row, or else the commit
    # rewrites a staged file. The commit also sweeps leftovers.
    rewrites = any(
        s["kind"] == "commit" and s["op"] == "open(wb)" and s["path"].endswith(".parquet")
        for s in steps
    )
    assert rewrites == (settled_by == "commit")
    assert any(s["op"] == "rm" and "-ghost-" in s["path"] for s in steps)
    outcomes: dict[str, int] = {}
    for case, step in enumerate(steps):
        error = errno.EIO if case % 5 == 4 else errno.ENOSPC
        where = f"{step['kind']} p{step['partition']} step {step['step']}: {step['op']}"
        root = copy_of(template, tmp_path / f"case-{case}")
        point = FaultPoint(
            f"case-{case}",
            step["kind"],
            batch=FAULTED,
            partition=step["partition"],
            step=step["step"],
            action="raise",
            error=error,
            torn=step["op"] == "pipe_file",
        )
        ctl.set_points([point])
        sink = sink_at(root)
        with pytest.raises(OSError) as caught:
            sink.window(FAULTED, INPUTS[FAULTED], PARTITIONS)
        assert caught.value.errno == error, where
        assert caught.value.filename, where
        assert set(ctl.fired()) == {point.name}, where
        version = assert_consistent_after_failure(root / "out")
        outcomes[where] = version
        ctl.set_points([])
        restarted = sink_at(root)
        restarted.start()
        restarted.window(FAULTED, INPUTS[FAULTED], PARTITIONS, attempt=1)
        for batch in range(FAULTED + 1, WINDOWS):
            restarted.window(batch, INPUTS[batch], PARTITIONS)
        assert_complete(root / "out")
        shutil.rmtree(root)
        (ctl.dir / "fired" / point.name).unlink()
    # Failures before the commit point leave the previous version, after it the new one.
    assert set(outcomes.values()) == {FAULTED, FAULTED + 1}


@pytest.mark.slow  # a driver process killed at each clean-up point: 24 s
def test_store_cleanup_failures_are_retried_by_a_later_sweep(
    template: Path, tmp_path: Path, ctl: Control
) -> None:
    """A delete of garbage that fails (an orphan, a stale staging directory, an old manifest)
    fails that batch; the files are removed by a later commit's garbage collection or sweep,
    so the store's file count stays bounded."""
    steps = faulted_steps(template, tmp_path, ctl)
    deletes = [s for s in steps if s["kind"] == "commit" and s["op"] in ("rm_file", "rm")]
    cleanup = [s for s in deletes if f"-query-{FAULTED}" not in s["path"]]
    assert cleanup, deletes
    for case, step in enumerate(cleanup):
        root = copy_of(template, tmp_path / f"cleanup-{case}")
        ctl.set_points(
            [FaultPoint(f"c{case}", "commit", batch=FAULTED, step=step["step"], action="raise")]
        )
        with pytest.raises(OSError):
            sink_at(root).window(FAULTED, INPUTS[FAULTED], PARTITIONS)
        ctl.set_points([])
        sink = sink_at(root)
        sink.start()
        sink.window(FAULTED, INPUTS[FAULTED], PARTITIONS, attempt=1)
        for batch in range(FAULTED + 1, WINDOWS):
            sink.window(batch, INPUTS[batch], PARTITIONS)
        extra = [ordered_batch(b) for b in range(WINDOWS, 34)]
        for batch, table in enumerate(extra, start=WINDOWS):
            sink.window(batch, table, PARTITIONS)  # past version 32: the next sweep
        store = BucketStore(str(root / "out" / "_store"))
        manifest = store.read()
        assert manifest is not None
        referenced = set(manifest.files) | {name for name, _ in manifest.tombstones}
        on_disk = {p.name for p in (root / "out" / "_store" / "data").iterdir()}
        assert on_disk <= referenced, f"{step['path']}: left {on_disk - referenced}"
        assert not list((root / "out" / "_staging").glob("*-ghost-*"))
        assert len(store.versions()) <= KEEP_MANIFESTS + GARBAGE_EVERY
        shutil.rmtree(root)


# -- real Spark: a task and a commit fail with ENOSPC (slow) ---------------------------------


@pytest.mark.slow
@pytest.mark.spark
def test_spark_query_failing_on_a_full_disk_restarts_from_its_checkpoint_and_loses_nothing(
    tmp_path: Path,
) -> None:
    inputs = [ordered_batch(b) for b in range(4)]
    write_inputs(tmp_path / "in", inputs)
    ctl = Control(tmp_path / "control").setup(
        [
            FaultPoint(
                "task", "task", batch=1, op="open(wb)", path_part=".unique.parquet", action="raise"
            ),
            FaultPoint(
                "commit",
                "commit",
                batch=2,
                op="open(wb)",
                path_part="duplicate/_spark_metadata/.",
                action="raise",
            ),
        ]
    )
    config = {
        "engine": "spark",
        "input": str(tmp_path / "in"),
        "output": fault_url(tmp_path / "out"),
        "checkpoint": str(tmp_path / "chk"),
        "options": ORDERED_OPTIONS,
        "schema": ROW_SCHEMA_DDL,
        "read_back": str(tmp_path / "out"),
    }
    runs = []
    for _ in range(3):
        runs.append(run_driver(config, ctl, tmp_path))
        if runs[-1].returncode == 0:
            break
    assert [r.returncode for r in runs] == [1, 1, 0], [r.result for r in runs]
    for failed in runs[:2]:
        assert "injected fault" in failed.result["error"]
        assert "Errno 28" in failed.result["error"]
    out = tmp_path / "out"
    visible = rows_by_port(out)
    assert_exactly_once(visible, inputs)
    assert logged_rows_by_port(out) == visible
    assert runs[-1].result["spark_counts"] == {port: len(visible[port]) for port in PORTS}
    windows = [table.drop_columns(["rid"]) for table in inputs]
    expected = reference_outputs(windows, "ordered", ["id"], "n", 10)
    assert {port: port_rows(out, port, ["id", "n"]) for port in PORT_NAMES} == dict(expected)


# -- corruption: detected, named, never read as "no keys" ----------------------------------------


def committed_sink(root: Path, windows: int) -> InProcessSink:
    sink = sink_at(root)
    for batch in range(windows):
        sink.window(batch, INPUTS[batch], PARTITIONS)
    return sink


def fresh_worker() -> None:
    """Forget the process-wide bucket caches, as a new executor process would start."""
    RUNTIME.reset("store.bucket_managers")


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flip":
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damaged_window_file_stops_the_next_window_naming_the_file(
    tmp_path: Path, ctl: Control, how: str
) -> None:
    sink = committed_sink(tmp_path, 5)
    store = BucketStore(str(tmp_path / "out" / "_store"))
    manifest = store.read()
    assert manifest is not None
    # The newest window files hold the keys window 5 re-sends (1004, from window 4).
    newest = [name for name, wf in manifest.files.items() if wf.version == manifest.version]
    assert newest
    for name in newest:
        damage(Path(store.data_path(name)), how)
    before = rows_by_port(tmp_path / "out")
    fresh_worker()
    with pytest.raises(StoreCorruptError) as caught:
        sink.window(5, INPUTS[5], PARTITIONS)
    assert any(name in str(caught.value) for name in newest)
    assert "RELIABILITY.md" in str(caught.value)
    assert store.read() == manifest
    assert rows_by_port(tmp_path / "out") == before


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damaged_manifest_stops_the_query_at_start_and_tasks_naming_the_file(
    tmp_path: Path, ctl: Control, how: str
) -> None:
    sink = committed_sink(tmp_path, 4)
    store = BucketStore(str(tmp_path / "out" / "_store"))
    latest = Path(store.manifest_path(store.versions()[-1]))
    damage(latest, how)
    with pytest.raises(StoreCorruptError, match=re.escape(str(latest))):
        sink_at(tmp_path).start()
    plan = sink.plan
    with pytest.raises(StoreCorruptError, match=re.escape(str(latest))):
        run_task(plan, TaskIdentity("query", plan.run, 4, 0, 0), iter(INPUTS[4].to_batches()))


def test_manifest_rollback_procedure_recovers_a_damaged_latest_manifest(
    tmp_path: Path, ctl: Control
) -> None:
    """The documented recovery (docs/RELIABILITY.md) when the newest manifest is damaged and
    no copy exists: set it and its window's published files aside, re-run that window."""
    committed_sink(tmp_path, 6)
    out = tmp_path / "out"
    store = BucketStore(str(out / "_store"))
    version = store.versions()[-1]
    damage(Path(store.manifest_path(version)), "flip")
    roll_back_window(out, version, tmp_path / "aside")
    fresh_worker()
    sink = sink_at(tmp_path)
    sink.start()
    for batch in range(5, WINDOWS):  # batch 5 made the damaged version: Spark re-runs it
        sink.window(batch, INPUTS[batch], PARTITIONS)
    assert_complete(out)


def roll_back_window(out: Path, version: int, aside: Path) -> None:
    """Steps 2-4 of the manifest recovery in docs/RELIABILITY.md (the test's copy of them)."""
    aside.mkdir()
    log = out / "_store" / "_log"
    name = f"{version:012d}.manifest"
    shutil.move(log / name, aside / name)
    for port in PORTS:
        for part in (out / port).glob(f"part-{version:010d}-*.parquet"):
            shutil.move(part, aside / f"{port}-{part.name}")
        entries = sorted(
            (p for p in (out / port / "_spark_metadata").iterdir() if p.name[0].isdigit()),
            key=lambda p: int(p.name.split(".")[0]),
        )
        last = entries[-1]
        listed = [json.loads(x)["path"] for x in last.read_text().splitlines()[1:] if x]
        if all(f"/part-{version:010d}-" in path for path in listed):
            shutil.move(last, aside / f"{port}-log-{last.name}")


PORT_LOG_DAMAGE = {
    # A torn write: the entry ends in the middle of a line.
    "truncated mid-line": lambda text: text[: text.rindex('"size"')],
    # A lost line: valid JSON, one file fewer (only the store's count tells).
    "line dropped": lambda text: "\n".join(text.splitlines()[:-1]),
    "json broken": lambda text: text.replace('{"path"', '{"path:', 1),
    "size changed": lambda text: re.sub(r'"size":(\d)', lambda m: f'"size":{m[1]}0', text, count=1),
    "path changed": lambda text: text.replace("/part-", "/qart-", 1),
    "header lost": lambda text: text.replace("v1\n", "", 1),
}


@pytest.mark.parametrize("how", sorted(PORT_LOG_DAMAGE))
def test_damaged_port_log_entry_is_found_and_rewritten_by_repair(
    tmp_path: Path, ctl: Control, how: str
) -> None:
    """A damaged ``<port>/_spark_metadata/<n>`` makes Spark's readers fail or miss files
    (pyarrow reads the directory and is not affected): ``repair`` finds it (a dry run changes
    nothing) and rewrites it from the store's publication records; nothing is lost."""
    sink = committed_sink(tmp_path, 5)
    out = tmp_path / "out"
    entry = out / "unique" / "_spark_metadata" / "3"
    intact = entry.read_text()
    entry.write_text(PORT_LOG_DAMAGE[how](intact))
    store, output = BucketStore(str(out / "_store")), Output(fault_url(out))
    found = repair(store, output, dry_run=True)
    assert [(r.port, r.log_id) for r in found] == [("unique", 3)]
    assert entry.read_text() != intact
    assert [(r.port, r.log_id) for r in repair(store, output)] == [("unique", 3)]
    assert entry.read_text() == intact
    assert repair(store, output) == []
    for batch in range(5, WINDOWS):
        sink.window(batch, INPUTS[batch], PARTITIONS)
    assert_complete(out)


@pytest.mark.parametrize("how", sorted(PORT_LOG_DAMAGE))
def test_damaged_delta_entry_is_superseded_by_the_next_compaction(
    tmp_path: Path, ctl: Control, how: str
) -> None:
    """The next compaction entry is built from the store's records of what it published, so it
    lists every file whatever became of the entries it replaces."""
    sink = committed_sink(tmp_path, 5)
    out = tmp_path / "out"
    entry = out / "unique" / "_spark_metadata" / "3"
    entry.write_text(PORT_LOG_DAMAGE[how](entry.read_text()))
    for batch in range(5, WINDOWS):  # log id 9 is the first compaction
        sink.window(batch, INPUTS[batch], PARTITIONS)
    assert_complete(out)


def test_a_damaged_sink_log_line_is_named_by_its_number_in_the_entry() -> None:
    """The header is line 1 and blank lines count, as in an editor."""
    good = status_line("file:///out/unique/part-0.parquet", 10, 1_700_000_000_000)
    assert [line for line, _ in parse_entry(f"v1\n{good}\n\n{good}", "entry")] == [good, good]
    with pytest.raises(StoreCorruptError, match=re.escape("line 4 is not a file status: '{bad'")):
        parse_entry(f"v1\n{good}\n\n{{bad", "entry")
    with pytest.raises(StoreCorruptError, match="does not start with 'v1'"):
        parse_entry(f"v2\n{good}", "entry")


def test_damaged_compaction_entry_is_refused_at_the_next_compaction_naming_it(
    tmp_path: Path, ctl: Control
) -> None:
    """A compaction entry is the only list of the files before it: copying it forward damaged
    would hide them from Spark's readers for good, so the next compaction refuses it."""
    sink = committed_sink(tmp_path, 12)
    out = tmp_path / "out"
    entry = out / "unique" / "_spark_metadata" / "9.compact"
    entry.write_text(PORT_LOG_DAMAGE["line dropped"](entry.read_text()))
    for batch in range(12, 19):
        table = INPUTS[batch] if batch < WINDOWS else ordered_batch(batch)
        sink.window(batch, table, PARTITIONS)
    with pytest.raises(StoreCorruptError, match=re.escape(str(entry))):
        sink.window(19, ordered_batch(19), PARTITIONS)  # log id 19 repeats 9.compact
    # Window 19 was committed; its publication stopped at the unique port's compaction. The
    # repair rewrites entry 9, then writes the entries that publication left unwritten.
    repaired = repair(BucketStore(str(out / "_store")), Output(fault_url(out)))
    assert [(r.port, r.log_id) for r in repaired] == [
        ("unique", 9),
        ("duplicate", 19),
        ("error", 19),
        ("expired", 19),
        ("unique", 19),
    ]
    sink.window(19, ordered_batch(19), PARTITIONS)  # the re-run of the batch changes nothing
    inputs = [*INPUTS, ordered_batch(18), ordered_batch(19)]
    assert_exactly_once(rows_by_port(out), inputs)
    assert logged_rows_by_port(out) == rows_by_port(out)
