"""Output formats: the same stream through ``outputFormat`` parquet, delta and iceberg.

Three parts, in one run:

1. **Spark, local disk.** The compare input (``common.CompareSpec``: 36-character UUID ids, an
   event time, a user, an amount, an ~80-character payload; 10% re-sends within ~5,000 rows,
   0.5% very late ones), ``--rows`` rows in ``2 x --batches`` files, streamed with Spark
   ``local[2]``, ``maxFilesPerTrigger=2`` and ``trigger(availableNow=True)`` into
   ``format("dedup")`` (``keys=id``, ``expiryKey=event_time``, ``expiryPeriod=1 hour``, as
   ``compare.py``'s ``dedupsink``) with ``outputFormat`` parquet, delta and iceberg. Every run is
   a fresh process (this script with ``--format``), the formats interleaved within a round (each
   round starting with the next format) and the round repeated ``--repeats`` times. Per run:
   rows/s over the whole run (``start()`` to the return of ``awaitTermination()``, as in
   ``compare.py``) and after the first micro-batch
   (the rows of the other batches over their ``triggerExecution``: the first carries the start
   of Spark's Python processes and the format's imports), CPU seconds of the process tree, and
   the ports' rows read back through each format's own reader (Delta log, Iceberg snapshot),
   checked against the generator's truth.
2. **The sink's code path without Spark, local disk** (``LocalSink``, in this process): the same
   input's windows, two tasks each (one per file), then the commit; per format the median task
   and commit time per window after the first, and how much of the commit is the format's
   ``publish`` (timed by wrapping the port format's method in this process). This is where a
   format's cost per window shows without Spark's noise.
3. **S3** (moto's S3 server on 127.0.0.1, counting every request by kind: ``tests/servers.py``).
   ``--s3-windows`` windows of ``--s3-rows`` rows (``s3_requests.window_table``: all four
   ports get rows) through ``LocalSink`` per format, two tasks per window, into a fresh prefix:
   the same tasks and commit Spark runs, one after the other. A window's requests are those sent
   between the start of its first task and the end of its commit (its publication and clean-up
   included); bytes copied are the sizes of the objects each 2xx ``CopyObject`` wrote (the
   sources' sizes). Iceberg on S3 uses an SQLite catalog file on the local disk
   (``iceberg.catalog.type=sql``), whose reads and writes are not S3 requests. The first
   ``--s3-warmup`` windows are left out of the medians.

The last lines are machine-readable: ``ratio_<format>_vs_parquet=<x>`` (median over the rounds
of the format's rows/s over parquet's in the same round), the same after the first batch
(``..._after_first``), ``s3_requests_per_window_<format>=<median>`` and
``s3_copied_bytes_per_window_<format>=<median>``.

Usage: ``python bench/formats.py [--rows N] [--batches N] [--repeats N] [--formats a,b]
[--s3-windows N] [--no-spark] [--no-s3] [--profile FORMAT]``; ``--profile FORMAT`` runs part 2
for that format under pyinstrument and prints the profile. ``--rows 200000 --batches 8
--repeats 1`` is a quick check.
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

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))

from common import (  # noqa: E402
    DATA_DIR,
    RESULT_PREFIX,
    CompareSpec,
    LoadSampler,
    TreeSampler,
    code_revision,
    generate_compare_input,
    local_session_builder,
    median,
    print_machine,
    python_bare_source,
    run_child,
    run_main,
    time_stream,
)
from compare import SINK_OPTIONS, compile_bytecode, progress_durations  # noqa: E402

FORMATS = ("parquet", "delta", "iceberg")
PORTS = ("unique", "duplicate", "expired", "error")
OPTIONS = SINK_OPTIONS["dedupsink"]
FILES_PER_TRIGGER = 2
TARGET = 0.9


def compare_spec(args: argparse.Namespace) -> CompareSpec:
    """The compare input's shape over three hours of event time, whatever the row count (as
    ``compare.py``: expiry still evicts, very late rows still exist)."""
    return CompareSpec(
        rows=args.rows, files=FILES_PER_TRIGGER * args.batches, rows_per_second=args.rows / 10_800
    )


# -- part 1: one format with Spark, in its own process ----------------------------------------


def run_format(fmt: str, input_dir: Path, work: Path, driver_memory: str) -> dict[str, Any]:
    """Stream the input into ``format("dedup")`` with ``outputFormat=fmt``; a JSON-able record."""
    sampler = TreeSampler().start()
    spark = (
        local_session_builder(f"bench-formats-{fmt}", {"spark.driver.memory": driver_memory})
        .config("spark.sql.streaming.stopTimeout", "60s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(next(input_dir.glob("*.parquet")))).schema
    # As compare.py: the session's discovery of installed Python data sources, outside the clock.
    spark.dataSource.register(python_bare_source())
    output = work / "out"
    writer = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", FILES_PER_TRIGGER)
        .parquet(str(input_dir))
        .writeStream.format("dedup")
        .options(**OPTIONS)
        .option("outputFormat", fmt)
        .option("path", str(output))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
    )
    timed = time_stream(writer, sampler)
    query, seconds, progress = timed.query, timed.seconds, timed.progress
    record: dict[str, Any] = {
        "format": fmt,
        "seconds": seconds,
        "cpu_seconds": timed.cpu_seconds,
        "peak_tree_rss": sampler.peak_total,
        "batches": len(progress),
        "batch_rows": [int(p["numInputRows"]) for p in progress],
        "batch_ms": [int(p.get("durationMs", {}).get("triggerExecution", 0)) for p in progress],
        "add_batch_ms": [int(p.get("durationMs", {}).get("addBatch", 0)) for p in progress],
        "duration_ms": progress_durations(query.recentProgress),
    }
    spark.stop()
    record["ports"] = port_rows(fmt, output)
    return record


def port_rows(fmt: str, output: Path) -> dict[str, Any]:
    """Rows per port as each format's own reader sees them, and the unique port's distinct ids."""
    import pyarrow.compute as pc

    found: dict[str, Any] = {}
    for port in PORTS:
        ids = read_port_ids(fmt, output, port)
        found[port] = ids.num_rows
        if port == "unique":
            found["unique_distinct"] = pc.count_distinct(ids["id"]).as_py()
    return found


def read_port_ids(fmt: str, output: Path, port: str) -> Any:
    import pyarrow as pa
    import pyarrow.dataset as ds

    if fmt == "delta":
        from deltalake import DeltaTable

        return DeltaTable(str(output / port)).to_pyarrow_dataset().to_table(columns=["id"])
    if fmt == "iceberg":
        from pyiceberg.catalog import load_catalog

        from dedupsink.ports.iceberg import CATALOG_FILE, CATALOG_NAME_DEFAULT

        catalog = load_catalog(
            CATALOG_NAME_DEFAULT,
            type="sql",
            uri=f"sqlite:///{output}/{CATALOG_FILE}",
            warehouse=f"file://{output}",
        )
        table = catalog.load_table(("dedup", f"{output.name}_{port}"))
        if table.current_snapshot() is None:
            return pa.table({"id": pa.array([], pa.string())})
        return table.scan(selected_fields=("id",)).to_arrow()
    # Parquet ports: the files Spark's sink log names, as Spark would read them; pyarrow lists
    # the folder (only files of committed windows ever arrive there).
    folder = output / port
    if not any(folder.glob("*.parquet")):
        return pa.table({"id": pa.array([], pa.string())})
    return ds.dataset(str(folder), format="parquet").to_table(columns=["id"])


def child(args: argparse.Namespace) -> None:
    record = run_format(args.format, Path(args.input), Path(args.work), args.driver_memory)
    print(RESULT_PREFIX + json.dumps(record), flush=True)


def launch(fmt: str, input_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    options = ["--format", fmt, "--input", str(input_dir), "--driver-memory", args.driver_memory]
    return run_child(__file__, f"format-{fmt}", options, DATA_DIR / "runs", args.keep)


def after_first(record: dict[str, Any]) -> float:
    """Rows/s of the micro-batches after the first, over their ``triggerExecution``."""
    rows, ms = sum(record["batch_rows"][1:]), sum(record["batch_ms"][1:])
    return rows / (ms / 1000) if ms else float("nan")


def check(record: dict[str, Any], truth: dict[str, Any]) -> str:
    ports = record["ports"]
    expected = truth["expected_dedup_ports"]
    shown = {p: ports[p] for p in PORTS}
    ok = shown == expected and ports["unique_distinct"] == ports["unique"]
    text = " ".join(f"{p}={ports[p]:,}" for p in PORTS)
    wanted = " ".join(f"{p}={expected[p]:,}" for p in PORTS)
    return f"{'ok' if ok else 'MISMATCH'}: {text} (expected {wanted})"


def ratios(results: dict[str, list[dict[str, Any]]], fmt: str, rate: Any) -> list[float]:
    """Per round: ``fmt``'s rate over parquet's."""
    pairs = zip(results[fmt], results["parquet"], strict=False)
    return [rate(mine) / rate(base) for mine, base in pairs]


def whole(record: dict[str, Any]) -> float:
    return sum(record["batch_rows"]) / record["seconds"]


def spark_part(args: argparse.Namespace, formats: list[str]) -> dict[str, float]:
    spec = compare_spec(args)
    input_dir, truth = generate_compare_input(spec, FILES_PER_TRIGGER)
    print(
        f"input: {truth['rows']:,} rows in {spec.files} files ({input_dir}), "
        f"{truth['unique_ids']:,} distinct ids, {truth['resends']:,} re-sends, "
        f"{truth['late']:,} very late; {FILES_PER_TRIGGER} files ({truth['window_rows']:,} "
        f"rows) a micro-batch"
    )
    compile_bytecode()
    results: dict[str, list[dict[str, Any]]] = {f: [] for f in formats}
    load = LoadSampler().start()
    for repeat in range(args.repeats):
        # Each round starts with the next format: no format always runs first (or last).
        for fmt in formats[repeat % len(formats) :] + formats[: repeat % len(formats)]:
            record = launch(fmt, input_dir, args)
            results[fmt].append(record)
            print(
                f"round {repeat + 1}/{args.repeats} {fmt:<8} {record['seconds']:6.1f} s "
                f"{whole(record):>9,.0f} rows/s, after the first batch {after_first(record):>9,.0f}"
                f" rows/s  CPU {record['cpu_seconds']:5.1f} s  load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    load.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"truth": truth, "results": results}, indent=1))
    print()
    header = (
        f"{'format':<9}{'rows/s':>10}{'after 1st':>11}{'CPU s':>7}{'1st batch s':>12}"
        f"{'others ms (median)':>19}{'peak RSS':>10}   rounds rows/s"
    )
    print(header)
    print("-" * len(header))
    for fmt, records in results.items():
        rounds = " ".join(f"{whole(r):,.0f}" for r in records)
        first = median([r["batch_ms"][0] / 1000 for r in records])
        others = median([median(r["batch_ms"][1:]) for r in records])
        print(
            f"{fmt:<9}{median([whole(r) for r in records]):>10,.0f}"
            f"{median([after_first(r) for r in records]):>11,.0f}"
            f"{median([r['cpu_seconds'] for r in records]):>7.1f}{first:>12.1f}{others:>19,.0f}"
            f"{median([r['peak_tree_rss'] for r in records]) / 2**20:>7,.0f} MB   {rounds}"
        )
    print("(rows/s and after 1st: medians over the rounds; 1st batch and others: Spark's")
    print(" triggerExecution; CPU: user + system of the process tree; peak RSS: the tree's sum)")
    print()
    print("correctness (every run, ports read back through the format's reader):")
    for fmt, records in results.items():
        for index, record in enumerate(records):
            print(f"  {fmt} #{index + 1}: {check(record, truth)}")
    print()
    print(load.summary())
    out: dict[str, float] = {}
    for fmt in formats:
        if fmt == "parquet" or "parquet" not in results:
            continue
        per_round = ratios(results, fmt, whole)
        later = ratios(results, fmt, after_first)
        cpu = ratios(results, fmt, lambda r: 1 / r["cpu_seconds"])
        out[f"ratio_{fmt}_vs_parquet"] = median(per_round)
        out[f"ratio_{fmt}_vs_parquet_after_first"] = median(later)
        print(
            f"{fmt} / parquet: whole run {median(per_round):.3f} (rounds "
            f"{', '.join(f'{x:.3f}' for x in per_round)}), after the first batch "
            f"{median(later):.3f} ({', '.join(f'{x:.3f}' for x in later)}), per CPU-second "
            f"{median(cpu):.3f}; target {TARGET}"
        )
    return out


# -- part 2: the sink's code path without Spark ----------------------------------------------


class PublishTimer:
    """Times a port format's ``publish`` in this process (wraps the class's method)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.seconds: list[float] = []
        self._original = cls.publish

    def __enter__(self) -> PublishTimer:
        original, spent = self._original, self.seconds

        def timed(ports: Any, publication: Any, store_id: str) -> None:
            tick = time.perf_counter()
            try:
                original(ports, publication, store_id)
            finally:
                spent.append(time.perf_counter() - tick)

        self.cls.publish = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.publish = self._original


