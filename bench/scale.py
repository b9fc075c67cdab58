"""Scale benchmark: does a window cost the same at the end of a day as at its start?

A day of one-minute windows (1,440 windows) goes through the dedup sink with
``expiryKey=event_time``, ``expiryPeriod=24 hours`` and ``bucketSpan=1 hour``: every window
holds ``--rows-per-batch`` rows (2,000 by default) whose event times fall in that window's
minute, 10% of them exact re-sends of a row from the same or the two previous windows. The
store therefore grows to a whole day of remembered keys (nothing expires before window 1,440:
that is the expiry period). The same day is then run again with 10x the rows per batch.

How a window is driven. A Spark micro-batch of this size is measured first (``--spark-probe``
windows through ``format("dedup")`` on ``local[2]``, median ``triggerExecution`` of the batches
after the first two); on this machine it is dominated by Spark's fixed per-batch cost, so 1,440
of them would take far longer than the sink itself. The day is therefore driven without Spark:
each window calls ``dedupsink.sink.task.run_task`` (the executor side: classification, Parquet
staging of the four ports, the window file) and ``dedupsink.sink.commit.commit_window`` (the
driver side: the next manifest, publication into the ports, Spark's sink log, garbage
collection) on the local filesystem, exactly as ``bench/engine_bench.py`` does. That is the code
path of a batch minus Spark's transport (Arrow batches of 10,000 rows, one task a window).

Measured, in a fresh process per size:

* sink time per window: wall time of ``run_task`` + ``commit_window`` (outside the clock:
  data generation, and dropping the published port files from the page cache, see
  ``evict_port_files`` and ``--keep-port-cache``), reported at windows 10, 100, 720 and
  1,440 as the median over the windows within ``--neighbourhood`` of that window (the last
  ones for the final window);
* the store at those windows: window files and bytes under ``_store/data``, the manifest's
  size and the remembered keys;
* memory of the process doing the work: ``VmRSS`` at those windows and the peak ``VmHWM``;
* window 10 again, and the day's end again, in turn: after the day, the day's first windows
  run again in ``--start-repeats`` fresh processes (4 by default), and after each of them the
  day's process runs ``2 * --neighbourhood + 1`` more windows with event times in the day's
  last minute (nothing expires; the store grows by 3% over the four). The ratio divides the
  median of the five measurements of the end by the median of the five of window 10: the
  host's speed drifts by a third within minutes, and with the end measured once, the
  2,000-row day on /dev/shm gave 1.10 to 1.80 over eighteen runs of much the same code;
* the spread: mean, median, p95 and max over all windows, the median by minute of the hour
  (the time bucket being filled grows through each hour) and by hour of the day (the store
  grows through the day), which separate the two causes of any growth;
* both sizes once more with their output and store on a memory filesystem
  (``--memory-root``, ``/dev/shm`` by default): the sink's own cost without the disk's. On
  this machine's virtual disk, creating and renaming small files gets slower as a run writes
  thousands of them, whatever writes them, and a window makes about ten creates and seven
  renames: two runs of the same sink code measured 1.086 and 0.870 at 2,000 rows on the
  disk, and 1.132 and 1.336 at 20,000.

``--own-time`` runs the day with ``assumeSameExpiry=false`` instead of ``bucketSpan=1 hour``: each
re-send carries a time of its own window's minute (sent later than its original, as a
producer's retry stamped at send time), keys go to ``numBuckets`` hash buckets (64), and every
window touches every bucket, so ``maxCacheMemory`` is set to hold the whole day's keys (32 bytes
a key: 24 for the key and its value, up to 3 for the manager's filter, and room to spare).

The last lines are machine-readable: ``overhead_growth=<x>``, the time per row at window 1,440
over the time per row at window 10 (each the median of five measurements taken in turn; the
larger of the two sizes' figures, each printed too), ``memory_overhead_growth=<x>``, the same on
the memory filesystem, and ``rss_growth=<x>``, the peak RSS of the 10x run over that of the 1x
run.

``--profile N`` runs one day of ``--rows-per-batch`` rows in this process and prints a
pyinstrument profile of its last N windows (where the growth, if any, shows).

Usage: ``python bench/scale.py [--windows N] [--rows-per-batch N] [--factor N]
[--spark-probe N] [--own-time]``; ``--windows 120 --rows-per-batch 500 --spark-probe 0`` is a
quick check (checkpoints beyond ``--windows`` are dropped, the last window is always one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    DATA_DIR,
    EPOCH_2024_US,
    LoadSampler,
    code_revision,
    event_columns,
    local_session_builder,
    median,
    print_machine,
    vm_hwm,
    vm_rss,
)

if TYPE_CHECKING:
    from dedupsink.ports.output import Output
    from dedupsink.sink.task import TaskSummary
    from dedupsink.store.store import BucketStore

MINUTE_US = 60_000_000
CHECKPOINTS = (10, 100, 720, 1440)
RESULT_PREFIX = "RESULT "
SINK_OPTIONS = {
    "keys": "id",
    "expiryKey": "event_time",
    "expiryPeriod": "24 hours",
    "bucketSpan": "1 hour",
}
# With --own-time the cache must hold every key of the day (hash buckets): this many bytes a
# key covers the key, its value, the manager's filter and the fold of a bucket's recent keys.
OWN_TIME_CACHE_BYTES_PER_KEY = 32


def sink_options(
    own_time: bool, rows_per_batch: int, windows: int, resend: float
) -> dict[str, str]:
    """The sink's options for the day: time buckets, or assumeSameExpiry=false (hash buckets)
    with a cache large enough for the whole day's keys."""
    if not own_time:
        return dict(SINK_OPTIONS)
    options = {k: v for k, v in SINK_OPTIONS.items() if k != "bucketSpan"}
    keys = windows * (rows_per_batch - round(rows_per_batch * resend))
    cache = max(64 << 20, keys * OWN_TIME_CACHE_BYTES_PER_KEY)
    return {**options, "assumeSameExpiry": "false", "maxCacheMemory": str(cache)}


