"""Where the dedup sink's time goes over the bare Python sink, part by part.

The bare Python sink (``python-floor`` of ``bench/compare.py``) writes each task's Arrow batches
once as Parquet; anything the dedup sink does beyond that is its own cost. This script runs the
sink's code path in this process without Spark (``LocalSink``: Spark's transport of rows is the
same for both sinks and is left out) over the compare input, sampling its CPU time, and
attributes every sample to the innermost of these parts on its stack:

* task: ``fingerprinting`` (the keys' hashes), ``classification`` (the rest of
  ``WindowClassifier.classify``: buckets, lookups, expiry; and the batches' coalescing),
  ``port splitting`` (``split``: a port's rows taken out of a chunk), ``port encoding`` (the
  port files' Parquet writes), ``port statistics`` (Delta's, from each file's footer),
  ``settlement`` (keys shared between partitions),
  ``window file`` (the store's window file: folds chosen, keys encoded, written),
  ``shared copies`` (the decoded buckets' publication for the other processes),
  ``task set-up`` (the store read, the cache manager, the writers) and ``task, other``;
* commit: ``commit: settle``, ``commit: transaction`` (the new version's manifest and its
  requests), ``commit: publication`` (the ports' files moved, the table formats' logs),
  ``commit: Delta checkpoints`` (every tenth commit of a Delta table),
  ``commit: staging and history`` (the staging folder discarded, the history row, garbage),
  ``commit: other`` (the base version read, the claim, the report).

Each part is printed in microseconds a row and milliseconds a window, for 100,000-row windows
(two tasks of 50,000 rows in Arrow batches of 10,000, as ``bench/compare.py`` streams them) and
for 1,000-row windows (two tasks of 500 rows, the per-window floor), with Parquet and Delta
ports; the bare sink's Parquet write of the same batches is the first line. The first window of
each run is left out (its imports and the store's creation are the first batch's, below).

The first batch's extra costs are CPU times in fresh Python processes (medians of
``--import-repeats``): the import of what each of Spark's Python programs imports for the sink
(the data source lookup imports ``pyspark_dedup``; the planner builds the writer; a worker runs
a task; the commit runner commits), each over what the same program imports for the bare sink;
the time to plan a query on a path without a store (the store's creation included) and the
first window's task and commit against the second's.

Usage: ``python bench/profile_breakdown.py [--rows 2000000] [--files 40] [--small-windows 50]
[--formats parquet,delta] [--parts steady,small,first] [--lines N]``; ``--lines N`` also prints
the N busiest lines of the sink (each sample's innermost frame in ``dedupsink``, with its part).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA_DIR, CompareSpec, generate_compare_input

SINK_OPTIONS = {"keys": "id", "expiryKey": "event_time", "expiryPeriod": "1 hour"}
ARROW_BATCH_ROWS = 10_000  # what Spark hands a Python data source's writer
TASKS = 2  # local[2], two files a window

# (file suffix, function name) -> part; the innermost match on a sample's stack wins.
PARTS: dict[tuple[str, str], str] = {
    ("engine/fingerprint.py", "fingerprint"): "fingerprinting",
    ("engine/classify.py", "classify"): "classification",
    ("sink/task.py", "coalesce"): "classification",
    ("engine/classify.py", "split"): "port splitting",
    ("ports/output.py", "write"): "port encoding",
    ("ports/output.py", "roll"): "port encoding",
    ("ports/output.py", "close"): "port encoding",
    ("ports/output.py", "replace"): "port encoding",
    ("sink/settle.py", "settle_task"): "settlement",
    ("store/compaction.py", "choose_folds"): "window file",
    ("store/compaction.py", "write_window_file"): "window file",
    ("store/shared.py", "publish"): "shared copies",
    ("store/cache.py", "manager_for"): "task set-up",
    ("store/store.py", "read"): "task set-up",
    ("store/store.py", "open"): "task set-up",
    ("ports/output.py", "__init__"): "task set-up",
    ("sink/task.py", "run_task"): "task, other",
    ("sink/commit.py", "commit_window"): "commit: other",
    ("sink/settle.py", "settle_window"): "commit: settle",
    ("sink/window_updates.py", "files_written_by_commit"): "commit: transaction",
    ("sink/window_updates.py", "transaction"): "commit: transaction",
    ("store/transaction.py", "commit"): "commit: transaction",
    ("sink/commit.py", "publish"): "commit: publication",
    ("ports/delta.py", "_checkpoint"): "commit: Delta checkpoints",
    ("ports/stats.py", "delta_stats"): "port statistics",
    ("sink/commit.py", "finish_publication"): "commit: publication",
    ("ports/base.py", "create_deferred_tables"): "commit: publication",
    ("sink/commit.py", "_after_publication"): "commit: staging and history",
    ("sink/commit.py", "compact_after"): "commit: staging and history",
    ("bench/profile_breakdown.py", "bare_task"): "bare sink's Parquet write",
}
OUTSIDE = "outside the sink"  # the harness: slicing the input, LocalSink's calls
ORDER = [
    "bare sink's Parquet write",
    "fingerprinting",
    "classification",
    "port splitting",
    "port encoding",
    "port statistics",
    "settlement",
    "window file",
    "shared copies",
    "task set-up",
    "task, other",
    "commit: settle",
    "commit: transaction",
    "commit: publication",
    "commit: Delta checkpoints",
    "commit: staging and history",
    "commit: other",
    OUTSIDE,
]


def part_of(file_path: str, function: str) -> str | None:
    path = file_path.replace("\\", "/")
    for (suffix, name), part in PARTS.items():
        if function == name and path.endswith(suffix):
            return part
    return None


class CpuSampler:
    """Attributes the process's CPU time to the innermost part on the main thread's stack.

    A profiling timer (``ITIMER_PROF``, which counts the CPU time of every thread of the
    process) interrupts every millisecond of CPU; Python runs the handler at the next bytecode,
    on the frame that was running (after a long call into Arrow returns, on its caller), and the
    handler adds the CPU time since the last one to that stack's part. A shared machine's
    waits count nowhere."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.seconds: dict[str, float] = {}
        # The sink's innermost line under each sample: where within a part the time goes.
        self.lines: dict[str, float] = {}
        self._last = 0.0
        self._parts: dict[tuple[str, str], str | None] = {}

    def __enter__(self) -> CpuSampler:
        self._last = time.process_time()
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        self._sample(signal.SIGPROF, sys._getframe(0))

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        now = time.process_time()
        spent, self._last = now - self._last, now
        part, line = OUTSIDE, None
        while frame is not None:
            code = frame.f_code
            if line is None and "/dedupsink/" in code.co_filename:
                name = code.co_filename.rsplit("/dedupsink/", 1)[1]
                line = f"{name}:{frame.f_lineno} {code.co_name}"
            key = (code.co_filename, code.co_name)
            if key not in self._parts:
                self._parts[key] = part_of(*key)
            found = self._parts[key]
            if found is not None:
                part = found
                break
            frame = frame.f_back
        self.seconds[part] = self.seconds.get(part, 0.0) + spent
        if line is not None:
            line = f"{part}: {line}"
            self.lines[line] = self.lines.get(line, 0.0) + spent


