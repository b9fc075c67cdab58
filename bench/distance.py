"""A store one region away: what each request's distance costs a steady stream on S3.

moto's S3 API server runs in this process (``tests/servers.py``) behind the tests' fault proxy
(``tests/faultproxy.py``), which holds every request for a fixed delay; the stream
(``format("dedup")`` on Spark ``local[2]``, the input of ``bench/s3_requests.py``: ``--windows``
one-minute windows of ``--rows`` events over two partitions, tupleTime, one-hour expiry) reaches
the store and the ports only through the proxy. Spark's checkpoint and input stay local.

For each port format and each latency (``--latencies``, in ms), rounds interleaved, it prints:

* the steady window time (the median gap between the commits of the windows after
  ``--warmup``, from the store's history) and the steady rows/s, with their ratio to the same
  stream with no latency;
* the **effective serial round trips a window**: (window time at L - window time at 0) / L;
* the requests a steady window makes, by kind, the bytes it copies server-side, and what a
  million input rows cost at S3's list prices (PUT, COPY, POST and LIST $0.005 per 1,000; GET
  and HEAD $0.0004 per 1,000; DELETE free).

Usage: ``python bench/distance.py [--formats parquet,delta] [--latencies 0,20,50]
[--rows 20000] [--windows 16] [--repeats 1]``. Iceberg's ports take a SQL catalog in a local
SQLite file (its requests are the tables' files on S3).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from common import local_session_builder, print_machine  # noqa: E402
from faultproxy import FaultProxy, proxied  # noqa: E402
from s3_requests import write_input  # noqa: E402
from servers import KINDS, Remote, S3Server  # noqa: E402

from dedupsink.store.history import load_history  # noqa: E402
from dedupsink.store.store import BucketStore  # noqa: E402

OPTIONS = {"keys": "id", "expiryKey": "event_time", "expiryPeriod": "1 hour"}
# S3 Standard's list prices, dollars per request (us-east-1).
PRICE = {"PUT": 0.005e-3, "COPY": 0.005e-3, "POST": 0.005e-3, "LIST": 0.005e-3}
PRICE_READ = 0.0004e-3  # GET, HEAD
FREE = {"DELETE"}


@dataclass
class Run:
    """One stream's steady figures."""

    window_seconds: float  # median gap between steady commits
    rows_per_second: float
    requests: dict[str, float]  # median a steady window, by kind
    copied: float  # bytes copied server-side a steady window (median)


def sink_options(fmt: str, through: Remote, scratch: Path) -> dict[str, str]:
    options = {**OPTIONS, **through.sink_options, "outputFormat": fmt}
    if fmt == "iceberg":
        options.update(
            {
                "iceberg.catalog.type": "sql",
                "iceberg.catalog.uri": f"sqlite:///{scratch / f'catalog-{time.monotonic_ns()}.db'}",
                "iceberg.catalog.warehouse": through.url,
            }
        )
    return options


