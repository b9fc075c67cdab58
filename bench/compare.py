"""End-to-end comparison: the dedup sink against Spark's deduplication and the bare Python sink.

Input (generated once, seeded, cached under ``bench/.data/``): 2,000,000 rows in 40 Parquet
files with columns ``id`` (36-character UUID), ``event_time`` (about 185 rows per second of
event time, so three hours over the stream, with +-1 s jitter), ``user``, ``amount`` and
``payload`` (~80 characters). 10% of the rows are exact re-sends of a row from the previous
~5,000 rows; 0.5% are very late re-sends, copies of a row 75 to 120 minutes of event time older.
The generator knows the truth: the first copy of each id is its unique row.

Each variant streams the same input with Spark ``local[2]``, ``spark.sql.shuffle.partitions=2``,
``maxFilesPerTrigger=2`` (20 micro-batches of 100,000 rows) and ``trigger(availableNow=True)``:

* ``floor``: straight to Spark's Parquet file sink, no deduplication (the cost of the stream);
* ``python-bare`` (formerly ``python-floor``, a name still accepted): the bare Python sink,
  ``common.python_bare_source``: each task's Arrow batches written once to a Parquet file, no
  deduplication, no exactly-once, nothing committed; the ceiling of any Python sink, what
  Spark's Python data source transport alone costs;
* ``spark-dropdup-rocksdb``: ``withWatermark("event_time", "1 hour")
  .dropDuplicates(["id", "event_time"])`` into the Parquet sink, RocksDB state store;
* ``spark-within-watermark-rocksdb``: ``withWatermark("event_time", "1 hour")
  .dropDuplicatesWithinWatermark(["id"])``, RocksDB;
* ``dedupsink``: ``format("dedup")`` with ``keys=id``, ``expiryKey=event_time``,
  ``expiryPeriod=1 hour``;
* ``dedupsink-delta``: the same with ``outputFormat=delta``, its four ports Delta Lake tables
  (delta-rs: ``pip install 'dedupsink[delta]'``);
* ``dedupsink-own-time``: the same with ``assumeSameExpiry=false`` and ``expiryPeriod=2 hours``,
  which remembers each id as long as ``spark-within-watermark-rocksdb`` does (Spark keeps a key
  until its event time + the 1-hour delay falls behind the watermark, itself an hour behind the
  newest event time).

``--resend-times later`` generates the same shape except that the 10% regular re-sends are sent
20 to 100 minutes of event time after their original and carry that send time as their
``event_time`` (a producer's retry stamped at send time): Assumption 1 does not hold. The run
then compares ``dedupsink-own-time`` with ``spark-within-watermark-rocksdb`` (and ``floor``) by
default. Both keep every re-send out (each comes within 2 hours of its original) and every very
late row (Spark drops it behind the watermark; dedupsink sends it to ``duplicate`` or
``expired``), so both must output exactly the originals: both counts are printed with whether
they agree, and ``ratio_own_time_vs_spark_within_watermark=<x>`` is the median over the rounds
of the first's rows/s over the second's. ``dedupsink`` (the default setting) can be added with
``--variants``: on this data it counts re-sends as unique.

Every run is a fresh Python process (this script with ``--variant``), variants interleaved
A B C D and the round repeated (three times by default), so JVM start-up, JIT warm-up and the
page cache treat all variants alike; the sink's modules are compiled to bytecode first, as an
installed wheel has them. Measured per run:

* rows/s: input rows / wall time from ``writeStream...start()`` to the return of
  ``awaitTermination()`` (the session, the JVM, the data generation and the session's one-time
  discovery of installed Python data sources are outside the clock, in every variant);
* state bytes per remembered key. RocksDB: bytes of every file under the checkpoint's
  ``state/`` directory (all retained versions: SST files, changelogs, zipped metadata) divided
  by the rows in the state store after the last batch (``numRowsTotal`` of the last progress
  report); the SST bytes of the last version alone (``rocksdbSstFileSize``) are printed too.
  dedupsink: the window files under ``_store/data`` (``BucketStore.disk_usage``) divided by the
  remembered keys of the last manifest (``BucketStore.read().remembered_keys``);
* CPU seconds: user + system CPU of the whole process tree between the same two points, from
  ``/proc/<pid>/stat`` (the machine may be shared; CPU time is steadier than wall time then);
* peak RSS: the largest sum of ``VmRSS`` over the run's process tree (Python driver, driver
  JVM, Python workers), sampled every 0.2 s from ``/proc``, the same with ``Pss`` (sampled every
  second: shared pages divided among their sharers), and the JVM's own peak;
* PSS by process: each process's ``Pss`` at the sample of the tree's PSS peak and at the end of
  the stream (after ``awaitTermination``), by its role (the driver's Python, the JVM, each of
  the Python daemons Spark starts for a Python data source and the workers they fork), with the
  number of Python processes alive at both; ``peak_tree_pss_vs_floor=<x>`` is the median over
  the rounds of dedupsink's peak tree PSS over the floor's;
* Spark's per-phase durations (``addBatch``, ``walCommit``, ...) summed over the batches;
* correctness: the rows of the deduplicated output (dedupsink: each port) against the truth.

The batch table (Markdown, the issue's columns; medians over the repeats) has per variant:

* rows/s: as above, the whole stream, first batch included;
* steady rows/s: the rows of batches 2..n over the sum of their ``triggerExecution`` (Spark's
  progress reports): the rate once every process the stream needs is running;
* first batch: the first batch's ``triggerExecution``, in seconds (it carries the start of
  every Python process Spark runs for a Python sink);
* median and p95 ms a batch: of the ``triggerExecution`` of batches 2..n.

The other tables show medians over the repeats too; ``--json FILE`` also saves every run's
record. The last lines are machine-readable: ``ratio_vs_spark_within_watermark=<x>`` and
``ratio_vs_floor=<x>``, each the median over the repeats of dedupsink rows/s / that variant's
rows/s within the same round (the line before them gives the same ratios per CPU-second),
``peak_tree_pss_vs_floor=<x>``, then against the bare Python sink, each the median over the
rounds of the round's ratio: ``first_batch_vs_bare_s`` (the first batch's seconds minus the bare
sink's), ``steady_ratio_vs_bare`` (steady rows/s over the bare sink's) and ``ratio_vs_bare``
(rows/s over the bare sink's), bracketed (``ratio_vs_bare[dedupsink-delta]=<x>``) for every
other variant, unbracketed for ``dedupsink``, last.

``--small`` is the per-window floor: 50,000 rows in 50 files, one file a batch
(``maxFilesPerTrigger=1``), so 50 batches of 1,000 rows, where the per-batch cost of each
variant is most of its time (it sets ``--rows``, ``--files`` and ``--files-per-trigger``).

``--profile`` runs the dedupsink variant's own code instead, in this process and without Spark,
under pyinstrument: every input file is one task (``run_task`` over 10,000-row Arrow batches, as
Spark hands them; the Parquet files are read before the clock starts), ``--files-per-trigger``
tasks make a window, whose ``commit_window`` follows; it prints the time split and the profile.

Usage: ``python bench/compare.py [--rows N] [--files N] [--repeats N] [--variants a,b]
[--resend-times same|later] [--small]``; by default ``floor``, ``python-bare``, ``dedupsink``,
``dedupsink-delta`` and ``spark-within-watermark-rocksdb`` (the issue's table; with
``--resend-times later`` as said above). ``--rows 200000 --files 8 --repeats 1`` is a quick
check (the event-time span stays three hours whatever the row count, so expiry still evicts and
very late rows still exist).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BARE_SINK,
    DATA_DIR,
    OWN_TIME_PERIOD_S,
    PERIOD_S,
    RESEND_TIMES,
    RESULT_PREFIX,
    CompareSpec,
    LoadSampler,
    TreeSampler,
    code_revision,
    dir_bytes,
    generate_compare_input,
    local_session_builder,
    median,
    print_machine,
    python_bare_source,
    python_count,
    run_child,
    run_main,
    time_stream,
    variant_names,
)

VARIANTS = (
    "floor",
    BARE_SINK,
    "spark-dropdup-rocksdb",
    "spark-within-watermark-rocksdb",
    "dedupsink",
    "dedupsink-delta",
    "dedupsink-own-time",
)
# What runs by default on each shape of data (--resend-times).
DEFAULT_VARIANTS = {
    "same": (
        "floor",
        BARE_SINK,
        "dedupsink",
        "dedupsink-delta",
        "spark-within-watermark-rocksdb",
    ),
    "later": ("floor", "spark-within-watermark-rocksdb", "dedupsink-own-time"),
}
# The variants whose output is every input row (no deduplication).
COPY_VARIANTS = ("floor", BARE_SINK)
# --small: the per-window floor, 50 batches of 1,000 rows (one file a batch).
SMALL = {"rows": 50_000, "files": 50, "files_per_trigger": 1}
WATERMARK = f"{PERIOD_S // 3600} hour"
SINK_OPTIONS = {
    "dedupsink": {"keys": "id", "expiryKey": "event_time", "expiryPeriod": WATERMARK},
    "dedupsink-delta": {
        "keys": "id",
        "expiryKey": "event_time",
        "expiryPeriod": WATERMARK,
        "outputFormat": "delta",
    },
    "dedupsink-own-time": {
        "keys": "id",
        "expiryKey": "event_time",
        "expiryPeriod": f"{OWN_TIME_PERIOD_S // 3600} hours",
        "assumeSameExpiry": "false",
    },
}
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PORTS = ("unique", "duplicate", "expired", "error")


# -- one variant, in its own process --------------------------------------------------------


def build_session(variant: str, driver_memory: str) -> Any:
    builder = local_session_builder(
        f"bench-compare-{variant}", {"spark.driver.memory": driver_memory}
    ).config("spark.sql.streaming.stopTimeout", "60s")
    if "rocksdb" in variant:
        builder = builder.config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_variant(
    variant: str, input_dir: Path, work: Path, files_per_trigger: int, driver_memory: str
) -> dict[str, Any]:
    """Run one variant to completion and measure it; returns a JSON-able record."""
    sampler = TreeSampler(pss_every=5).start()
    spark = build_session(variant, driver_memory)
    schema = spark.read.parquet(str(next(input_dir.glob("*.parquet")))).schema
    # Registering a Python data source makes Spark discover the installed ones (a Python process
    # importing every pyspark_* module, ~0.9 s once a session). Doing it here, outside the
    # clock, in every variant keeps that one-time cost out of every variant's rows/s alike;
    # before, the bare sink paid it outside the clock and dedupsink inside (at start()).
    spark.dataSource.register(python_bare_source())
    output, checkpoint = work / "out", work / "checkpoint"
    frame = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(input_dir))
    )
    if variant == "spark-dropdup-rocksdb":
        frame = frame.withWatermark("event_time", WATERMARK).dropDuplicates(["id", "event_time"])
    elif variant == "spark-within-watermark-rocksdb":
        frame = frame.withWatermark("event_time", WATERMARK).dropDuplicatesWithinWatermark(["id"])
    if variant == BARE_SINK:
        writer = frame.writeStream.format(BARE_SINK).option("path", str(output))
    elif variant in SINK_OPTIONS:
        writer = frame.writeStream.format("dedup").options(**SINK_OPTIONS[variant])
        writer = writer.option("path", str(output))
    else:
        writer = frame.writeStream.format("parquet").option("path", str(output))
    writer = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    timed = time_stream(writer, sampler)
    query, seconds, progress = timed.query, timed.seconds, timed.progress
    cpu_seconds = timed.cpu_seconds
    record: dict[str, Any] = {
        "variant": variant,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "peak_tree_rss": sampler.peak_total,
        "peak_tree_pss": sampler.peak_pss,
        "peak_jvm_rss": sampler.peak_by_name.get("java", 0),
        "peak_by_name": sampler.peak_by_name,
        "peak_roles": sampler.peak_roles,
        "end_roles": sampler.end_roles,
        "peak_python": sampler.peak_python,
        "end_python": sampler.end_python,
        "batches": len(progress),
        "duration_ms": progress_durations(query.recentProgress),
        "batch_ms": [int(p.get("durationMs", {}).get("triggerExecution", 0)) for p in progress],
        "batch_rows": [int(p["numInputRows"]) for p in progress],
    }
    if variant in SINK_OPTIONS:
        record |= dedupsink_measures(output)
    else:
        record |= spark_output_measures(output, query, checkpoint)
    spark.stop()
    return record


def progress_durations(progress: list[dict[str, Any]]) -> dict[str, int]:
    """Spark's per-phase milliseconds (addBatch, walCommit, ...) summed over the batches."""
    totals: dict[str, int] = {}
    for report in progress:
        for phase, ms in report.get("durationMs", {}).items():
            totals[phase] = totals.get(phase, 0) + int(ms)
    totals["batches_with_progress"] = len(progress)
    return totals