# -- the windows -----------------------------------------------------------------------------


@dataclass
class Breakdown:
    label: str
    rows: int = 0
    windows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    lines: dict[str, float] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0

    def extra(self) -> float:
        return sum(s for part, s in self.seconds.items() if part not in (ORDER[0], OUTSIDE))


def bare_task(folder: Path, name: str, batches: Iterator[pa.RecordBatch]) -> None:
    """The bare sink's task: its batches written once to one Parquet file, dedupsink's settings."""
    from dedupsink.ports.encoding import open_parquet_writer

    writer = None
    with open(folder / name, "wb") as handle:
        for batch in batches:
            if writer is None:
                writer = open_parquet_writer(handle, batch)
            writer.write_batch(batch)
        if writer is not None:
            writer.close()


def run_windows(
    label: str, windows: list[list[pa.Table]], output_format: str, batch_rows: int
) -> Breakdown:
    """Every window through the bare sink's write and the dedup sink (tasks then commit); the
    first window is run before the profiler starts."""
    from dedupsink.sink.local import LocalSink

    work = Path(tempfile.mkdtemp(prefix="breakdown-", dir=DATA_DIR))
    bare = work / "bare"
    bare.mkdir()
    options = {"path": str(work / "out"), "outputFormat": output_format, **SINK_OPTIONS}
    sink = LocalSink(options, windows[0][0].schema, query_id="breakdown")
    result = Breakdown(label)

    def window(batch_id: int, tables: list[pa.Table]) -> None:
        for partition, table in enumerate(tables):
            name = f"part-{batch_id}-{partition}.parquet"
            bare_task(bare, name, iter(table.to_batches(max_chunksize=batch_rows)))
        summaries = [
            sink.task(batch_id, partition, table.to_batches(max_chunksize=batch_rows))
            for partition, table in enumerate(tables)
        ]
        sink.commit(batch_id, summaries)

    try:
        window(0, windows[0])
        cpu, wall = time.process_time(), time.perf_counter()
        with CpuSampler() as sampler:
            for batch_id, tables in enumerate(windows[1:], start=1):
                window(batch_id, tables)
                result.rows += sum(t.num_rows for t in tables)
                result.windows += 1
        result.cpu_seconds = time.process_time() - cpu
        result.wall_seconds = time.perf_counter() - wall
        result.seconds, result.lines = sampler.seconds, sampler.lines
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def print_breakdown(result: Breakdown, lines: int) -> None:
    bare = result.seconds.get(ORDER[0], 0.0)
    print(
        f"\n{result.label}: {result.windows} windows, {result.rows:,} rows after the first "
        f"window; profiled {result.wall_seconds:.2f} s wall, {result.cpu_seconds:.2f} s CPU"
    )
    print(f"  {'part':<30}{'us/row':>9}{'ms/window':>11}{'share':>8}")
    extra = result.extra()
    for part in ORDER + sorted(set(result.seconds) - set(ORDER)):
        seconds = result.seconds.get(part, 0.0)
        if part != ORDER[0] and seconds == 0.0:
            continue
        share = "" if part in (ORDER[0], OUTSIDE) or not extra else f"{seconds / extra:.0%}"
        print(
            f"  {part:<30}{seconds / result.rows * 1e6:>9.3f}"
            f"{seconds / result.windows * 1e3:>11.2f}{share:>8}"
        )
    for name, seconds in (("dedup sink, all parts", extra), ("over the bare sink", extra - bare)):
        print(
            f"  {name:<30}{seconds / result.rows * 1e6:>9.3f}"
            f"{seconds / result.windows * 1e3:>11.2f}"
        )
    if lines:
        print(f"  the sink's {lines} busiest lines (the innermost of its frames, us/row):")
        for line, seconds in sorted(result.lines.items(), key=lambda item: -item[1])[:lines]:
            print(f"    {seconds / result.rows * 1e6:>8.3f}  {line}")


