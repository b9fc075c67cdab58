"""A backfill as one batch write: dedupsink against Spark's own Parquet writer, same rows, same run.

Input (generated once, seeded, cached under ``bench/.data/``): ``--rows`` events (10,000,000 by
default) in ``--files`` Parquet files, the compare input's shape (``common.CompareSpec``: a
36-character UUID id, an event time, a user, an amount, an ~80-character payload), 10% of them
re-sent copies of a recent row. Spark reads them as one DataFrame (a partition per file) and
writes it once:

* ``parquet``: ``df.write.mode("overwrite").parquet(out)``, the cost of writing the rows;
* ``dedupsink``: ``df.write.format("dedup")`` with ``keys=id``, ``expiryKey=event_time``,
  ``expiryPeriod=1 hour``, ``maxCacheMemory=--cache-memory``: one window, every row classified
  in the executors against the (empty) store and the other partitions' keys.

Each run is a fresh process (``--variant``), the variants alternate, ``--repeats`` rounds. Per
run: rows/s from the write's start to its return (the session's start-up and the input's
discovery are outside the clock), and the peak resident set of every Python worker process
Spark started (``VmHWM``, read while they live, with psutil finding them). dedupsink's ports
are checked against the generator's truth (unique = first copies, duplicate = re-sends).

The last lines are machine-readable: ``ratio_vs_parquet=<median of dedupsink/parquet rows/s in
the same round>``, ``peak_worker_rss_mb=<largest>`` and ``rss_limit_mb=<maxCacheMemory+256>``.
Usage: ``python bench/backfill.py [--rows N] [--files N] [--repeats N] [--cache-memory "64 MB"]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BARE_SINK,
    CompareSpec,
    WorkerPeaks,
    generate_compare_input,
    local_session_builder,
    print_machine,
    python_bare_source,
    variant_names,
)

RESULT = "RESULT "
PORTS = ("unique", "duplicate", "expired", "error")


def child(variant: str, input_dir: str, output: str, cache_memory: str) -> None:
    """One run in this process: a session, the DataFrame, the write on the clock."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = local_session_builder("bench-backfill", {"spark.driver.memory": "3g"}).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(python_bare_source())
    frame = spark.read.parquet(input_dir)
    partitions = frame.rdd.getNumPartitions()
    started = time.perf_counter()
    if variant == "parquet":
        frame.write.mode("overwrite").parquet(output)
    elif variant == BARE_SINK:
        frame.write.format(BARE_SINK).mode("append").save(output)
    else:
        (
            frame.write.format("dedup")
            .option("keys", "id")
            .option("expiryKey", "event_time")
            .option("expiryPeriod", "1 hour")
            .option("maxCacheMemory", cache_memory)
            .mode("append")
            .save(output)
        )
    seconds = time.perf_counter() - started
    spark.stop()
    print(RESULT + json.dumps({"seconds": seconds, "partitions": partitions}), flush=True)


def launch(variant: str, input_dir: Path, cache_memory: str) -> dict[str, Any]:
    output = Path(tempfile.mkdtemp(prefix=f"backfill-{variant}-"))
    command = [sys.executable, __file__, "--variant", variant, "--input", str(input_dir)]
    command += ["--output", str(output / "out"), "--cache-memory", cache_memory]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks = WorkerPeaks(process.pid).start()
    stdout, stderr = process.communicate(timeout=3600)
    peak = peaks.stop()
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    if process.returncode or not lines:
        raise SystemExit(f"{variant} failed:\n{stderr[-3000:]}")
    record: dict[str, Any] = json.loads(lines[-1][len(RESULT) :])
    record["peak_worker_rss"] = peak
    if variant == "dedupsink":
        import pyarrow.dataset as ds

        record["ports"] = {
            p: ds.dataset(str(output / "out" / p), format="parquet").count_rows() for p in PORTS
        }
    shutil.rmtree(output, ignore_errors=True)
    return record


def cache_bytes(text: str) -> int:
    from dedupsink.options import MAX_CACHE_MEMORY
    from dedupsink.units import parse_size

    return parse_size(MAX_CACHE_MEMORY, text).nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-memory", default="64 MB")
    parser.add_argument(
        "--variants",
        default="parquet,dedupsink",
        help="comma-separated; python-bare adds the bare Python sink (it only copies its rows)",
    )
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        child(args.variant, args.input, args.output, args.cache_memory)
        return
    print_machine()
    spec = CompareSpec(rows=args.rows, files=args.files, late_fraction=0.0)
    input_dir, truth = generate_compare_input(spec, window_files=args.files)
    print(f"input: {truth['rows']:,} rows in {args.files} files, {truth['resends']:,} re-sends")
    rounds: list[dict[str, dict[str, Any]]] = []
    for number in range(args.repeats):
        results = {
            variant: launch(variant, input_dir, args.cache_memory)
            for variant in variant_names(args.variants)
        }
        rounds.append(results)
        for variant, record in results.items():
            rate = truth["rows"] / record["seconds"]
            print(
                f"round {number + 1} {variant:12} {record['seconds']:7.1f} s {rate:10,.0f} rows/s"
                f"  {record['partitions']} partitions  peak worker RSS "
                f"{record['peak_worker_rss'] / 2**20:,.0f} MB"
            )
        ports = results["dedupsink"]["ports"]
        verdict = (
            "ok"
            if (ports["unique"], ports["duplicate"]) == (truth["unique_ids"], truth["resends"])
            else f"WRONG (truth: unique {truth['unique_ids']:,}, duplicate {truth['resends']:,})"
        )
        print(f"        dedupsink ports {ports}: {verdict}")
    for baseline in ("parquet", BARE_SINK):
        if baseline in rounds[0] and "dedupsink" in rounds[0]:
            ratios = [r[baseline]["seconds"] / r["dedupsink"]["seconds"] for r in rounds]
            print(f"ratio_vs_{baseline.replace('-', '_')}={statistics.median(ratios):.3f}")
    peak = max(r["dedupsink"]["peak_worker_rss"] for r in rounds)
    print(f"peak_worker_rss_mb={peak / 2**20:.0f}")
    print(f"rss_limit_mb={(cache_bytes(args.cache_memory) + 256 * 2**20) / 2**20:.0f}")


if __name__ == "__main__":
    main()