def distinct_ids(path: Path) -> tuple[int, int]:
    """(rows, distinct ids) of a Parquet directory (read with pyarrow) or a Delta table (with
    delta-rs: the files of its current version); (0, 0) for a port never written."""
    if (path / "_delta_log").is_dir():
        from deltalake import DeltaTable

        table = DeltaTable(str(path)).to_pyarrow_table(columns=["id"])
    elif path.exists():
        table = ds.dataset(str(path), format="parquet").to_table(columns=["id"])
    else:
        return 0, 0
    return table.num_rows, pc.count_distinct(table["id"]).as_py()


def spark_output_measures(output: Path, query: Any, checkpoint: Path) -> dict[str, Any]:
    rows, distinct = distinct_ids(output)
    record: dict[str, Any] = {"out_rows": rows, "out_distinct": distinct}
    progress = [p for p in query.recentProgress if p.get("stateOperators")]
    if progress:
        operator = progress[-1]["stateOperators"][0]
        metrics = operator.get("customMetrics", {})
        record |= {
            "state_keys": int(operator["numRowsTotal"]),
            "state_sst_bytes": int(metrics.get("rocksdbSstFileSize", 0)),
            "late_dropped": sum(
                int(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0)) for p in progress
            ),
        }
        record["state_files"], record["state_bytes"] = dir_bytes(checkpoint / "state")
    return record