def steady_windows(input_dir: Path) -> list[list[pa.Table]]:
    files = sorted(input_dir.glob("*.parquet"))
    tables = [pq.read_table(f) for f in files]
    return [tables[i : i + TASKS] for i in range(0, len(tables) - TASKS + 1, TASKS)]


def small_windows(input_dir: Path, count: int, rows: int) -> list[list[pa.Table]]:
    """``count`` windows of ``rows`` rows, consecutive rows of the input, split over the tasks."""
    table = pq.read_table(sorted(input_dir.glob("*.parquet"))[0])
    per_task = rows // TASKS
    return [
        [table.slice(w * rows + p * per_task, per_task).combine_chunks() for p in range(TASKS)]
        for w in range(count)
    ]


# -- the first batch ---------------------------------------------------------------------------

# What each of Spark's Python programs imports for a Python data source (its own module), and
# what it imports more for the dedup sink. The bare sink's classes are pickled by value: its
# programs import only what its write does (pyarrow.parquet and the port files' encoding).
WORKER = "pyspark.sql.worker."
PROGRAMS: dict[str, tuple[str, str]] = {
    "data source lookup": (f"import {WORKER}lookup_data_sources", "import pyspark_dedup"),
    "planner (streamWriter)": (
        f"import {WORKER}write_into_data_source",
        "import pyspark_dedup, pyspark.sql.pandas.types, dedupsink.sink.plan",
    ),
    "worker (a task)": (
        "import pyspark.worker, pyarrow.parquet, dedupsink.ports.encoding",
        "import pyspark_dedup, dedupsink.sink.plan, dedupsink.sink.task",
    ),
    "commit runner": (
        f"import {WORKER}python_streaming_sink_runner",
        "import pyspark_dedup, pyspark.sql.pandas.types, dedupsink.sink.plan, "
        "dedupsink.sink.commit",
    ),
}


def import_seconds(statement: str) -> float:
    """CPU seconds of ``statement`` in a fresh interpreter (bytecode already compiled)."""
    code = f"import time; t = time.process_time(); {statement}; print(time.process_time() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def heaviest_imports(statement: str, over: str, count: int = 12) -> list[tuple[float, str]]:
    """The modules ``statement`` imports that ``over`` does not, by their own import time
    (``-X importtime``'s self column), heaviest first."""

    def self_times(code: str) -> dict[str, float]:
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            check=True,
        )
        times: dict[str, float] = {}
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            own, _, name = line.removeprefix("import time:").split("|", 2)
            times[name.strip()] = times.get(name.strip(), 0.0) + float(own) / 1e6
        return times

    base = self_times(over)
    extra = {name: s for name, s in self_times(statement).items() if name not in base}
    return sorted(((s, name) for name, s in extra.items()), reverse=True)[:count]