def format_class(fmt: str) -> type:
    from dedupsink.ports.formats import FORMATS as PORT_FORMATS

    return PORT_FORMATS[fmt]


def sink_path(fmt: str, tables: list[Any], options: dict[str, str]) -> dict[str, list[float]]:
    """Each window's tasks (one per table of the window) and commit through ``LocalSink``;
    seconds per window of tasks, commit and publish."""
    from dedupsink.sink.local import LocalSink

    sink = LocalSink({**options, "outputFormat": fmt}, tables[0][0].schema, query_id=f"b-{fmt}")
    timings: dict[str, list[float]] = {"tasks": [], "commit": [], "publish": []}
    with PublishTimer(format_class(fmt)) as timer:
        for batch_id, window in enumerate(tables):
            tick = time.perf_counter()
            summaries = [
                sink.task(batch_id, partition, table.to_batches(max_chunksize=10_000))
                for partition, table in enumerate(window)
            ]
            tasks = time.perf_counter() - tick
            published = len(timer.seconds)
            tick = time.perf_counter()
            sink.commit(batch_id, summaries)
            timings["commit"].append(time.perf_counter() - tick)
            timings["tasks"].append(tasks)
            timings["publish"].append(sum(timer.seconds[published:]))
    return timings


def local_windows(args: argparse.Namespace) -> list[list[Any]]:
    import pyarrow.parquet as pq

    spec = compare_spec(args)
    input_dir, _ = generate_compare_input(spec, FILES_PER_TRIGGER)
    files = sorted(input_dir.glob("*.parquet"))
    tables = [pq.read_table(f) for f in files]
    return [tables[i : i + FILES_PER_TRIGGER] for i in range(0, len(tables), FILES_PER_TRIGGER)]