class Day:
    """Generates the windows: one minute of event time each, re-sends from recent windows
    (with ``own_time``, stamped with a time of the window that re-sends them)."""

    def __init__(
        self, rows_per_batch: int, resend_fraction: float, seed: int, own_time: bool = False
    ) -> None:
        self.rows = rows_per_batch
        self.resends = round(rows_per_batch * resend_fraction)
        self.rng = np.random.default_rng(seed)
        self.recent: list[pa.Table] = []
        self.own_time = own_time

    def window(self, index: int, minute: int | None = None) -> pa.Table:
        """Window ``index``'s rows, its event times in minute ``minute`` (``index`` if None)."""
        minute = index if minute is None else minute
        fresh = self.rows - self.resends
        offsets = np.sort(self.rng.integers(0, MINUTE_US, fresh))
        originals = event_columns(self.rng, EPOCH_2024_US + minute * MINUTE_US + offsets)
        self.recent = [*self.recent[-2:], originals]
        pool = pa.concat_tables(self.recent)
        copies = pool.take(pa.array(self.rng.integers(0, pool.num_rows, self.resends)))
        if self.own_time:
            sent = (
                EPOCH_2024_US + minute * MINUTE_US + self.rng.integers(0, MINUTE_US, self.resends)
            )
            column = pa.array(sent, type=copies.schema.field("event_time").type)
            copies = copies.set_column(
                copies.schema.get_field_index("event_time"), "event_time", column
            )
        table = pa.concat_tables([originals, copies])
        return table.take(pa.array(self.rng.permutation(table.num_rows)))


# -- one size, in its own process -----------------------------------------------------------