def run_stream(
    spark: Any, folder: Path, checkpoint: Path, url: str, options: dict[str, str]
) -> None:
    schema = spark.read.parquet(str(folder)).schema
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(folder))
    query = (
        frame.repartition(2)
        .writeStream.format("dedup")
        .option("path", url)
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def print_timeline(server: S3Server, direct: Remote, version: int) -> None:
    """Every request of window ``version`` (after the previous commit point, to its own), with
    its time into the window: the round trips one after another show as steps."""
    store = BucketStore(f"{direct.url}/_store", direct.storage_options)
    previous, manifest = store.read(version - 1), store.read(version)
    if previous is None or manifest is None:
        return
    low, high = previous.committed_ms / 1000, manifest.committed_ms / 1000
    for request in server.requests():
        if low < request.at <= high:
            at = (request.at - low) * 1000
            print(f"  window {version} +{at:7.1f} ms {request.kind:>6} {request.key}")


def steady_figures(server: S3Server, direct: Remote, warmup: int) -> Run:
    history = load_history(direct.url, direct.storage_options).to_pylist()[warmup:]
    times = [row["committed_at"].timestamp() for row in history]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    rows = [r["unique"] + r["duplicate"] + r["expired"] + r["error"] for r in history[1:]]
    store = BucketStore(f"{direct.url}/_store", direct.storage_options)
    versions = [row["version"] for row in history]
    manifests = [store.read(v) for v in versions]
    copied = [
        sum(m.size or 0 for m in manifest.publication.moves if not m.in_place)
        for manifest in manifests[1:]
        if manifest is not None and manifest.publication is not None
    ]
    requests = server.requests()  # the runs go one after another: a window's are its own
    by_kind = {kind: [] for kind in KINDS}
    for low, high in itertools.pairwise(times):
        inside = [r for r in requests if low < r.at <= high]
        for kind in KINDS:
            by_kind[kind].append(sum(1 for r in inside if r.kind == kind))
    return Run(
        statistics.median(gaps),
        sum(rows) / sum(gaps),
        {kind: statistics.median(counts) for kind, counts in by_kind.items()},
        statistics.median(copied) if copied else 0.0,
    )


def cost_per_million(requests: dict[str, float], rows: int) -> float:
    dollars = sum(
        count * PRICE.get(kind, 0.0 if kind in FREE else PRICE_READ)
        for kind, count in requests.items()
    )
    return dollars * 1_000_000 / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="parquet,delta")
    parser.add_argument("--latencies", default="0,20,50", help="ms added to every request")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--list", type=int, help="print every request of window N, timed")
    args = parser.parse_args()
    latencies = [int(x) for x in args.latencies.split(",")]
    formats = args.formats.split(",")
    print_machine()
    server = S3Server().start()
    proxy = FaultProxy(server.endpoint_url, seed=64).start()
    spark = local_session_builder("bench-distance").getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    runs: dict[tuple[str, int], list[Run]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="dedup-distance-") as scratch_name:
            scratch = Path(scratch_name)
            folder = scratch / "in"
            folder.mkdir()
            write_input(folder, args.windows, args.rows)
            rounds = [(None, formats[0], 0)] + [
                (r, f, lat) for r in range(args.repeats) for f in formats for lat in latencies
            ]
            for repeat, fmt, latency in rounds:
                direct = server.remote(f"distance-{fmt}")
                through = proxied(direct, proxy)
                proxy.set(latency=latency / 1000)
                checkpoint = scratch / f"chk-{time.monotonic_ns()}"
                run_stream(
                    spark, folder, checkpoint, through.url, sink_options(fmt, through, scratch)
                )
                proxy.clear()
                if repeat is None:
                    continue  # Spark's workers warm
                if args.list is not None:
                    print_timeline(server, direct, args.list)
                run = steady_figures(server, direct, args.warmup)
                runs.setdefault((fmt, latency), []).append(run)
                print(
                    f"{fmt:>8} {latency:>3} ms: window {run.window_seconds * 1000:,.0f} ms, "
                    f"{run.rows_per_second:,.0f} rows/s"
                )
    finally:
        spark.stop()
        proxy.stop()
        server.stop()
    report(runs, formats, latencies, args.rows)


def report(
    runs: dict[tuple[str, int], list[Run]], formats: list[str], latencies: list[int], rows: int
) -> None:
    print(f"\nsteady windows of {rows:,} rows, medians over the rounds")
    print(
        f"{'format':>8} {'ms':>4} {'window ms':>10} {'rows/s':>9} {'ratio':>6} {'serial RT':>9} "
        f"{'requests':>8}  {'by kind':<40} {'copied':>10} {'$/M rows':>8}"
    )
    for fmt in formats:
        base = statistics.median(r.window_seconds for r in runs[(fmt, latencies[0])])
        base_rate = statistics.median(r.rows_per_second for r in runs[(fmt, latencies[0])])
        for latency in latencies:
            these = runs[(fmt, latency)]
            window = statistics.median(r.window_seconds for r in these)
            rate = statistics.median(r.rows_per_second for r in these)
            requests = {k: statistics.median(r.requests[k] for r in these) for k in KINDS}
            copied = statistics.median(r.copied for r in these)
            serial = (window - base) / (latency / 1000) if latency else 0.0
            kinds = " ".join(f"{k} {v:g}" for k, v in requests.items() if v)
            print(
                f"{fmt:>8} {latency:>4} {window * 1000:>10,.0f} {rate:>9,.0f} "
                f"{rate / base_rate:>6.3f} {serial:>9.1f} {sum(requests.values()):>8g}  "
                f"{kinds:<40} {copied:>10,.0f} {cost_per_million(requests, rows):>8.4f}"
            )
            print(
                f"figures: format={fmt} latency_ms={latency} ratio={rate / base_rate:.3f} "
                f"serial_round_trips={serial:.1f} requests={sum(requests.values()):g} "
                f"copied_bytes={copied:.0f}"
            )


if __name__ == "__main__":
    main()