def sink_path_part(args: argparse.Namespace, formats: list[str]) -> None:
    windows = local_windows(args)
    rows = sum(t.num_rows for w in windows for t in w)
    print(
        f"{len(windows)} windows of {FILES_PER_TRIGGER} tasks, {rows:,} rows, in this process "
        "(LocalSink), seconds per window after the first (median; max in brackets):"
    )
    print(
        f"{'format':<9}{'rows/s':>10}{'tasks':>15}{'commit':>15}{'publish':>15}{'1st commit':>12}"
    )
    for fmt in formats:
        work = Path(tempfile.mkdtemp(prefix=f"sinkpath-{fmt}-", dir=DATA_DIR))
        try:
            started = time.perf_counter()
            t = sink_path(fmt, windows, {"path": str(work / "out"), **OPTIONS})
            total = time.perf_counter() - started
        finally:
            shutil.rmtree(work, ignore_errors=True)

        def cell(values: list[float]) -> str:
            return f"{median(values[1:]) * 1000:7.1f} ({max(values[1:]) * 1000:4.0f})"

        print(
            f"{fmt:<9}{rows / total:>10,.0f}{cell(t['tasks']):>15}{cell(t['commit']):>15}"
            f"{cell(t['publish']):>15}{t['commit'][0]:>11.2f}s",
            flush=True,
        )
    print("(ms; publish is part of commit; the first commit creates the tables)")