def run_day(
    windows: int,
    rows_per_batch: int,
    resend_fraction: float,
    seed: int,
    checkpoints: list[int],
    work: Path,
    profile_last: int = 0,
    keep_port_cache: bool = False,
    own_time: bool = False,
    stop_after: int | None = None,
    end_repeats: int = 0,
    end_windows: int = 11,
) -> dict[str, Any]:
    """Run the day's windows (only the first ``stop_after`` of them, if given, with the
    whole day's options) and return every window's timings and the checkpoints' snapshots.

    With ``end_repeats``, the day's end is measured again that many times, each when a line
    arrives on stdin (``READY`` is printed before each wait): ``end_windows`` more windows of
    the day's last minute, so that the orchestrator can interleave them with window 10's
    repeats in fresh processes."""
    from dedupsink.sink.local import LocalSink
    from dedupsink.sink.worker import tune_worker_process

    # An executor's first task sets the process's memory policy before it reads any rows; this
    # process builds its windows' rows itself, so it sets the policy before building the first.
    tune_worker_process()
    day = Day(rows_per_batch, resend_fraction, seed, own_time)
    first = day.window(0)
    chosen = sink_options(own_time, rows_per_batch, windows, resend_fraction)
    sink = LocalSink({"path": str(work / "out"), **chosen}, first.schema, query_id="scale")
    plan = sink.start()
    baseline_rss = vm_rss()
    published: set[str] = set()

    def timed_window(index: int, table: pa.Table) -> tuple[float, TaskSummary]:
        batches = table.to_batches(max_chunksize=10_000)
        started = time.perf_counter()
        summary = sink.task(index, 0, batches)
        sink.commit(index, [summary])
        elapsed = time.perf_counter() - started
        if not keep_port_cache:
            evict_port_files(plan.output, published)
        return elapsed, summary

    ran = windows if stop_after is None else min(stop_after, windows)
    seconds = np.zeros(ran)
    classify = np.zeros(ran)
    task = np.zeros(ran)
    snapshots: dict[int, dict[str, Any]] = {}
    table = first
    profiler = None
    for index in range(ran):
        if index:
            table = day.window(index)
        if profile_last and index == windows - profile_last:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.001)
            profiler.start()
        seconds[index], summary = timed_window(index, table)
        classify[index], task[index] = summary.classify_seconds, summary.seconds
        number = index + 1
        if number in checkpoints:
            snapshots[number] = snapshot(plan.store)
    if profiler is not None:
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False))
    ends: list[list[float]] = []
    for _ in range(end_repeats):
        print("READY", flush=True)
        sys.stdin.readline()
        start = ran + len(ends) * end_windows
        ends.append(
            [
                timed_window(index, day.window(index, minute=ran - 1))[0]
                for index in range(start, start + end_windows)
            ]
        )
    manifest = plan.store.read()
    assert manifest is not None
    all_windows = ran + sum(len(end) for end in ends)
    return {
        "rows_per_batch": rows_per_batch,
        "windows": ran,
        "seconds": seconds.tolist(),
        "classify": classify.tolist(),
        "task": task.tolist(),
        "ends": ends,
        "snapshots": snapshots,
        "baseline_rss": baseline_rss,
        "peak_rss": vm_hwm(),
        "totals": manifest.totals.to_wire(),
        "expected": {
            "unique": all_windows * (rows_per_batch - day.resends),
            "duplicate": all_windows * day.resends,
            "expired": 0,
            "error": 0,
        },
    }


def snapshot(store: BucketStore) -> dict[str, Any]:
    """The store's size and the process's memory at a checkpoint."""
    manifest = store.read()
    assert manifest is not None
    files, data_bytes = store.disk_usage()
    return {
        "store_files": files,
        "store_bytes": data_bytes,
        "manifest_bytes": len(manifest.to_bytes()),
        "live_files": len(manifest.files),
        "segments": sum(len(s) for s in manifest.buckets.values()),
        "remembered": manifest.remembered_keys,
        "rss": vm_rss(),
        "hwm": vm_hwm(),
    }


def _port_files(output: Output, port: str) -> list[str]:
    names = output.storage.entries(output.path(port))
    return sorted(output.path(f"{port}/{name}") for name in names if name.endswith(".parquet"))