def by_top_package(modules: list[tuple[float, str]]) -> str:
    return ", ".join(f"{name} {seconds * 1e3:.0f} ms" for seconds, name in modules)


STORE_CREATION = """
import time, tempfile, json
time.perf_counter = time.process_time  # CPU seconds: the machine may be shared
import pyarrow as pa
t0 = time.perf_counter()
from dedupsink.sink.plan import plan_for
t1 = time.perf_counter()
schema = pa.schema([("id", pa.string()), ("event_time", pa.timestamp("us", "UTC"))])
path = tempfile.mkdtemp()
options = {"path": path + "/out", "keys": "id", "expiryKey": "event_time",
           "expiryPeriod": "1 hour", "outputFormat": FORMAT}
plan = plan_for(options, schema, "run1", "once")
t2 = time.perf_counter()
from dedupsink.sink.local import LocalSink
sink = LocalSink(options, schema, "q")
sink._plan = plan
table = pa.table({"id": ["a", "b"], "event_time": pa.array([0, 1], pa.timestamp("us", "UTC"))})
t3 = time.perf_counter()
s = sink.task(0, 0, table.to_batches())
t4 = time.perf_counter()
sink.commit(0, [s])
t5 = time.perf_counter()
s = sink.task(1, 0, table.to_batches())
t6 = time.perf_counter()
sink.commit(1, [s])
t7 = time.perf_counter()
print(json.dumps({"plan imports": t1 - t0, "plan and store creation": t2 - t1,
    "first task": t4 - t3, "first commit": t5 - t4, "second task": t6 - t5,
    "second commit": t7 - t6}))
"""


def first_batch(repeats: int, formats: list[str]) -> None:
    print(f"\nThe first batch's extra costs (fresh processes, medians of {repeats} runs):")
    print("  imports, CPU ms:")
    print(f"  {'program':<26}{'bare sink':>10}{'dedup sink':>12}{'extra':>8}")
    for program, (bare, more) in PROGRAMS.items():
        dedup = f"{bare}; {more}"
        bare_s = statistics.median(import_seconds(bare) for _ in range(repeats))
        dedup_s = statistics.median(import_seconds(dedup) for _ in range(repeats))
        print(
            f"  {program:<26}{bare_s * 1e3:>10.0f}{dedup_s * 1e3:>12.0f}"
            f"{(dedup_s - bare_s) * 1e3:>8.0f}"
        )
        print(
            f"    heaviest over the bare sink: {by_top_package(heaviest_imports(dedup, bare, 6))}"
        )
    for output_format in formats:
        code = STORE_CREATION.replace("FORMAT", repr(output_format))
        runs = []
        for _ in range(repeats):
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"  a new store, {output_format} ports (2 rows a window), CPU ms:")
        for name in runs[0]:
            value = statistics.median(r[name] for r in runs)
            print(f"    {name:<28}{value * 1e3:>8.1f} ms")


# -- the command -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--small-windows", type=int, default=50)
    parser.add_argument("--small-rows", type=int, default=1_000)
    parser.add_argument("--formats", default="parquet,delta")
    parser.add_argument("--parts", default="steady,small,first")
    parser.add_argument("--import-repeats", type=int, default=5)
    parser.add_argument("--lines", type=int, default=0, help="print the N busiest lines")
    args = parser.parse_args(argv)
    formats = args.formats.split(",")
    parts = args.parts.split(",")
    input_dir, _ = generate_compare_input(CompareSpec(rows=args.rows, files=args.files), TASKS)
    per_file = args.rows // args.files
    for output_format in formats:
        if "steady" in parts:
            label = f"{TASKS * per_file:,}-row windows, {output_format} ports"
            windows = steady_windows(input_dir)
            print_breakdown(
                run_windows(label, windows, output_format, ARROW_BATCH_ROWS), args.lines
            )
        if "small" in parts:
            label = f"{args.small_rows:,}-row windows, {output_format} ports"
            windows = small_windows(input_dir, args.small_windows + 1, args.small_rows)
            print_breakdown(
                run_windows(label, windows, output_format, ARROW_BATCH_ROWS), args.lines
            )
    if "first" in parts:
        first_batch(args.import_repeats, formats)


if __name__ == "__main__":
    main()