def profile_part(args: argparse.Namespace, fmt: str) -> None:
    from pyinstrument import Profiler

    windows = local_windows(args)
    work = Path(tempfile.mkdtemp(prefix=f"profile-{fmt}-", dir=DATA_DIR))
    profiler = Profiler(interval=0.001)
    try:
        # A first window elsewhere (imports, the catalog's engine) outside the profile.
        sink_path(fmt, windows[:1], {"path": str(work / "warm"), **OPTIONS})
        profiler.start()
        t = sink_path(fmt, windows, {"path": str(work / "out"), **OPTIONS})
        profiler.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{fmt}: tasks {sum(t['tasks']):.2f} s, commits {sum(t['commit']):.2f} s, of which "
        f"publish {sum(t['publish']):.2f} s, over {len(windows)} windows"
    )
    print(profiler.output_text(unicode=False, color=False, show_all=False))


# -- part 3: requests per window on S3 --------------------------------------------------------


def s3_part(args: argparse.Namespace, formats: list[str]) -> dict[str, float]:
    import s3_requests
    from servers import KINDS, S3Server

    from dedupsink.sink.local import deal

    rng = np.random.default_rng(42)
    recent = np.array([], dtype=object)
    tables = []
    for window in range(args.s3_windows):
        table = s3_requests.window_table(rng, window, args.s3_rows, recent)
        tables.append(table)
        recent = np.array(table.column("id").drop_null().to_pylist()[-2000:], dtype=object)
    out: dict[str, float] = {}
    server = S3Server().start()
    scratch = Path(tempfile.mkdtemp(prefix="formats-s3-", dir=DATA_DIR))
    try:
        fs = server.remote().fs()
        summary = []
        for fmt in formats:
            remote = server.remote(f"formats-{fmt}")
            options = {"path": remote.url, **OPTIONS, **remote.sink_options, "outputFormat": fmt}
            if fmt == "iceberg":
                options |= {
                    "iceberg.catalog.type": "sql",
                    "iceberg.catalog.uri": f"sqlite:///{scratch}/{fmt}-catalog.db",
                    "iceberg.catalog.warehouse": remote.url,
                }
            from dedupsink.sink.local import LocalSink

            sink = LocalSink(options, tables[0].schema, query_id=f"s3-{fmt}")
            windows = []
            for batch_id, table in enumerate(tables):
                first = len(server.requests())
                tick = time.perf_counter()
                summaries = [
                    sink.task(batch_id, p, deal(table, p, 2).to_batches()) for p in range(2)
                ]
                sink.commit(batch_id, summaries)
                seconds = time.perf_counter() - tick
                requests = server.requests()[first:]
                kinds = {kind: 0 for kind in KINDS}
                for request in requests:
                    kinds[request.kind] += 1
                copied = 0
                for request in requests:
                    if request.kind == "COPY" and 200 <= request.status < 300:
                        copied += fs.info(f"{server.bucket}/{request.key}")["size"]
                if batch_id in args.s3_list:
                    for request in requests:
                        print(f"  {fmt} window {batch_id}: {request.kind} {request.op} "
                              f"{request.key} {request.status}")  # fmt: skip
                windows.append({"window": batch_id, **kinds, "copied": copied, "s": seconds})
            summary.append((fmt, windows))
        shown = [k for k in KINDS if any(w[k] for _, ws in summary for w in ws)]
        steady_from = args.s3_warmup
        print(
            f"{args.s3_windows} windows of {args.s3_rows:,} rows, 2 tasks each; medians over "
            f"windows {steady_from}-{args.s3_windows - 1} (max total in brackets):"
        )
        header = (
            f"{'format':<9}" + "".join(f"{k:>7}" for k in shown) + f"{'total':>13}"
            f"{'copied B':>12}{'window ms':>11}"
        )
        print(header)
        print("-" * len(header))
        for fmt, windows in summary:
            steady = windows[steady_from:]
            totals = [sum(w[k] for k in KINDS) for w in steady]
            copied = median([w["copied"] for w in steady])
            cells = "".join(f"{median([w[k] for w in steady]):>7g}" for k in shown)
            total_cell = f"{median(totals):g} ({max(totals)})"
            print(
                f"{fmt:<9}{cells}{total_cell:>13}{copied:>12,.0f}"
                f"{median([w['s'] for w in steady]) * 1000:>11,.0f}"
            )
            out[f"s3_requests_per_window_{fmt}"] = median(totals)
            out[f"s3_copied_bytes_per_window_{fmt}"] = copied
        if args.s3_verbose:
            for fmt, windows in summary:
                for w in windows:
                    counts = " ".join(f"{k} {w[k]}" for k in shown)
                    print(f"  {fmt} window {w['window']}: {counts}, copied {w['copied']:,}")
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