def evict_port_files(output: Output, seen: set[str]) -> None:
    """Drop the port files published since the last call from the OS page cache; they stay on
    disk (outside the clock). Kept cached, a 10x day's 4 GB of output fills this VM's page cache
    with new pages, and then writing any file costs about twice as much: the same 20,000-row
    Parquet file took 6.2 ms at first and 13 ms after a few hundred files, on the disk and on
    tmpfs alike, but a flat 6.5 ms when each was synced and dropped from the cache soon after
    (see bench/RESULTS.md). That is the machine, not the sink; the store's files are left be."""
    from dedupsink.engine.classify import PORTS

    for port in PORTS:
        for name in _port_files(output, port):
            if name in seen:
                continue
            seen.add(name)
            descriptor = os.open(name, os.O_RDONLY)
            try:
                os.fdatasync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def spark_probe(
    batches: int,
    rows_per_batch: int,
    resend_fraction: float,
    seed: int,
    work: Path,
    own_time: bool = False,
) -> dict[str, Any]:
    """Per-batch time of the real Spark query over windows of the same shape."""
    import pyarrow.parquet as pq

    day = Day(rows_per_batch, resend_fraction, seed, own_time)
    source = work / "input"
    source.mkdir(parents=True)
    base = int(time.time()) - 86_400
    for index in range(batches):
        target = source / f"part-{index:05d}.parquet"
        pq.write_table(day.window(index), target)
        os.utime(target, (base + index, base + index))
    spark = local_session_builder("bench-scale-probe").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(source / "part-00000.parquet")).schema
    writer = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .writeStream.format("dedup")
        .option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
    )
    for key, value in sink_options(own_time, rows_per_batch, batches, resend_fraction).items():
        writer = writer.option(key, value)
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    wall = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    add_batch = [p["durationMs"].get("addBatch", 0) / 1000 for p in progress]
    spark.stop()
    return {
        "batches": len(progress),
        "wall": wall,
        "trigger": durations,
        "add_batch": add_batch,
    }


# -- the orchestrator -------------------------------------------------------------------------


def day_checkpoints(windows: int) -> list[int]:
    """The windows reported: ``CHECKPOINTS`` within the day, and its last window."""
    return sorted({c for c in CHECKPOINTS if c < windows} | {windows})


def worker_command(
    mode: str,
    args: argparse.Namespace,
    rows_per_batch: int,
    work: Path,
    stop_after: int | None = None,
    end_repeats: int = 0,
) -> list[str]:
    return [
        sys.executable,
        __file__,
        f"--{mode}",
        "--work",
        str(work),
        "--rows-per-batch",
        str(rows_per_batch),
        "--windows",
        str(args.windows),
        "--spark-probe",
        str(args.spark_probe),
        "--resend",
        str(args.resend),
        "--seed",
        str(args.seed),
        "--neighbourhood",
        str(args.neighbourhood),
        *(["--keep-port-cache"] if args.keep_port_cache else []),
        *(["--own-time"] if args.own_time else []),
        *(["--stop-after", str(stop_after)] if stop_after is not None else []),
        *(["--end-repeats", str(end_repeats)] if end_repeats else []),
    ]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


def work_folder(mode: str, root: Path | None) -> Path:
    runs = (root or DATA_DIR) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"scale-{mode}-", dir=runs))