def dedupsink_measures(output: Path) -> dict[str, Any]:
    from dedupsink.store.store import BucketStore

    store = BucketStore(str(output / "_store"))
    manifest = store.read()
    files, data_bytes = store.disk_usage()
    record: dict[str, Any] = {
        "state_keys": manifest.remembered_keys if manifest else 0,
        "state_files": files,
        "state_bytes": data_bytes,
        "manifest_bytes": len(manifest.to_bytes()) if manifest else 0,
        "windows": manifest.version if manifest else 0,
    }
    for port in PORTS:
        rows, distinct = distinct_ids(output / port)
        record[f"port_{port}"] = rows
        if port == "unique":
            record["out_rows"], record["out_distinct"] = rows, distinct
    return record


# -- the sink's code path under a profiler ------------------------------------------------------


def profile_sink(
    input_dir: Path, files_per_trigger: int, rows: int, flat: bool, variant: str
) -> None:
    """Drive the sink's tasks and commits over the input as Spark would, under pyinstrument."""
    import pyarrow.parquet as pq
    from pyinstrument import Profiler

    from dedupsink.sink.local import LocalSink

    files = sorted(input_dir.glob("*.parquet"))
    tables = [pq.read_table(f) for f in files]
    work = Path(tempfile.mkdtemp(prefix="profile-", dir=DATA_DIR))
    options = {"path": str(work / "out"), **SINK_OPTIONS[variant]}
    sink = LocalSink(options, tables[0].schema, query_id="profile")
    task_s = classify_s = commit_s = 0.0
    profiler = Profiler(interval=0.001)
    started = time.perf_counter()
    profiler.start()
    try:
        for batch_id, first in enumerate(range(0, len(tables), files_per_trigger)):
            summaries = []
            for partition, table in enumerate(tables[first : first + files_per_trigger]):
                summary = sink.task(batch_id, partition, table.to_batches(max_chunksize=10_000))
                task_s += summary.seconds
                classify_s += summary.classify_seconds
                summaries.append(summary)
            tick = time.perf_counter()
            sink.commit(batch_id, summaries)
            commit_s += time.perf_counter() - tick
    finally:
        profiler.stop()
        shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - started
    print(
        f"sink code path, one process, no Spark: {total:.1f} s for {rows:,} rows = "
        f"{rows / total:,.0f} rows/s (tasks {task_s:.1f} s, of which classify {classify_s:.1f} s; "
        f"commits {commit_s:.1f} s)"
    )
    print(profiler.output_text(unicode=False, color=False, flat=flat))