# -- the orchestrator -------------------------------------------------------------------------


def orchestrate(args: argparse.Namespace) -> None:
    formats = [f for f in args.formats.split(",") if f]
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise SystemExit(f"unknown formats {sorted(unknown)}; known: {', '.join(FORMATS)}")
    if args.profile:
        profile_part(args, args.profile)
        return
    print_machine()
    start_revision = code_revision()
    started = time.perf_counter()
    figures: dict[str, float] = {}
    if not args.no_spark:
        print("\n== 1. Spark local[2], local disk ==")
        figures |= spark_part(args, formats)
    if not args.no_sink_path:
        print("\n== 2. the sink's code path without Spark, local disk ==")
        sink_path_part(args, formats)
    if not args.no_s3:
        print("\n== 3. S3 (moto), requests per steady window ==")
        figures |= s3_part(args, formats)
    revision = code_revision()
    if revision != start_revision:
        print(f"WARNING: dedupsink changed during the runs: {start_revision} -> {revision}")
    print(f"\n(whole script {time.perf_counter() - started:.0f} s)")
    for name, value in figures.items():
        print(f"{name}={value:.3f}" if name.startswith("ratio") else f"{name}={value:g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=20, help="micro-batches (2 files each)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--s3-windows", type=int, default=8)
    parser.add_argument("--s3-rows", type=int, default=20_000)
    parser.add_argument("--s3-warmup", type=int, default=2)
    parser.add_argument(
        "--s3-list", type=int, action="append", default=[], help="print window N's requests"
    )
    parser.add_argument("--s3-verbose", action="store_true", help="print every S3 window")
    parser.add_argument("--no-spark", action="store_true", help="skip part 1")
    parser.add_argument("--no-sink-path", action="store_true", help="skip part 2")
    parser.add_argument("--no-s3", action="store_true", help="skip part 3")
    parser.add_argument("--profile", choices=FORMATS, help="part 2 under pyinstrument")
    parser.add_argument("--json", help="also write part 1's records to this file")
    parser.add_argument("--keep", action="store_true", help="keep each run's output directory")
    parser.add_argument("--format", choices=FORMATS, help=argparse.SUPPRESS)
    run_main(parser, "format", child, orchestrate)


if __name__ == "__main__":
    main()
