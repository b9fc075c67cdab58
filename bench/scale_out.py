"""Scale-out benchmark: memory and state load of the dedup sink as a machine's task slots grow.

The input is compare.py's (the same generator and cache under ``bench/.data/``): ``--rows``
rows (2,000,000) in ``--files`` Parquet files (40) over three hours of event time, 10% exact
re-sends and 0.5% very late re-sends, streamed ``--files-per-trigger`` files (2) a micro-batch
with ``trigger(availableNow=True)`` into ``format("dedup")`` for every combination of:

* the Spark master (``--masters``): ``local[1]``, ``local[2]``, ``local[4]``, each with
  ``spark.sql.shuffle.partitions`` equal to its cores;
* the mode (``--modes``): ``basic`` (``keys=id``), ``own-time`` (``keys=id``,
  ``expiryKey=event_time``, ``expiryPeriod=2 hours``, ``assumeSameExpiry=false``: hash buckets,
  each key remembering its own time) and ``time-buckets`` (``keys=id``,
  ``expiryKey=event_time``, ``expiryPeriod=1 hour``: time buckets split into key shards);
* the input partitioning (``--partitioning``): ``as-read`` (the stream as Spark reads it) and
  ``by-key`` (``dedupsink.partition_for_dedup(frame, options)`` before ``writeStream``, with
  its default number of partitions N: Spark's default parallelism, at most the key shards).

Every run is a fresh Python process in a folder of its own (so the driver and Spark's Python
workers import the installed dedupsink, not a checkout's), with ``maxCachedBuckets``
(``--max-cached-buckets``, 4096: every bucket fits), ``maxCacheMemory``
(``--max-cache-memory``, 2GB), ``numBuckets`` in the hash modes (``--num-buckets``, 64) and a
fresh ``stateCacheDir`` in the run's folder: no run maps segment copies an earlier run made.
Measured per run:

* rows/s: input rows / wall time from ``writeStream...start()`` to the return of
  ``awaitTermination()`` (as compare.py: the session and the JVM are outside the clock);
* memory: the PSS of every process of the run's tree (``common.ExecutorSampler``, read every
  second), by role. *Executor Python* is every Python process but the driver's own: the daemons
  Spark starts and the workers they fork (the tasks). Printed: the executor Python processes'
  peak summed PSS, how many were alive at that peak, the largest single one over the run, and
  the whole tree's peak PSS (the JVM included); and the peak of the tasks' own processes (the
  daemon that runs tasks and the workers it forks), without the processes Spark starts on the
  driver's behalf to create the sink and its writers, about the same size at every master;
* state, from ``dedupsink.history(output)`` after the run: the window-file bytes of the store
  and the keys it remembers (compare.py's ``dedupsink_measures``); per batch the median and max
  of ``state_loaded_max_bytes`` (the largest task's load), the median ``state_loaded_bytes``
  (all tasks'), the sum of ``state_fetched_bytes`` over the batches after the first (segments
  read from the store, no copy being on the machine: each new segment should be read about
  once, by one process), and the last window's ``state_private_bytes`` and
  ``state_mapped_bytes``; the files and bytes of the state folder at the end;
* tasks per batch: the tasks of each batch's write stage, from Spark's status tracker (the
  jobs of the query's run); for ``by-key`` runs this is the N that ``partition_for_dedup``
  chose;
* ``task load``: the largest task's load over the run / (state bytes / tasks per batch), for
  ``by-key`` runs (the target is at most 1.2: each task loads about its share of the state);
  ``balance`` is, per batch, the largest task's load over the mean task's (median over the
  batches), which does not depend on how the state grows or expires during the run;
* correctness: the ports' row counts against the generator's truth.

The table has a row per run. The last lines are machine-readable:
``pss_ratio_local<hi>_vs_local<lo>[mode,partitioning]=<x>``, the executor Python peak PSS at
the most cores run over the fewest (the target for local[4] over local[1] is at most 1.5), and
``task_pss_ratio_...``, the same for the tasks' processes alone, and
``task_load_ratio[mode,local<n>]=<x>`` and ``balance[mode,local<n>]=<x>`` for each ``by-key``
run. ``task load`` divides bytes of mapped keys by bytes of window files, two encodings of the
same keys (at ``local[1]``, one task loading every bucket, it reads about 0.55 in Basic Dedup):
``balance`` compares like with like. ``--json FILE`` writes every run's record.

Usage: ``python bench/scale_out.py [--rows N] [--masters local[1],local[4]] [--modes basic]
[--partitioning by-key]``; ``--rows 200000 --masters local[1],local[2] --modes basic`` is a
quick check (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    DATA_DIR,
    RESULT_PREFIX,
    CompareSpec,
    ExecutorSampler,
    LoadSampler,
    code_revision,
    dir_bytes,
    generate_compare_input,
    local_session_builder,
    median,
    print_machine,
    run_child,
    run_main,
    time_stream,
)
from compare import PORTS, SINK_OPTIONS, compile_bytecode, dedupsink_measures, role_sizes

MASTERS = ("local[1]", "local[2]", "local[4]")
MODE_OPTIONS = {
    "basic": {"keys": "id"},
    "own-time": SINK_OPTIONS["dedupsink-own-time"],
    "time-buckets": SINK_OPTIONS["dedupsink"],
}
HASH_MODES = ("basic", "own-time")
PARTITIONINGS = ("as-read", "by-key")
MB = 2**20


# -- one run, in its own process -------------------------------------------------------------


def cores_of(master: str) -> int:
    """The task slots of a local master: ``local`` 1, ``local[N]`` N, ``local[*]`` the CPUs."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)\])?", master)
    if found is None:
        raise SystemExit(f"not a local master: {master}")
    slots = found.group(1) or "1"
    return (os.cpu_count() or 1) if slots == "*" else int(slots)


