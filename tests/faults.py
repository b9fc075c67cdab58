"""Fault injection that crosses process boundaries: real signals, real processes, real disks.

``tests/faultfs.py`` fails calls inside one process. The reliability tests also need faults in
Spark's Python workers and in the driver-side process that runs the sink's commit, which are
other processes started by the JVM. This module provides, for those:

* ``DedupFaultFileSystem``: the local disk as an fsspec filesystem registered under the
  protocol ``dedupfault``. Point the sink's ``path`` at ``dedupfault:///abs/dir`` and every
  mutating call it makes (``pipe_file``, ``open`` for writing, ``mv``, ``rm``, ``rm_file``,
  ``makedirs`` ...) is counted within the current *scope* (one task, or one commit) and checked
  against a fault plan. Importing this module registers the protocol, and unpickling the
  test-only writer below imports it, so Spark's workers find it too (``tests/`` must be on
  their ``PYTHONPATH``). Files it reports (``unstrip_protocol``) carry ``file://`` URLs, so the
  entries the sink writes into Spark's file-sink log can be read by ``spark.read.parquet``.
* A fault *plan* kept in a control directory named by ``$DEDUP_FAULT_CONTROL``: a list of
  ``FaultPoint``s, each firing at most once (a marker file ``fired/<name>`` records it, and
  survives the crash it causes). A point either raises ``OSError`` (ENOSPC by default) or
  SIGKILLs: in a task, its own process (a lost Python worker); in a commit, the process group
  written to ``<control>/group`` (the whole driver: Python, JVM and workers), then itself.
* ``FaultyDedupDataSource`` (``format("dedupfaulty")``): the real ``dedup`` data source with
  its writer's ``write`` and ``commit`` wrapped in fault scopes, plus the points "before the
  sink commit" and "after the sink commit, before Spark's checkpoint commit".
* ``FaultyDeltaPorts``/``FaultyIcebergPorts``: the Delta and Iceberg port formats with a point
  on either side of each port's table commit (which delta-rs and pyiceberg write past fsspec),
  put in place of the real ones in the processes of a driver run with ``table_hooks``.
* Helpers to launch ``tests/reliability_driver.py`` in its own session, wait for it on a
  deadline and reap whatever it left, and to check that every input row is in exactly one port.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from faultfs import InjectingFileSystem, Tear

PROTOCOL = "dedupfault"
CONTROL_ENV = "DEDUP_FAULT_CONTROL"
TESTS_DIR = Path(__file__).resolve().parent
DRIVER_SCRIPT = TESTS_DIR / "reliability_driver.py"
PORTS = ("unique", "duplicate", "expired", "error")


# -- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultPoint:
    """Where to strike, once.

    ``where``: ``task`` or ``commit`` (a counted filesystem call inside that scope),
    ``before-commit`` or ``after-commit`` (the sink commit's edges, no call needed),
    ``table-commit:<port>`` or ``table-committed:<port>`` (either side of a Delta or Iceberg
    port's table commit, in a driver run with ``table_hooks``; ``table_point``). A call
    matches by its number in the scope (``step``, from 1) or by the first call of operation
    ``op`` whose path contains ``path_part``; ``batch`` and ``partition`` narrow the scope.
    ``start`` is the scope of a driver's start-up (``streamWriter``: store opened, interrupted
    publication finished) in the direct engine of ``reliability_driver.py``.
    """

    name: str
    where: str
    batch: int | None = None
    step: int | None = None
    op: str | None = None
    path_part: str | None = None
    partition: int | None = None
    action: str = "kill"  # or "raise", or "pause" (until the test resumes it)
    error: int = errno.ENOSPC
    after: str | None = None  # armed only once the point of that name has fired
    torn: bool = False  # "raise" in pipe_file: half the bytes reach the disk first

    def matches_scope(self, scope: Scope) -> bool:
        return (self.batch is None or self.batch == scope.batch) and (
            self.partition is None or self.partition == scope.partition
        )

    def matches_call(self, step: int, op: str, path: str) -> bool:
        if self.step is not None and self.step != step:
            return False
        if self.op is not None and self.op != op:
            return False
        return self.path_part is None or self.path_part in path


@dataclass
class Scope:
    """One task or one commit in this process, with the number of mutating calls so far."""

    kind: str
    batch: int
    partition: int | None = None
    steps: int = 0


class Control:
    """The control directory shared by the test and every process of the run under test."""

    def __init__(self, directory: Path | str) -> None:
        self.dir = Path(directory)

    # written by the test
    def setup(self, points: Sequence[FaultPoint] = (), record: bool = False) -> Control:
        (self.dir / "fired").mkdir(parents=True, exist_ok=True)
        (self.dir / "pids").mkdir(exist_ok=True)
        self._write_json("plan.json", {"points": [asdict(p) for p in points], "record": record})
        return self

    def set_points(self, points: Sequence[FaultPoint], record: bool = False) -> None:
        self.setup(points, record)

    # read by the processes under test
    def plan(self) -> tuple[list[FaultPoint], bool]:
        try:
            raw = json.loads((self.dir / "plan.json").read_text())
        except FileNotFoundError:
            return [], False
        return [FaultPoint(**p) for p in raw["points"]], bool(raw["record"])

    def fired(self) -> dict[str, dict[str, Any]]:
        """Points that fired, by name, with the call they fired at."""
        folder = self.dir / "fired"
        if not folder.exists():
            return {}
        return {p.name: json.loads(p.read_text() or "{}") for p in sorted(folder.iterdir())}

    def steps(self) -> list[dict[str, Any]]:
        """Every counted call, in order, when the plan says ``record``."""
        path = self.dir / "steps.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def clear_steps(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "steps.jsonl").unlink()

    def set_group(self, pgid: int) -> None:
        self._write_json("group", pgid)

    def group(self) -> int | None:
        path = self.dir / "group"
        return int(json.loads(path.read_text())) if path.exists() else None

    def note_process(self) -> None:
        folder = self.dir / "pids"
        if folder.exists():
            (folder / str(os.getpid())).touch()

    def pids(self) -> list[int]:
        folder = self.dir / "pids"
        return sorted(int(p.name) for p in folder.iterdir()) if folder.exists() else []

    def armed(self, point: FaultPoint) -> bool:
        return point.after is None or (self.dir / "fired" / point.after).exists()

    def claim(self, point: FaultPoint, record: dict[str, Any]) -> bool:
        """Mark a point fired; False if it already had (another process, or an earlier run)."""
        if not self.armed(point):
            return False
        marker = self.dir / "fired" / point.name
        try:
            handle = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(handle, "w") as out:
            out.write(json.dumps(record))
            out.flush()
            os.fsync(out.fileno())
        return True

    def hold(self, name: str, deadline_s: float = 300) -> None:
        """Called by a paused process: say so, then wait for ``resume(name)``."""
        (self.dir / f"paused-{name}").touch()
        wait_for((self.dir / f"resume-{name}").exists, deadline_s, f"resume of {name}")

    def is_paused(self, name: str) -> bool:
        return (self.dir / f"paused-{name}").exists()

    def resume(self, name: str) -> None:
        (self.dir / f"resume-{name}").touch()

    def append_step(self, record: dict[str, Any]) -> None:
        with open(self.dir / "steps.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")

    def _write_json(self, name: str, value: Any) -> None:
        staged = self.dir / f".{name}.tmp"
        staged.write_text(json.dumps(value))
        os.replace(staged, self.dir / name)


def control() -> Control | None:
    """This process's control directory, if the environment names one."""
    folder = os.environ.get(CONTROL_ENV)
    return Control(folder) if folder else None


# -- scopes and striking ---------------------------------------------------------------------

_lock = threading.RLock()
_current: Scope | None = None


@contextlib.contextmanager
def fault_scope(kind: str, batch: int, partition: int | None = None) -> Iterator[Scope]:
    """Count this process's mutating calls as steps of one task or one commit."""
    global _current
    ctl = control()
    if ctl is not None:
        ctl.note_process()
    scope = Scope(kind, batch, partition)
    with _lock:
        previous, _current = _current, scope
    try:
        yield scope
    finally:
        with _lock:
            _current = previous


def at_point(where: str) -> None:
    """Strike a point of the current scope at a place no filesystem call marks
    (``before-commit``, ``after-commit``, ``table-commit:<port>`` ...), if planned."""
    scope, ctl = _current, control()
    if scope is None or ctl is None:
        return
    points, _ = ctl.plan()
    for point in points:
        if point.where == where and point.matches_scope(scope):
            _strike(ctl, point, scope, {"op": where, "path": "", "step": scope.steps})


def _count_call(op: str, path: str, changes: bool) -> None:
    scope, ctl = _current, control()
    if scope is None or ctl is None:
        return
    with _lock:
        scope.steps += 1
        step = scope.steps
    points, record = ctl.plan()
    call = {"op": op, "path": path, "step": step, "changes": changes}
    if record:
        ctl.append_step(
            {"kind": scope.kind, "batch": scope.batch, "partition": scope.partition, **call}
        )
    for point in points:
        if (
            point.where == scope.kind
            and point.matches_scope(scope)
            and point.matches_call(step, op, path)
        ):
            _strike(ctl, point, scope, call)


class TornWrite(Exception):
    """Raised to ``pipe_file``: write half of the bytes, then fail with the point's error."""

    def __init__(self, point: FaultPoint) -> None:
        super().__init__(point.name)
        self.point = point


def _strike(ctl: Control, point: FaultPoint, scope: Scope, call: dict[str, Any]) -> None:
    record = {**call, "kind": scope.kind, "batch": scope.batch, "partition": scope.partition}
    record["pid"] = os.getpid()
    if not ctl.claim(point, record):
        return
    if point.action == "raise":
        if point.torn:
            raise TornWrite(point)
        raise OSError(point.error, f"injected fault {point.name} in {call['op']}", call["path"])
    if point.action == "pause":  # hold this process here until the test says resume
        ctl.hold(point.name)
        return
    group = ctl.group() if scope.kind != "task" else None
    if group is not None:  # the whole driver; this process may sit in a daemon's own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


# -- the filesystem ----------------------------------------------------------------------------


class DedupFaultFileSystem(InjectingFileSystem):
    """The local disk; mutating calls are counted in the current scope and may be struck."""

    protocol = (PROTOCOL,)

    def before(self, operation: str, path: str, changes: bool) -> None:
        try:
            _count_call(operation, path, changes)
        except TornWrite as torn:
            point = torn.point
            error = OSError(point.error, f"injected fault {point.name} (torn write)", path)
            raise Tear(error) from None

    def unstrip_protocol(self, name: str) -> str:
        # The files are on the local disk: Spark's readers of the sink log need file:// URLs.
        return f"file://{self._strip_protocol(name)}"


fsspec.register_implementation(PROTOCOL, DedupFaultFileSystem, clobber=True)


def fault_url(path: Path | str) -> str:
    return f"{PROTOCOL}://{Path(path).resolve()}"


# -- the test-only Spark data source ------------------------------------------------------------
# Spark pickles these classes by reference: its workers import this module (tests/ on their
# PYTHONPATH), which registers the filesystem above in every process that runs the sink.

from pyspark import TaskContext  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from dedupsink.sink.commit import CommitReport  # noqa: E402
from dedupsink.sink.datasource import (  # noqa: E402
    DedupCommitMessage,
    DedupDataSource,
    DedupStreamWriter,
)
from dedupsink.sink.local import LocalSink  # noqa: E402
from dedupsink.sink.plan import SinkPlan  # noqa: E402
from dedupsink.sink.task import TaskSummary  # noqa: E402


class FaultyStreamWriter(DedupStreamWriter):
    """The dedup writer with each task and each commit run inside a fault scope."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DedupCommitMessage:
        context = TaskContext.get()
        assert context is not None
        batch = int(context.getLocalProperty("streaming.sql.batchId") or -1)
        with fault_scope("task", batch, context.partitionId()):
            return super().write(iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        assert TaskContext.get() is None, "the sink commit runs on the driver"
        with fault_scope("commit", batchId):
            at_point("before-commit")
            super().commit(messages, batchId)
            at_point("after-commit")


class FaultyDedupDataSource(DedupDataSource):
    """``format("dedupfaulty")``: the dedup sink under a fault plan (register it first)."""

    @classmethod
    def name(cls) -> str:
        return "dedupfaulty"

    def streamWriter(self, schema: StructType, overwrite: bool) -> FaultyStreamWriter:
        return FaultyStreamWriter(super().streamWriter(schema, overwrite).plan)


class InProcessSink(LocalSink):
    """The sink's code path without Spark's transport, in this process, under the fault plan.

    ``start`` is what Spark does when a query (re)starts (options checked, store opened; a new
    run of the query). ``window`` runs one micro-batch the way Spark would: a task per partition
    (rows dealt round-robin), each in a ``task`` fault scope, then the commit in a ``commit``
    scope."""

    def __init__(
        self, output: str, options: Mapping[str, str], schema: pa.Schema, query_id: str = "query"
    ) -> None:
        super().__init__({"path": output, **options}, schema, query_id)

    def start(self, run: str | None = None) -> SinkPlan:
        with fault_scope("start", -1):
            return super().start(run)

    def task(
        self, batch_id: int, partition: int, batches: Iterable[pa.RecordBatch], attempt: int = 0
    ) -> TaskSummary:
        with fault_scope("task", batch_id, partition):
            return super().task(batch_id, partition, batches, attempt)

    def commit(self, batch_id: int, summaries: Sequence[TaskSummary | None]) -> CommitReport | None:
        with fault_scope("commit", batch_id):
            at_point("before-commit")
            report = super().commit(batch_id, summaries)
            at_point("after-commit")
        return report


# -- points inside a table format's publication (Delta, Iceberg) -----------------------------------
# delta-rs and pyiceberg write their table commits themselves, past fsspec: the test filesystem
# cannot count those calls. A driver started with ``table_hooks`` in its config (the environment
# variable below, which Spark's Python workers inherit too) publishes through subclasses of the
# product's port formats whose ``_commit`` strikes ``table-commit:<port>`` right before a port's
# table commit and ``table-committed:<port>`` right after it. Test code only: dedupsink has no
# hooks.

TABLE_HOOKS_ENV = "DEDUP_FAULT_TABLE_HOOKS"


def table_point(port: str, committed: bool = False) -> str:
    """The ``where`` of a point before (``committed=False``) or after a port's table commit."""
    return f"table-{'committed' if committed else 'commit'}:{port}"


from dedupsink.ports import formats as _formats  # noqa: E402
from dedupsink.ports.compaction import TableFile, TableState  # noqa: E402
from dedupsink.ports.delta import DeltaPorts  # noqa: E402
from dedupsink.ports.delta_compaction import DeltaCompactor  # noqa: E402
from dedupsink.ports.iceberg import IcebergPorts  # noqa: E402
from dedupsink.ports.iceberg_compaction import IcebergCompactor  # noqa: E402


class FaultyDeltaPorts(DeltaPorts):
    """Delta ports with a fault point on each side of each port's Delta commit."""

    def _commit(self, deltalake: Any, port: str, *args: Any) -> None:
        at_point(table_point(port))
        super()._commit(deltalake, port, *args)
        at_point(table_point(port, committed=True))


class FaultyIcebergPorts(IcebergPorts):
    """Iceberg ports with a fault point on each side of each port's snapshot commit, and of the
    schema change alone of a port the window sends no rows (``mergeSchema``)."""

    def _commit(self, port: str, *args: Any) -> None:
        at_point(table_point(port))
        super()._commit(port, *args)
        at_point(table_point(port, committed=True))

    def _evolve(self, port: str, *args: Any) -> None:
        at_point(table_point(port))
        super()._evolve(port, *args)
        at_point(table_point(port, committed=True))


def compaction_point(port: str, step: str) -> str:
    """The ``where`` of a point in a port compaction: ``commit`` (its files written, before
    the commit), ``swap`` (Iceberg: the snapshot's manifests written, before the catalog takes
    it) or ``committed`` (right after the commit)."""
    return f"compact-{step}:{port}"


def _struck_commit(
    commit: Callable[..., int | None],
    port: str,
    base: TableState,
    removed: Sequence[TableFile],
    added: Sequence[TableFile],
    target_size: int,
) -> int | None:
    at_point(compaction_point(port, "commit"))
    committed = commit(port, base, removed, added, target_size)
    if committed is not None:
        at_point(compaction_point(port, "committed"))
    return committed


class FaultyDeltaCompactor(DeltaCompactor):
    """Delta port compaction with a point on each side of each port's OPTIMIZE commit."""

    def commit(self, port: str, *args: Any) -> int | None:
        return _struck_commit(super().commit, port, *args)


class FaultyIcebergCompactor(IcebergCompactor):
    """Iceberg port compaction with points before its snapshot, before the catalog's swap and
    after it."""

    def commit(self, port: str, *args: Any) -> int | None:
        return _struck_commit(super().commit, port, *args)

    def _swap(self, port: str, transaction: Any) -> None:
        at_point(compaction_point(port, "swap"))
        super()._swap(port, transaction)


def install_table_hooks() -> None:
    """Publish and compact ``delta`` and ``iceberg`` outputs of this process through the
    classes above."""
    _formats.FORMATS[FaultyDeltaPorts.name] = FaultyDeltaPorts
    _formats.FORMATS[FaultyIcebergPorts.name] = FaultyIcebergPorts
    _formats.COMPACTORS[FaultyDeltaPorts.name] = FaultyDeltaCompactor
    _formats.COMPACTORS[FaultyIcebergPorts.name] = FaultyIcebergCompactor


if os.environ.get(TABLE_HOOKS_ENV):
    install_table_hooks()


# -- running the driver script ------------------------------------------------------------------


@dataclass
class DriverRun:
    """One run of ``reliability_driver.py``: how it ended and what it reported."""

    returncode: int
    result: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def driver_env(ctl: Control) -> dict[str, str]:
    env = dict(os.environ)
    env[CONTROL_ENV] = str(ctl.dir)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(TESTS_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class DriverProcess:
    """The driver script running in a session of its own."""

    def __init__(self, config: Mapping[str, Any], ctl: Control, workdir: Path) -> None:
        run_id = len(list(workdir.glob("run-*.json")))
        config_path = workdir / f"run-{run_id}.json"
        self.result_path = workdir / f"result-{run_id}.json"
        self.stderr_path = workdir / f"stderr-{run_id}.txt"
        self.ctl = ctl
        config_path.write_text(json.dumps({**config, "result": str(self.result_path)}))
        with open(self.stderr_path, "w") as stderr:
            env = driver_env(ctl)
            if config.get("table_hooks"):
                env[TABLE_HOOKS_ENV] = "1"
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER_SCRIPT), str(config_path)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )

    def wait(self, timeout: float = 600) -> DriverRun:
        """Wait for the end on a deadline (then kill its group), and reap what it left."""
        try:
            returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
            reap(self.ctl)
            raise
        reap(self.ctl)
        path = self.result_path
        result = json.loads(path.read_text()) if path.exists() else {}
        return DriverRun(returncode, result, self.stderr_path.read_text()[-8000:])