# -- the orchestrator -------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    work = Path(args.work)
    record = run_variant(
        args.variant, Path(args.input), work, args.files_per_trigger, args.driver_memory
    )
    print(RESULT_PREFIX + json.dumps(record), flush=True)


def launch(variant: str, input_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    options = ["--variant", variant, "--input", str(input_dir)]
    options += ["--files-per-trigger", str(args.files_per_trigger)]
    options += ["--driver-memory", args.driver_memory]
    return run_child(__file__, variant, options, DATA_DIR / "runs", args.keep)


def check(record: dict[str, Any], truth: dict[str, Any]) -> str:
    """One line: does the variant's output agree with the generator's truth?"""
    unique_truth = truth["unique_ids"]
    if record["variant"] in COPY_VARIANTS:
        ok = record["out_rows"] == truth["rows"]
        return f"{'ok' if ok else 'MISMATCH'}: {record['out_rows']:,} rows out of {truth['rows']:,}"
    base = (
        f"{record['out_rows']:,} unique rows, {record['out_distinct']:,} distinct ids "
        f"(truth {unique_truth:,})"
    )
    ok = record["out_rows"] == record["out_distinct"] == unique_truth
    if record["variant"] in SINK_OPTIONS:
        own_time = record["variant"] == "dedupsink-own-time"
        expected = truth["expected_own_time_ports" if own_time else "expected_dedup_ports"]
        if expected is None:
            extra = record["out_rows"] - unique_truth
            return (
                f"not comparable: {base}; {extra:,} more unique rows than ids, copies whose "
                "later time put them in another time bucket (Assumption 1 does not hold)"
            )
        ports = {port: record[f"port_{port}"] for port in PORTS}
        ok = ok and ports == expected
        shown = " ".join(f"{p}={ports[p]:,}" for p in PORTS)
        wanted = " ".join(f"{p}={expected[p]:,}" for p in PORTS)
        return f"{'ok' if ok else 'MISMATCH'}: {base}; ports {shown} (expected {wanted})"
    dropped = record.get("late_dropped", 0)
    return f"{'ok' if ok else 'MISMATCH'}: {base}; {dropped:,} rows dropped as late by watermark"


def report(
    results: dict[str, list[dict[str, Any]]], truth: dict[str, Any], rows: int, batches: str
) -> None:
    print()
    header = (
        f"{'variant':<32}{'rows/s (median)':>16}{'runs rows/s':>28}{'CPU s':>8}{'state B/key':>13}"
        f"{'peak tree RSS':>15}{'peak tree PSS':>15}{'peak JVM RSS':>14}"
    )
    print(header)
    print("-" * len(header))
    for variant, records in results.items():
        rates = [rows / r["seconds"] for r in records]
        per_key = [r["state_bytes"] / r["state_keys"] for r in records if r.get("state_keys")]
        key_text = f"{median(per_key):.1f}" if per_key else "-"
        runs = " ".join(f"{x:,.0f}" for x in rates)
        cpu = [r["cpu_seconds"] for r in records if "cpu_seconds" in r]
        cpu_text = f"{median(cpu):.1f}" if cpu else "-"
        rss = median([r["peak_tree_rss"] for r in records]) / 2**20
        pss = median([r["peak_tree_pss"] for r in records]) / 2**20
        jvm = median([r["peak_jvm_rss"] for r in records]) / 2**20
        print(
            f"{variant:<32}{median(rates):>16,.0f}{runs:>28}{cpu_text:>8}{key_text:>13}"
            f"{rss:>12,.0f} MB{pss:>12,.0f} MB{jvm:>11,.0f} MB"
        )
    print(
        "(CPU s: user + system CPU of the whole process tree from query start to the end of "
        "awaitTermination, from /proc; the 2-core machine is shared, so wall time includes "
        "waiting for a core and CPU time is the steadier figure)"
    )
    print(
        "(peak tree RSS: sum of VmRSS over driver Python + driver JVM + Python workers, shared "
        "pages counted per process; PSS: the same with shared pages divided; medians)"
    )
    print()
    print_memory_by_role(results)
    print()
    print("state on disk (last run of each variant):")
    for variant, records in results.items():
        r = records[-1]
        if not r.get("state_keys"):
            print(f"  {variant}: no state")
            continue
        line = (
            f"  {variant}: {r['state_bytes']:,} B in {r['state_files']} files for "
            f"{r['state_keys']:,} keys = {r['state_bytes'] / r['state_keys']:.1f} B/key"
        )
        if "state_sst_bytes" in r:
            line += (
                f"; last version's SST files alone {r['state_sst_bytes']:,} B = "
                f"{r['state_sst_bytes'] / r['state_keys']:.1f} B/key"
            )
        else:
            line += f" (+ manifest {r['manifest_bytes']:,} B, {r['windows']} windows)"
        print(line)
    print()
    print("Spark's phases, seconds summed over the micro-batches (median of the runs):")
    for variant, records in results.items():
        phases = [r.get("duration_ms", {}) for r in records]
        names = ("triggerExecution", "addBatch", "queryPlanning", "walCommit", "commitOffsets")
        shown = []
        for name in names:
            values = [p[name] / 1000 for p in phases if name in p]
            if values:
                shown.append(f"{name} {median(values):.1f}")
        print(f"  {variant}: " + ", ".join(shown))
    print()
    print_first_batch_split(results)
    print()
    print_batch_table(results, batches)
    print()
    print("correctness (every run):")
    for variant, records in results.items():
        for index, r in enumerate(records):
            print(f"  {variant} #{index + 1}: {check(r, truth)}")


def role_sizes(roles: list[list[Any]]) -> dict[str, int]:
    """One sample's PSS by role, a role's processes told apart by size (``task worker #2``)."""
    sizes: dict[str, int] = {}
    for role, pss in sorted(roles, key=lambda item: (item[0], -item[1])):
        label, n = role, 1
        while label in sizes:
            n += 1
            label = f"{role} #{n}"
        sizes[label] = pss
    return sizes


def python_pss(roles: list[list[Any]]) -> int:
    """The PSS of a sample's Python processes (the JVM's varies with its garbage collector by
    some hundreds of MB from run to run, the same code and input)."""
    return sum(pss for role, pss in roles if python_count([(role, pss)]))


def print_memory_by_role(results: dict[str, list[dict[str, Any]]]) -> None:
    """Per variant: the PSS of each process by its role at the tree's PSS peak and at the end
    of the stream (medians of the runs), and how many Python processes were alive then."""
    print("PSS by process at the tree's peak and at the end of the stream (MB, run medians):")
    for variant, records in results.items():
        timed = [r for r in records if r.get("peak_roles")]
        if not timed:
            continue
        peaks = [role_sizes(r["peak_roles"]) for r in timed]
        ends = [role_sizes(r["end_roles"]) for r in timed]
        python = median([python_pss(r["peak_roles"]) for r in timed]) / 2**20
        print(
            f"  {variant}: peak {median([r['peak_tree_pss'] for r in timed]) / 2**20:,.0f} MB "
            f"with {median([r['peak_python'] for r in timed]):.0f} Python processes "
            f"({python:,.0f} MB of it), end {median([sum(e.values()) for e in ends]) / 2**20:,.0f}"
            f" MB with {median([r['end_python'] for r in timed]):.0f}"
        )
        for label in sorted({name for sizes in peaks + ends for name in sizes}):
            at_peak = median([sizes.get(label, 0) for sizes in peaks]) / 2**20
            at_end = median([sizes.get(label, 0) for sizes in ends]) / 2**20
            if at_peak < 0.5 and at_end < 0.5:
                continue  # a program the JVM ran for a moment (its launcher, a shell)
            print(f"    {label:<36}{at_peak:>8,.0f}{at_end:>8,.0f}")


def print_first_batch_split(results: dict[str, list[dict[str, Any]]]) -> None:
    """The first micro-batch against the others (triggerExecution, medians of the runs): the
    first one carries the start-up of every Python process Spark runs for a Python sink."""
    print("first micro-batch and the others (triggerExecution, median of the runs):")
    floor_rest = None
    for variant, records in results.items():
        timed = [r["batch_ms"] for r in records if len(r.get("batch_ms", [])) > 1]
        if not timed:
            continue
        first = median([batches[0] for batches in timed]) / 1000
        rest = median([sum(batches[1:]) for batches in timed]) / 1000
        per_batch = median([median(batches[1:]) for batches in timed])
        if variant == "floor":
            floor_rest = rest
        versus = "" if floor_rest is None else f"; the others / floor's {rest / floor_rest:.3f}"
        print(
            f"  {variant:<32} first {first:5.1f} s, the other {len(timed[0]) - 1} "
            f"{rest:5.1f} s (median {per_batch:,.0f} ms each){versus}"
        )


def batch_figures(record: dict[str, Any]) -> dict[str, float]:
    """One run's figures of the batch table: rows/s over the whole stream, steady rows/s (the
    rows of batches 2..n over their summed ``triggerExecution``), the first batch in seconds,
    and the median and p95 milliseconds of batches 2..n."""
    rows, times = record["batch_rows"], record["batch_ms"]
    rest_ms = times[1:] or times
    rest_rows = rows[1:] or rows
    return {
        "rows_per_s": sum(rows) / record["seconds"],
        "steady_rows_per_s": sum(rest_rows) / (sum(rest_ms) / 1000),
        "first_batch_s": times[0] / 1000,
        "median_ms": float(np.median(rest_ms)),
        "p95_ms": float(np.percentile(rest_ms, 95)),
    }


BATCH_COLUMNS = (
    ("rows/s", "rows_per_s", "{:,.0f}"),
    ("steady rows/s", "steady_rows_per_s", "{:,.0f}"),
    ("first batch", "first_batch_s", "{:.1f} s"),
    ("median ms a batch", "median_ms", "{:,.0f}"),
    ("p95 ms a batch", "p95_ms", "{:,.0f}"),
)


def print_batch_table(results: dict[str, list[dict[str, Any]]], batches: str) -> None:
    """The batch table (a Markdown table; medians over the rounds) and each variant's ratios
    to the bare Python sink."""
    print(f"| {batches} | " + " | ".join(name for name, _, _ in BATCH_COLUMNS) + " |")
    print("| --- |" + " ---: |" * len(BATCH_COLUMNS))
    for variant, records in results.items():
        figures = [batch_figures(r) for r in records if r.get("batch_rows")]
        if not figures:
            continue
        cells = [shape.format(median([f[key] for f in figures])) for _, key, shape in BATCH_COLUMNS]
        print(f"| {variant} | " + " | ".join(cells) + " |")
    print(
        "(rows/s: input rows over the wall time from start() to the end of awaitTermination(); "
        "steady rows/s: the rows of batches 2..n over their summed triggerExecution; first "
        "batch: its triggerExecution; median and p95: of batches 2..n; medians over the rounds)"
    )


def bare_ratios(
    results: dict[str, list[dict[str, Any]]], ours: str
) -> tuple[float, float, float] | None:
    """Median over the rounds of ``ours``' rows/s, steady rows/s and first batch over the bare
    Python sink's in the same round."""
    if ours not in results or BARE_SINK not in results:
        return None
    pairs = [
        (batch_figures(mine), batch_figures(bare))
        for mine, bare in zip(results[ours], results[BARE_SINK], strict=False)
    ]
    return (
        median([mine["rows_per_s"] / bare["rows_per_s"] for mine, bare in pairs]),
        median([mine["steady_rows_per_s"] / bare["steady_rows_per_s"] for mine, bare in pairs]),
        median([mine["first_batch_s"] - bare["first_batch_s"] for mine, bare in pairs]),
    )


def print_bare_ratios(results: dict[str, list[dict[str, Any]]]) -> None:
    """The machine-readable last lines: each variant against the bare Python sink (dedupsink
    unbracketed)."""
    others = [v for v in results if v != BARE_SINK and v != "dedupsink"]
    for variant in [*others, "dedupsink"]:
        found = bare_ratios(results, variant)
        if found is None:
            continue
        rows, steady, first = found
        label = "" if variant == "dedupsink" else f"[{variant}]"
        print(f"first_batch_vs_bare_s{label}={first:+.1f}")
        print(f"steady_ratio_vs_bare{label}={steady:.3f}")
        print(f"ratio_vs_bare{label}={rows:.3f}")


def ratio(
    results: dict[str, list[dict[str, Any]]],
    other: str,
    measure: str = "seconds",
    ours: str = "dedupsink",
) -> float | None:
    """Median over the rounds of (``ours``' rows per ``measure``) / (``other``'s)."""
    if ours not in results or other not in results:
        return None
    pairs = zip(results[ours], results[other], strict=False)
    return median([theirs[measure] / mine[measure] for mine, theirs in pairs])


def print_unique_counts(results: dict[str, list[dict[str, Any]]], truth: dict[str, Any]) -> None:
    """Per round: dedupsink-own-time's and Spark's unique rows, and whether they agree."""
    ours, theirs = "dedupsink-own-time", "spark-within-watermark-rocksdb"
    if ours not in results or theirs not in results:
        return
    for index, (mine, spark) in enumerate(zip(results[ours], results[theirs], strict=False)):
        same = mine["out_rows"] == spark["out_rows"]
        print(
            f"unique rows, round {index + 1}: {ours} {mine['out_rows']:,}, {theirs} "
            f"{spark['out_rows']:,} (ids in the input {truth['unique_ids']:,}): "
            f"{'the same' if same else 'DIFFERENT'}"
        )


def compile_bytecode() -> None:
    """Compile dedupsink's modules to bytecode, as installing a wheel does.

    A source checkout run with ``PYTHONDONTWRITEBYTECODE`` set (as on some CI images) never
    caches bytecode, so every Python process Spark starts would compile the sink (and
    the bare sink's Parquet helper) from source, some 25 ms each."""
    import compileall

    import dedupsink

    compileall.compile_dir(str(Path(dedupsink.__file__).parent), quiet=1)


def orchestrate(args: argparse.Namespace) -> None:
    if args.small:
        for name, value in SMALL.items():
            setattr(args, name, value)
    print_machine()
    start_revision = code_revision()
    spec = CompareSpec(
        rows=args.rows,
        files=args.files,
        rows_per_second=args.rows / (args.hours * 3600),
        seed=args.seed,
        resend_times=args.resend_times,
    )
    input_dir, truth = generate_compare_input(spec, args.files_per_trigger)
    if args.profile:
        variant = "dedupsink-own-time" if args.resend_times == "later" else "dedupsink"
        profile_sink(input_dir, args.files_per_trigger, truth["rows"], args.flat, variant)
        return
    resends = f"{truth['resends']:,} re-sends " + (
        f"sent {spec.resend_min_age_s / 60:.0f}-{spec.resend_max_age_s / 60:.0f} min after "
        "their original with that later time"
        if args.resend_times == "later"
        else "with their original's time"
    )
    print(
        f"input: {truth['rows']:,} rows in {args.files} files ({input_dir}), "
        f"{truth['unique_ids']:,} distinct ids, {resends}, "
        f"{truth['late']:,} very late re-sends, {truth['event_time_span_s'] / 3600:.2f} h of "
        f"event time at {spec.rows_per_second:.1f} rows/s; {args.files_per_trigger} files "
        f"({truth['window_rows']:,} rows) a micro-batch"
    )
    chosen = args.variants or ",".join(DEFAULT_VARIANTS[args.resend_times])
    variants = variant_names(chosen)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    compile_bytecode()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    load = LoadSampler().start()
    for repeat in range(args.repeats):
        for variant in variants:
            record = launch(variant, input_dir, args)
            results[variant].append(record)
            print(
                f"round {repeat + 1}/{args.repeats} {variant:<32} {record['seconds']:7.1f} s "
                f"{args.rows / record['seconds']:>10,.0f} rows/s  "
                f"CPU {record['cpu_seconds']:6.1f} s  load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    load.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"truth": truth, "results": results}, indent=1))
    revision = code_revision()
    if revision != start_revision:
        print(f"WARNING: dedupsink changed during the runs: {start_revision} -> {revision}")
    window_rows = truth["window_rows"]
    batches = f"{args.rows:,} rows, {-(-args.rows // window_rows)} batches of {window_rows:,}"
    report(results, truth, args.rows, batches)
    print()
    print(load.summary())
    within = ratio(results, "spark-within-watermark-rocksdb")
    floor = ratio(results, "floor")
    cpu_within = ratio(results, "spark-within-watermark-rocksdb", "cpu_seconds")
    cpu_floor = ratio(results, "floor", "cpu_seconds")
    if cpu_within is not None and cpu_floor is not None:
        print(
            f"the same ratios in rows per CPU-second of the process tree: vs "
            f"spark-within-watermark-rocksdb {cpu_within:.3f}, vs floor {cpu_floor:.3f}"
        )
    if within is not None:
        print(f"ratio_vs_spark_within_watermark={within:.3f}")
    own_time = ratio(results, "spark-within-watermark-rocksdb", ours="dedupsink-own-time")
    if own_time is not None:
        cpu_own_time = ratio(
            results, "spark-within-watermark-rocksdb", "cpu_seconds", ours="dedupsink-own-time"
        )
        print_unique_counts(results, truth)
        own_floor = ratio(results, "floor", ours="dedupsink-own-time")
        if own_floor is not None:
            print(f"(dedupsink-own-time against floor: {own_floor:.3f})")
        print(
            "(dedupsink-own-time against spark-within-watermark-rocksdb in rows per CPU-second "
            f"of the process tree: {cpu_own_time:.3f})"
        )
        print(f"ratio_own_time_vs_spark_within_watermark={own_time:.3f}")
    if floor is not None:
        print(f"ratio_vs_floor={floor:.3f}")
    # ratio() divides the other's measure by ours: with the floor as "ours", dedupsink's peak
    # over the floor's, round by round.
    pss_floor = ratio(results, "dedupsink", "peak_tree_pss", ours="floor")
    if pss_floor is not None:
        print(f"peak_tree_pss_vs_floor={pss_floor:.3f}")
    print_bare_ratios(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--hours", type=float, default=3.0, help="event time the stream spans")
    parser.add_argument("--files-per-trigger", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants",
        help="comma-separated; by default "
        + "; ".join(f"{shape}: {','.join(v)}" for shape, v in DEFAULT_VARIANTS.items()),
    )
    parser.add_argument(
        "--resend-times",
        choices=RESEND_TIMES,
        default="same",
        help="re-sends carry their original's event time, or a later one of their own",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="the per-window floor: 50,000 rows in 50 files, one file (1,000 rows) a batch",
    )
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--json", help="also write every run's measurements to this file")
    parser.add_argument("--profile", action="store_true", help="profile the sink's code path")
    parser.add_argument("--flat", action="store_true", help="with --profile: a flat profile")
    parser.add_argument("--keep", action="store_true", help="keep each run's output directory")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    run_main(parser, "variant", child, orchestrate)


if __name__ == "__main__":
    main()