def sink_options(args: argparse.Namespace, output: Path, state_folder: Path) -> dict[str, str]:
    options = {
        "path": str(output),
        **MODE_OPTIONS[args.one_mode],
        "maxCachedBuckets": str(args.max_cached_buckets),
        "maxCacheMemory": args.max_cache_memory,
        "stateCacheDir": str(state_folder),
    }
    if args.one_mode in HASH_MODES:
        options["numBuckets"] = str(args.num_buckets)
    return options


def write_tasks(spark: Any, run_id: str) -> list[int]:
    """The tasks of each batch's write, oldest first, from the jobs of a streaming query's run
    (Spark's status tracker): a job's last stage. A ``by-key`` batch runs two jobs, the
    shuffle's map stage alone and then the write, whose job lists that stage again (skipped):
    where any job has more than one stage, the jobs of one stage are the shuffles'."""
    tracker = spark.sparkContext.statusTracker()
    stages = []
    for job in sorted(tracker.getJobIdsForGroup(run_id)):
        info = tracker.getJobInfo(job)
        if info is not None and len(list(info.stageIds)):
            stages.append(sorted(info.stageIds))
    if any(len(ids) > 1 for ids in stages):
        stages = [ids for ids in stages if len(ids) > 1]
    found = (tracker.getStageInfo(ids[-1]) for ids in stages)
    return [stage.numTasks for stage in found if stage is not None]


