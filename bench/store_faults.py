"""A store far away or browning out: what it costs a stream on S3, and how fast a dead one is said.

moto's S3 API server runs in this process (``tests/servers.py``) behind the tests' fault proxy
(``tests/faultproxy.py``); the stream (``format("dedup")`` on Spark ``local[2]``, the input
of ``bench/s3_requests.py``: ``--windows`` one-minute windows of ``--rows`` events, tupleTime,
one-hour expiry) reaches the store only through the proxy. Three figures:

1. **Distance.** The same stream with no added latency and with ``--latency`` seconds (20 ms,
   a region's round trip) added to every request, one after the other, ``--repeats`` times
   each, interleaved: rows per second of the whole query and of its steady windows (from the
   history's commit times, after the first ``--warmup`` windows).
2. **A brownout.** The stream with ``--slowdown`` of the requests (5%) answered ``503
   SlowDown``: the requests each window retried and the seconds lost (the history's
   ``store_retries``, ``store_wait_seconds``), and its rows per second.
3. **A dead store.** The proxy silent (connections accepted, never answered): the time until
   ``dedupsink inspect`` prints its one line, and until the stream's query fails at its start.

Usage: ``python bench/store_faults.py [--windows 20] [--rows 20000] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from common import local_session_builder, print_machine  # noqa: E402
from faultproxy import FaultProxy, proxied  # noqa: E402
from s3_requests import write_input  # noqa: E402
from servers import Remote, S3Server  # noqa: E402

from dedupsink.store.history import load_history  # noqa: E402

OPTIONS = {"keys": "id", "expiryKey": "event_time", "expiryPeriod": "1 hour"}


def run_stream(spark: Any, folder: Path, checkpoint: Path, through: Remote) -> float:
    """Run the stream to its end; its wall seconds."""
    schema = spark.read.parquet(str(folder)).schema
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(folder))
    writer = frame.repartition(2).writeStream.format("dedup").option("path", through.url)
    started = time.monotonic()
    query = (
        writer.options(**OPTIONS, **through.sink_options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.monotonic() - started


def steady_rate(direct: Remote, warmup: int) -> tuple[float, list[int], list[float]]:
    """Rows per second between the commits of the steady windows; each window's retries and
    seconds lost."""
    history = load_history(direct.url, direct.storage_options).to_pylist()
    steady = history[warmup:]
    rows = sum(r["unique"] + r["duplicate"] + r["expired"] + r["error"] for r in steady[1:])
    seconds = (steady[-1]["committed_at"] - steady[0]["committed_at"]).total_seconds()
    retries = [int(r["store_retries"] or 0) for r in history]
    waits = [float(r["store_wait_seconds"] or 0.0) for r in history]
    return rows / seconds, retries, waits


def one_run(
    spark: Any, server: S3Server, proxy: FaultProxy, folder: Path, scratch: Path, args: Any
) -> tuple[float, float, list[int], list[float]]:
    direct = server.remote("faults-bench")
    through = proxied(direct, proxy)
    checkpoint = scratch / f"chk-{time.monotonic_ns()}"
    seconds = run_stream(spark, folder, checkpoint, through)
    steady, retries, waits = steady_rate(direct, args.warmup)
    return args.windows * args.rows / seconds, steady, retries, waits


def dead_store(
    spark: Any, server: S3Server, proxy: FaultProxy, folder: Path, scratch: Path
) -> None:
    through = proxied(server.remote("dead"), proxy)
    proxy.set(silent=True)
    flags = [
        f for name, value in through.storage_options.items() for f in ("--fs", f"{name}={value}")
    ]
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dedupsink"), "inspect", through.url, *flags],
        capture_output=True,
        text=True,
    )
    print(f"dead store, dedupsink inspect: {time.monotonic() - started:.2f} s to its line")
    print(f"  {done.stderr.strip()}")
    started = time.monotonic()
    try:
        run_stream(spark, folder, scratch / "chk-dead", through)
    except Exception as exc:  # the query's failure is the figure
        line = next((x for x in str(exc).splitlines() if "dedupsink" in x), str(exc)[:200])
        print(f"dead store, stream start: {time.monotonic() - started:.2f} s to the failure")
        print(f"  {line.strip()}")
    proxy.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.020)
    parser.add_argument("--slowdown", type=float, default=0.05)
    args = parser.parse_args()
    print_machine()
    server = S3Server().start()
    proxy = FaultProxy(server.endpoint_url, seed=58).start()
    spark = local_session_builder("bench-store-faults").getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    try:
        with tempfile.TemporaryDirectory(prefix="dedup-faults-bench-") as scratch_name:
            scratch = Path(scratch_name)
            folder = scratch / "in"
            folder.mkdir()
            write_input(folder, args.windows, args.rows)
            one_run(spark, server, proxy, folder, scratch, args)  # Spark's workers warm
            rates: dict[str, list[tuple[float, float]]] = {"none": [], "latency": []}
            for _ in range(args.repeats):
                for name, latency in (("none", 0.0), ("latency", args.latency)):
                    proxy.set(latency=latency)
                    rate, steady, _, _ = one_run(spark, server, proxy, folder, scratch, args)
                    rates[name].append((rate, steady))
                    print(f"{name:>8}: {rate:,.0f} rows/s, steady windows {steady:,.0f} rows/s")
            proxy.clear()
            for name, figures in rates.items():
                whole = statistics.median(r for r, _ in figures)
                steady = statistics.median(s for _, s in figures)
                print(f"median {name}: {whole:,.0f} rows/s, steady {steady:,.0f} rows/s")
            ratio = statistics.median(s for _, s in rates["latency"]) / statistics.median(
                s for _, s in rates["none"]
            )
            print(f"steady rows/s with {args.latency * 1000:g} ms a request over none: {ratio:.3f}")
            proxy.reset_counts()
            proxy.set(slowdown=args.slowdown)
            rate, steady, retries, waits = one_run(spark, server, proxy, folder, scratch, args)
            counts = proxy.counts()
            proxy.clear()
            print(
                f"{args.slowdown:.0%} 503 SlowDown: {counts['slowdown']} of {counts['requests']} "
                f"requests throttled; {rate:,.0f} rows/s, steady {steady:,.0f} rows/s"
            )
            print(
                # The history's counts end at each commit point; the batch log lines count the
                # publication after it too, so they can say more.
                f"  retries a window, to its commit point: median "
                f"{statistics.median(retries):g}, max {max(retries)}"
                f", total {sum(retries)}; seconds lost a window: median "
                f"{statistics.median(waits):.2f}, max {max(waits):.2f}"
            )
            dead_store(spark, server, proxy, folder, scratch)
    finally:
        spark.stop()
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()