def result_of(mode: str, returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if returncode != 0 or not lines:
        raise SystemExit(f"{mode} run failed ({returncode}):\n{stderr[-6000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


def launch(
    mode: str,
    args: argparse.Namespace,
    rows_per_batch: int,
    root: Path | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    work = work_folder(mode, root)
    command = worker_command(mode, args, rows_per_batch, work, stop_after)
    try:
        done = subprocess.run(
            command, env=worker_env(), capture_output=True, text=True, check=False
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result_of(mode, done.returncode, done.stdout, done.stderr)


def day_with_repeats(
    args: argparse.Namespace, rows_per_batch: int, root: Path | None = None
) -> dict[str, Any]:
    """The day in one process, then window 10 again in ``--start-repeats`` fresh processes,
    each followed by the day's end again in the day's process: the two ends of the ratio are
    measured turn about, so that a drift of the host's speed meets both alike."""
    # What window 10's median needs.
    start_windows = day_checkpoints(args.windows)[0] + args.neighbourhood + 1
    work = work_folder("worker", root)
    command = worker_command("worker", args, rows_per_batch, work, end_repeats=args.start_repeats)
    starts: list[list[float]] = []
    try:
        with tempfile.TemporaryFile("w+") as errors:
            process = subprocess.Popen(
                command,
                env=worker_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
            assert process.stdin is not None and process.stdout is not None
            for _ in range(args.start_repeats):
                if process.stdout.readline().strip() != "READY":
                    break  # the day failed: its error is reported below
                starts.append(
                    launch("worker", args, rows_per_batch, root, stop_after=start_windows)[
                        "seconds"
                    ]
                )
                process.stdin.write("\n")
                process.stdin.flush()
            stdout, _ = process.communicate()
            errors.seek(0)
            result = result_of("worker", process.returncode, stdout, errors.read())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["starts"] = starts
    return result


def window_median(values: list[float], window: int, reach: int) -> float:
    """Median of the windows numbered ``window - reach`` .. ``window + reach`` that exist."""
    last = len(values)
    low, high = max(1, window - reach), min(last, window + reach)
    if high == last:
        low = max(1, last - 2 * reach)
    return median(values[low - 1 : high])


def report_day(result: dict[str, Any], checkpoints: list[int], reach: int) -> float:
    """Print one size's table; returns time per row at the last checkpoint over the first."""
    rows = result["rows_per_batch"]
    print()
    print(
        f"{rows:,} rows per window, {result['windows']:,} windows "
        f"(sink time = run_task + commit_window, median over windows +-{reach})"
    )
    header = (
        f"{'window':>7}{'sink ms/window':>16}{'us/row':>9}{'classify ms':>13}{'task ms':>9}"
        f"{'commit ms':>11}{'store files':>13}{'store MB':>10}{'manifest KB':>13}"
        f"{'segments':>10}{'remembered':>12}{'RSS MB':>9}"
    )
    print(header)
    print("-" * len(header))
    commit = [s - t for s, t in zip(result["seconds"], result["task"], strict=True)]
    sink_time: dict[int, float] = {}
    for window in checkpoints:
        snap = result["snapshots"][str(window)]
        total = sink_time[window] = window_median(result["seconds"], window, reach)
        print(
            f"{window:>7,}{total * 1000:>16.1f}{total / rows * 1e6:>9.2f}"
            f"{window_median(result['classify'], window, reach) * 1000:>13.1f}"
            f"{window_median(result['task'], window, reach) * 1000:>9.1f}"
            f"{window_median(commit, window, reach) * 1000:>11.1f}"
            f"{snap['store_files']:>13,}{snap['store_bytes'] / 1e6:>10.2f}"
            f"{snap['manifest_bytes'] / 1e3:>13.1f}{snap['segments']:>10,}"
            f"{snap['remembered']:>12,}{snap['rss'] / 2**20:>9.0f}"
        )
    seconds = np.array(result["seconds"]) * 1000
    print(
        f"all windows: mean {seconds.mean():.1f} ms, median {np.median(seconds):.1f} ms, "
        f"p95 {np.percentile(seconds, 95):.1f} ms, max {seconds.max():.1f} ms"
    )
    minute = np.arange(len(seconds)) % 60
    bands = [
        f"{low:02d}-{low + 9:02d} {np.median(seconds[(minute >= low) & (minute < low + 10)]):.1f}"
        for low in range(0, 60, 10)
        if ((minute >= low) & (minute < low + 10)).any()
    ]
    print("median ms/window by minute of the hour (the bucket being filled): " + ", ".join(bands))
    hours = len(seconds) // 60
    picks = sorted({0, 1, hours // 4, hours // 2, 3 * hours // 4, hours - 1} - {-1})
    by_hour = [f"{h} {np.median(seconds[h * 60 : (h + 1) * 60]):.1f}" for h in picks if h < hours]
    if by_hour:
        print("median ms/window by hour of the day: " + ", ".join(by_hour))
    totals = result["totals"]
    shown = " ".join(f"{p}={totals.get(p, 0):,}" for p in ("unique", "duplicate", "expired"))
    ok = all(totals.get(p, 0) == n for p, n in result["expected"].items())
    print(
        f"whole day: {sum(result['seconds']):.1f} s in the sink; peak RSS (VmHWM) "
        f"{result['peak_rss'] / 2**20:.0f} MB, {result['baseline_rss'] / 2**20:.0f} MB before the "
        f"first window; ports {shown} ({'ok' if ok else 'MISMATCH'} against the generator)"
    )
    first, last = checkpoints[0], checkpoints[-1]
    growth = sink_time[last] / sink_time[first]  # a window's rows are the same all day
    print(f"time per row, window {last:,} / window {first:,} of this day: {growth:.3f}")
    if len(checkpoints) > 2:
        # The store's structure (bucket sizes, runs and segments a bucket) settles within the
        # day's first hours: this separates that ramp from growth that goes on all day.
        second = checkpoints[1]
        print(
            f"time per row, window {last:,} / window {second:,} of this day: "
            f"{sink_time[last] / sink_time[second]:.3f}"
        )
    starts = [window_median(start, first, reach) for start in result.get("starts", [])]
    if not starts:
        return growth
    # Window 10 is measured once, minutes before window 1,440, on a host whose speed drifts:
    # in three runs of the same code it took 14.0 to 18.8 ms at 2,000 rows on the disk while
    # window 1,440 took 21.7 to 22.0. The day's start is run again in fresh processes after
    # the day, and the ratio uses the median of all its measurements.
    early = repeated(
        sink_time[first],
        starts,
        f"window {first:,} again in {len(starts)} fresh processes after the day",
    )
    growth = sink_time[last] / early
    print(f"time per row, window {last:,} / window {first:,} (median of the starts): {growth:.3f}")
    ends = [median(end) for end in result.get("ends", [])]
    if not ends:
        return growth
    # A single measurement of the day's end (11 windows, a quarter of a second at 2,000 rows)
    # is as exposed to the host's slow spells as window 10 was: the end is measured again
    # after each of window 10's repeats, in turn with them, and the ratio is of the medians.
    late = repeated(
        sink_time[last],
        ends,
        f"window {last:,} again, {2 * reach + 1} more windows of the day's last minute after "
        "each of those",
    )
    growth = late / early
    print(
        f"time per row, window {last:,} / window {first:,} (medians of {len(ends) + 1}, measured "
        f"in turn): {growth:.3f}"
    )
    return growth


def repeated(day: float, repeats: list[float], what: str) -> float:
    """Print a window's measurements repeated after the day; returns their median with the
    day's own."""
    value = median([day, *repeats])
    shown = ", ".join(f"{repeat * 1000:.1f}" for repeat in repeats)
    print(f"{what}: {shown} ms; median with this day's: {value * 1000:.1f} ms")
    return value


def per_size(results: list[dict[str, Any]], growths: list[float]) -> str:
    """Each size's growth, as ``2,000 rows 1.101, 20,000 rows 1.293``."""
    return ", ".join(
        f"{r['rows_per_batch']:,} rows {g:.3f}" for r, g in zip(results, growths, strict=True)
    )


def orchestrate(args: argparse.Namespace) -> None:
    print_machine()
    start_revision = code_revision()
    load = LoadSampler().start()
    if args.spark_probe:
        probe = launch("probe", args, args.rows_per_batch)
        steady = probe["trigger"][2:] or probe["trigger"]
        per_batch = median(steady)
        print(
            f"Spark probe: {probe['batches']} micro-batches of {args.rows_per_batch:,} rows "
            f"through format('dedup') on local[2] took {probe['wall']:.1f} s; median "
            f"triggerExecution {per_batch:.2f} s (addBatch {median(probe['add_batch'][2:]):.2f} s)"
            f" -> about {per_batch * args.windows / 60:.0f} min for {args.windows:,} batches, "
            "per size"
        )
    print(
        "driving the sink's executor and driver code directly (run_task + commit_window, one "
        "task a window, local filesystem), without Spark's transport"
    )
    if args.own_time:
        options = sink_options(True, args.rows_per_batch, args.windows, args.resend)
        print(
            "assumeSameExpiry=false: re-sends carry their own window's time; "
            + ", ".join(f"{k}={v}" for k, v in options.items())
            + f" at {args.rows_per_batch:,} rows a window (maxCacheMemory scales with the size)"
        )
    checkpoints = day_checkpoints(args.windows)
    sizes = [args.rows_per_batch, args.rows_per_batch * args.factor]
    results = [day_with_repeats(args, rows) for rows in sizes]
    memory = Path(args.memory_root) if args.memory_root else None
    in_memory: list[dict[str, Any]] = []
    if memory is not None and memory.is_dir():
        for rows in sizes:
            try:
                in_memory.append(day_with_repeats(args, rows, memory / "dedupsink-scale"))
            finally:
                shutil.rmtree(memory / "dedupsink-scale", ignore_errors=True)
    load.stop()
    if args.json:
        record = {"args": vars(args), "results": results, "in_memory": in_memory}
        Path(args.json).write_text(json.dumps(record))
    revision = code_revision()
    if revision != start_revision:
        print(f"WARNING: dedupsink changed during the runs: {start_revision} -> {revision}")
    growths = [report_day(result, checkpoints, args.neighbourhood) for result in results]
    rss_growth = results[1]["peak_rss"] / results[0]["peak_rss"]
    print()
    print(load.summary())
    print(f"overhead growth per size: {per_size(results, growths)}")
    memory_growths = []
    for result in in_memory:
        print()
        print(
            f"the {result['rows_per_batch']:,}-row day again with the output and the store on "
            f"{args.memory_root} (the sink's own cost, without the disk's):"
        )
        memory_growths.append(report_day(result, checkpoints, args.neighbourhood))
    if memory_growths:
        print()
        print(
            f"overhead growth per size on {args.memory_root}: {per_size(in_memory, memory_growths)}"
        )
    print(f"overhead_growth={max(growths):.3f}")
    if memory_growths:
        print(f"memory_overhead_growth={max(memory_growths):.3f}")
    print(f"rss_growth={rss_growth:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1440)
    parser.add_argument("--rows-per-batch", type=int, default=2000)
    parser.add_argument("--factor", type=int, default=10, help="rows per batch of the second run")
    parser.add_argument("--resend", type=float, default=0.10)
    parser.add_argument("--neighbourhood", type=int, default=5)
    parser.add_argument(
        "--start-repeats",
        type=int,
        default=4,
        help="run the day's first windows again in this many fresh processes after the day",
    )
    parser.add_argument(
        "--spark-probe", type=int, default=20, help="Spark batches to time; 0: none"
    )
    parser.add_argument("--seed", type=int, default=20240602)
    parser.add_argument("--json", help="also write every window's measurements to this file")
    parser.add_argument("--profile", type=int, default=0, help="profile the last N windows")
    parser.add_argument(
        "--keep-port-cache", action="store_true", help="leave port files in the page cache"
    )
    parser.add_argument(
        "--memory-root",
        default="/dev/shm",
        help="also run both sizes with their files here (a memory filesystem); '' to skip",
    )
    parser.add_argument(
        "--own-time",
        action="store_true",
        help="assumeSameExpiry=false, re-sends stamped with their own (later) time",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--stop-after", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end-repeats", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        work = Path(tempfile.mkdtemp(prefix="scale-profile-", dir=DATA_DIR))
        try:
            record = run_day(
                args.windows,
                args.rows_per_batch,
                args.resend,
                args.seed,
                [args.windows],
                work,
                args.profile,
                args.keep_port_cache,
                args.own_time,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        seconds = record["seconds"]
        print(
            f"sink time per window: first 10 {median(seconds[:10]) * 1000:.1f} ms, "
            f"last 10 {median(seconds[-10:]) * 1000:.1f} ms"
        )
        return
    if args.worker or args.probe:
        work = Path(args.work)
        if args.worker:
            checkpoints = day_checkpoints(args.windows)
            record = run_day(
                args.windows,
                args.rows_per_batch,
                args.resend,
                args.seed,
                checkpoints,
                work,
                keep_port_cache=args.keep_port_cache,
                own_time=args.own_time,
                stop_after=args.stop_after,
                end_repeats=args.end_repeats,
                end_windows=2 * args.neighbourhood + 1,
            )
        else:
            record = spark_probe(
                args.spark_probe, args.rows_per_batch, args.resend, args.seed, work, args.own_time
            )
        print(RESULT_PREFIX + json.dumps(record), flush=True)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