def state_use(output: Path) -> dict[str, Any]:
    """The state the windows' tasks used, from the store's history."""
    import dedupsink

    history = dedupsink.history(str(output))
    column = {name: history.column(name).to_pylist() for name in history.column_names}
    loaded = [v or 0 for v in column["state_loaded_bytes"]]
    loaded_max = [v or 0 for v in column["state_loaded_max_bytes"]]
    return {
        "history_windows": history.num_rows,
        "loaded_bytes": loaded,
        "loaded_max_bytes": loaded_max,
        "fetched_bytes": [v or 0 for v in column["state_fetched_bytes"]],
        "private_bytes": column["state_private_bytes"][-1] or 0,
        "mapped_bytes": column["state_mapped_bytes"][-1] or 0,
        "keys_remembered": column["keys_remembered"][-1],
    }


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Stream the input through the sink once, as this run's arguments say, and measure it."""
    import dedupsink

    work = Path(args.work)
    cores = cores_of(args.one_master)
    sampler = ExecutorSampler(pss_every=5)
    sampler.start()
    conf = {"spark.driver.memory": args.driver_memory, "spark.sql.shuffle.partitions": str(cores)}
    spark = (
        local_session_builder(f"bench-scale-out-{args.one_mode}", conf)
        .master(args.one_master)
        .config("spark.sql.streaming.stopTimeout", "60s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    input_dir = Path(args.input)
    schema = spark.read.parquet(str(next(input_dir.glob("*.parquet")))).schema
    output, checkpoint, state_folder = work / "out", work / "checkpoint", work / "state"
    options = sink_options(args, output, state_folder)
    frame = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", args.files_per_trigger)
        .parquet(str(input_dir))
    )
    if args.one_partitioning == "by-key":
        frame = dedupsink.partition_for_dedup(frame, options)
    writer = (
        frame.writeStream.format("dedup")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    timed = time_stream(writer, sampler)
    tasks = write_tasks(spark, str(timed.query.runId))
    record: dict[str, Any] = {
        "master": args.one_master,
        "cores": cores,
        "mode": args.one_mode,
        "partitioning": args.one_partitioning,
        "options": options,
        "default_parallelism": spark.sparkContext.defaultParallelism,
        "pyspark_python": os.environ.get("PYSPARK_PYTHON", ""),
        "dedupsink_imported_from": str(Path(dedupsink.__file__).parent),
        "seconds": timed.seconds,
        "cpu_seconds": timed.cpu_seconds,
        "batches": len(timed.progress),
        "batch_tasks": tasks,
        "peak_tree_pss": sampler.peak_pss,
        "peak_executor_pss": sampler.peak_executor,
        "peak_executor_roles": sampler.peak_executor_roles,
        "peak_executor_python": len(sampler.peak_executor_roles),
        "most_executor_python": sampler.most_executors,
        "largest_executor_pss": sampler.largest_executor,
        "peak_task_pss": sampler.peak_tasks,
        "end_roles": sampler.end_roles,
    }
    spark.stop()
    record |= dedupsink_measures(output)
    record |= state_use(output)
    record["state_folder_files"], record["state_folder_bytes"] = dir_bytes(state_folder)
    return record


def child(args: argparse.Namespace) -> None:
    print(RESULT_PREFIX + json.dumps(run_one(args)), flush=True)


# -- the orchestrator -------------------------------------------------------------------------


def launch(
    master: str, mode: str, partitioning: str, input_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    options = ["--one-master", master, "--one-mode", mode, "--one-partitioning", partitioning]
    options += ["--input", str(input_dir), "--files-per-trigger", str(args.files_per_trigger)]
    options += ["--driver-memory", args.driver_memory]
    options += ["--max-cache-memory", args.max_cache_memory]
    options += ["--max-cached-buckets", str(args.max_cached_buckets)]
    options += ["--num-buckets", str(args.num_buckets)]
    name = f"{mode}-{partitioning}-local{cores_of(master)}"
    return run_child(__file__, name, options, DATA_DIR / "runs", args.keep)


def derive(record: dict[str, Any], rows: int) -> None:
    """The figures of the table, from a run's raw record (added to it)."""
    tasks = record["batch_tasks"]
    record["rows_per_s"] = rows / record["seconds"]
    record["tasks_per_batch"] = max(set(tasks), key=tasks.count) if tasks else 0
    with_state = [
        (total, largest)
        for total, largest in zip(record["loaded_bytes"], record["loaded_max_bytes"], strict=True)
        if total
    ]
    largest = [m for _, m in with_state]
    record["loaded_max_median"] = median(largest) if largest else 0.0
    record["loaded_max_max"] = max(largest, default=0)
    record["loaded_median"] = median([t for t, _ in with_state]) if with_state else 0.0
    record["fetched_after_first"] = sum(record["fetched_bytes"][1:])
    record["task_load_ratio"] = None
    record["balance"] = None
    n = record["tasks_per_batch"]
    if record["state_bytes"] and n:
        record["task_load_ratio"] = record["loaded_max_max"] / (record["state_bytes"] / n)
    if len(tasks) == len(record["loaded_bytes"]) and with_state:
        record["balance"] = median(
            [
                m / (t / k)
                for t, m, k in zip(
                    record["loaded_bytes"], record["loaded_max_bytes"], tasks, strict=True
                )
                if t
            ]
        )


def expected_ports(mode: str, truth: dict[str, Any]) -> dict[str, int] | None:
    if mode == "basic":  # nothing expires: every copy after an id's first is a duplicate
        duplicates = truth["rows"] - truth["unique_ids"]
        return {"unique": truth["unique_ids"], "duplicate": duplicates, "expired": 0, "error": 0}
    return truth["expected_own_time_ports" if mode == "own-time" else "expected_dedup_ports"]


def check(record: dict[str, Any], truth: dict[str, Any]) -> str:
    ports = {port: record[f"port_{port}"] for port in PORTS}
    expected = expected_ports(record["mode"], truth)
    if expected is None:
        return "?"
    return "ok" if ports == expected and record["out_rows"] == record["out_distinct"] else "BAD"


def megabytes(value: float) -> str:
    return f"{value / MB:,.1f}"


COLUMNS = (
    ("master", 9, lambda r: r["master"]),
    ("mode", 13, lambda r: r["mode"]),
    ("input", 8, lambda r: r["partitioning"]),
    ("tasks", 6, lambda r: str(r["tasks_per_batch"])),
    ("s", 7, lambda r: f"{r['seconds']:.1f}"),
    ("rows/s", 9, lambda r: f"{r['rows_per_s']:,.0f}"),
    ("exec py PSS", 12, lambda r: megabytes(r["peak_executor_pss"])),
    ("task py", 8, lambda r: megabytes(r["peak_task_pss"])),
    ("#py", 4, lambda r: str(r["peak_executor_python"])),
    ("largest", 8, lambda r: megabytes(r["largest_executor_pss"])),
    ("tree PSS", 9, lambda r: megabytes(r["peak_tree_pss"])),
    ("state MB", 9, lambda r: megabytes(r["state_bytes"])),
    ("keys", 10, lambda r: f"{r['state_keys']:,}"),
    ("ldmax med", 10, lambda r: megabytes(r["loaded_max_median"])),
    ("ldmax max", 10, lambda r: megabytes(r["loaded_max_max"])),
    ("ld med", 8, lambda r: megabytes(r["loaded_median"])),
    ("fetched", 8, lambda r: megabytes(r["fetched_after_first"])),
    ("private", 8, lambda r: megabytes(r["private_bytes"])),
    ("mapped", 8, lambda r: megabytes(r["mapped_bytes"])),
    ("load/share", 11, lambda r: _ratio_text(r["task_load_ratio"])),
    ("balance", 8, lambda r: _ratio_text(r["balance"])),
    ("ports", 6, lambda r: r["ports"]),
)


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(records: list[dict[str, Any]]) -> None:
    header = "".join(f"{name:>{width}} " for name, width, _ in COLUMNS)
    print(header)
    print("-" * len(header))
    for record in records:
        print("".join(f"{show(record):>{width}} " for _, width, show in COLUMNS))
    print(
        "(MB = 2^20 bytes. exec py PSS: the peak summed PSS of the Python processes but the "
        "driver's; task py: the peak of the task daemon and its workers alone; #py: the Python "
        "processes alive at the exec py peak; largest: the largest single one over the run; "
        "tree PSS: the whole tree's peak, JVM included. state MB: the store's window files; "
        "ldmax: the largest task's state load per batch, ld med: all tasks' (median); fetched: "
        "read from the store after the first batch; private/mapped: the last window's; "
        "load/share: ldmax max / (state MB / tasks); balance: the largest task's load / the "
        "mean task's, median over batches)"
    )


def print_roles(records: list[dict[str, Any]]) -> None:
    print("executor Python processes at their peak, PSS by role (MB):")
    for record in records:
        sizes = role_sizes(record["peak_executor_roles"])
        shown = ", ".join(f"{label} {megabytes(size)}" for label, size in sizes.items())
        print(f"  {record['master']} {record['mode']} {record['partitioning']}: {shown}")


def print_ratios(records: list[dict[str, Any]]) -> None:
    by_run = {(r["mode"], r["partitioning"], r["cores"]): r for r in records}
    cores = sorted({r["cores"] for r in records})
    if len(cores) > 1:
        low, high = cores[0], cores[-1]
        for measure, name in (
            ("peak_executor_pss", "pss_ratio"),
            ("peak_task_pss", "task_pss_ratio"),
        ):
            for mode, partitioning, slots in by_run:
                if slots != high or (mode, partitioning, low) not in by_run:
                    continue
                ratio = (
                    by_run[(mode, partitioning, high)][measure]
                    / by_run[(mode, partitioning, low)][measure]
                )
                print(f"{name}_local{high}_vs_local{low}[{mode},{partitioning}]={ratio:.3f}")
    for measure in ("task_load_ratio", "balance"):
        for record in records:
            if record["partitioning"] == "by-key" and record[measure] is not None:
                print(f"{measure}[{record['mode']},local{record['cores']}]={record[measure]:.3f}")


def chosen(text: str, known: tuple[str, ...], what: str) -> list[str]:
    values = [v for v in text.split(",") if v]
    unknown = [v for v in values if v not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return values


def orchestrate(args: argparse.Namespace) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    print_machine()
    print(f"PYSPARK_PYTHON={os.environ['PYSPARK_PYTHON']}")
    start_revision = code_revision()
    masters = [m for m in args.masters.split(",") if m]
    for master in masters:
        cores_of(master)
    modes = chosen(args.modes, tuple(MODE_OPTIONS), "modes")
    partitionings = chosen(args.partitioning, PARTITIONINGS, "partitionings")
    spec = CompareSpec(
        rows=args.rows, files=args.files, rows_per_second=args.rows / (args.hours * 3600)
    )
    input_dir, truth = generate_compare_input(spec, args.files_per_trigger)
    print(
        f"input: {truth['rows']:,} rows in {args.files} files ({input_dir}), "
        f"{truth['unique_ids']:,} distinct ids; {args.files_per_trigger} files "
        f"({truth['window_rows']:,} rows) a micro-batch; maxCacheMemory {args.max_cache_memory}, "
        f"maxCachedBuckets {args.max_cached_buckets}, numBuckets {args.num_buckets} (hash modes)"
    )
    compile_bytecode()
    records = []
    load = LoadSampler().start()
    # The masters innermost: the runs a ratio divides follow each other.
    for mode in modes:
        for partitioning in partitionings:
            for master in masters:
                record = launch(master, mode, partitioning, input_dir, args)
                derive(record, truth["rows"])
                record["ports"] = check(record, truth)
                records.append(record)
                tasks = sorted(set(record["batch_tasks"]))
                print(
                    f"{master:<9} {mode:<13} {partitioning:<8} {record['seconds']:6.1f} s "
                    f"{record['rows_per_s']:>9,.0f} rows/s  tasks a batch {tasks} "
                    f"(default parallelism {record['default_parallelism']})  executor Python "
                    f"peak {megabytes(record['peak_executor_pss'])} MB  ports {record['ports']}  "
                    f"load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
    load.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"truth": truth, "records": records}, indent=1))
    revision = code_revision()
    if revision != start_revision:
        print(f"WARNING: dedupsink changed during the runs: {start_revision} -> {revision}")
    first = records[0]
    print(
        f"workers' python: {first['pyspark_python']}; dedupsink imported from "
        f"{first['dedupsink_imported_from']}"
    )
    for record in records:
        if record["partitioning"] == "by-key":
            print(
                f"partition_for_dedup's N at {record['master']} ({record['mode']}): "
                f"{record['tasks_per_batch']} (Spark's default parallelism "
                f"{record['default_parallelism']})"
            )
    print()
    print_table(records)
    print()
    print_roles(records)
    print()
    print(load.summary())
    print_ratios(records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--hours", type=float, default=3.0, help="event time the stream spans")
    parser.add_argument("--files-per-trigger", type=int, default=2)
    parser.add_argument("--masters", default=",".join(MASTERS), help="comma-separated")
    parser.add_argument("--modes", default=",".join(MODE_OPTIONS), help="comma-separated")
    parser.add_argument("--partitioning", default=",".join(PARTITIONINGS), help="comma-separated")
    parser.add_argument("--max-cache-memory", default="2GB")
    parser.add_argument("--max-cached-buckets", type=int, default=4096)
    parser.add_argument("--num-buckets", type=int, default=64, help="hash modes only")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--json", help="also write every run's record to this file")
    parser.add_argument("--keep", action="store_true", help="keep each run's folder")
    parser.add_argument("--one-master", help=argparse.SUPPRESS)
    parser.add_argument("--one-mode", choices=tuple(MODE_OPTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--one-partitioning", choices=PARTITIONINGS, help=argparse.SUPPRESS)
    run_main(parser, "one_mode", child, orchestrate)


if __name__ == "__main__":
    main()