def run_driver(
    config: Mapping[str, Any], ctl: Control, workdir: Path, timeout: float = 600
) -> DriverRun:
    """Run the driver script in its own session until it ends (or is killed)."""
    return DriverProcess(config, ctl, workdir).wait(timeout)


def reap(ctl: Control, deadline_s: float = 30) -> None:
    """Wait for every process of a finished run (they noted their pids) to be gone.

    Spark's Python daemons leave on their own once the JVM is gone; whichever is still alive at
    the deadline (it was started by the run under test: its environment names our control
    directory) is killed by pid."""
    deadline = time.monotonic() + deadline_s
    while True:
        alive = [pid for pid in ctl.pids() if _ours_and_alive(pid, ctl)]
        if not alive:
            return
        if time.monotonic() > deadline:
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + deadline_s
        time.sleep(0.1)


def _ours_and_alive(pid: int, ctl: Control) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    if "State:\tZ" in status:
        return False
    return f"{CONTROL_ENV}={ctl.dir}".encode() in environ.split(b"\0")


def wait_for(condition: Callable[[], bool], deadline_s: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {deadline_s:.0f}s waiting for {what}")
        time.sleep(0.05)


# -- data and checks -----------------------------------------------------------------------------

ORDERED_OPTIONS = {"keys": "id", "expiryKey": "n", "expiryPeriod": "10", "bucketSpan": "5"}
ROW_SCHEMA = pa.schema([("rid", pa.int64()), ("id", pa.int64()), ("n", pa.int64())])
ROW_SCHEMA_DDL = "rid BIGINT, id BIGINT, n BIGINT"


def ordered_batch(b: int) -> pa.Table:
    """Window ``b`` of the crash streams (ordered mode, period 10): from window 1 on it has rows
    for every port: a new key, a re-sent copy of the previous window's key, two copies of one
    key, a row older than the expiry point and two error rows. ``rid`` is unique per row."""
    rows = [
        (1000 + b, 10 * b + 5),
        (1000 + b - 1, 10 * (b - 1) + 5),
        (2000 + b, 10 * b + 9),
        (2000 + b, 10 * b + 9),
        (3000 + b, 10 * (b - 2)),
        (None, 10 * b),
        (4000 + b, None),
    ]
    if b == 0:
        rows = [rows[0], rows[2], rows[3], rows[5], rows[6]]
    rids = [100 * b + i for i in range(len(rows))]
    return pa.table(
        {
            "rid": pa.array(rids, pa.int64()),
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "n": pa.array([r[1] for r in rows], pa.int64()),
        },
        schema=ROW_SCHEMA,
    )


def write_inputs(folder: Path, tables: Sequence[pa.Table]) -> None:
    """One Parquet file per window, with increasing modification times (the source's order)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = int(time.time()) - 3600
    for index, table in enumerate(tables):
        target = folder / f"batch-{index:05d}.parquet"
        pq.write_table(table, target)
        os.utime(target, (base + index, base + index))


def port_table(output: Path, port: str) -> pa.Table:
    folder = output / port
    if not folder.exists():
        return pa.table({})
    return ds.dataset(str(folder), format="parquet").to_table()


def rows_by_port(output: Path) -> dict[str, list[int]]:
    """Row ids of each port as pyarrow reads the directory."""
    out = {}
    for port in PORTS:
        table = port_table(output, port)
        out[port] = sorted(table.column("rid").to_pylist()) if "rid" in table.column_names else []
    return out


def spark_listed_names(port_dir: Path) -> set[str]:
    """The files Spark's readers list a port through: the latest compaction entry, then the
    entries after it (each entry's lines after its ``v1`` header)."""
    log_dir = port_dir / "_spark_metadata"
    if not log_dir.exists():
        return set()
    entries = {int(p.name.split(".")[0]): p for p in log_dir.iterdir() if p.name[0].isdigit()}
    compactions = [i for i, p in entries.items() if p.name.endswith(".compact")]
    first = max(compactions) if compactions else 0
    names: set[str] = set()
    for log_id in sorted(i for i in entries if i >= first):
        lines = entries[log_id].read_text().splitlines()
        names.update(json.loads(x)["path"].rsplit("/", 1)[-1] for x in lines[1:] if x)
    return names


def logged_rows_by_port(output: Path) -> dict[str, list[int]]:
    """Row ids of each port as Spark's file-sink log lists them (what spark.read.parquet sees)."""
    out: dict[str, list[int]] = {}
    for port in PORTS:
        rids: list[int] = []
        for name in sorted(spark_listed_names(output / port)):
            rids.extend(pq.read_table(output / port / name).column("rid").to_pylist())
        out[port] = sorted(rids)
    return out


def assert_exactly_once(by_port: Mapping[str, Sequence[int]], inputs: Sequence[pa.Table]) -> None:
    """Every input row id in exactly one port, exactly once, and nothing else."""
    expected = Counter(rid for table in inputs for rid in table.column("rid").to_pylist())
    seen = Counter(rid for rids in by_port.values() for rid in rids)
    lost = sorted(set(expected) - set(seen))
    doubled = sorted(rid for rid, count in seen.items() if count > 1)
    strangers = sorted(set(seen) - set(expected))
    assert not (lost or doubled or strangers), (
        f"lost {lost}, more than once {doubled}, never input {strangers}"
    )


def window_of_file(name: str) -> int:
    """The window number in a published port file name ``part-<window>-...``."""
    return int(name.split("-")[1])


def commit_order(output: Path, inputs: Sequence[pa.Table]) -> list[int]:
    """Input batch indexes in the order their windows were committed (from the port files)."""
    window_of_rid: dict[int, int] = {}
    for port in PORTS:
        folder = output / port
        if not folder.exists():
            continue
        for path in folder.glob("part-*.parquet"):
            for rid in pq.read_table(path, columns=["rid"]).column("rid").to_pylist():
                window_of_rid[rid] = window_of_file(path.name)
    order: list[tuple[int, int]] = []
    for index, table in enumerate(inputs):
        windows = {window_of_rid.get(rid) for rid in table.column("rid").to_pylist()}
        assert len(windows) == 1 and None not in windows, f"batch {index} split: {windows}"
        order.append((windows.pop(), index))  # type: ignore[arg-type]
    return [index for _, index in sorted(order)]


def stray_files(output: Path) -> list[str]:
    """Files a reader could trip over: anything in a port outside its published Parquet files
    and its log, or staged files left after the last commit."""
    strays = []
    for port in PORTS:
        folder = output / port
        if not folder.exists():
            continue
        for path in folder.iterdir():
            if path.is_dir() and path.name == "_spark_metadata":
                continue
            if not (path.is_file() and path.name.startswith("part-")):
                strays.append(str(path.relative_to(output)))
    staging = output / "_staging"
    if staging.exists():
        strays.extend(str(p.relative_to(output)) for p in staging.rglob("*") if p.is_file())
    return strays
