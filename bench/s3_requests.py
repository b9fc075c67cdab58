"""Requests per window on S3: what a steady stream costs in PUT, GET, HEAD, LIST, DELETE, COPY.

A stream of ``--windows`` micro-batches (one Parquet file each, ``--rows`` rows, dealt over two
partitions) runs through ``format("dedup")`` on Spark ``local[2]`` into ``s3://`` on moto's S3
API server (started in this process; ``tests/servers.py``), in tupleTime mode with a one-hour
expiry period. Every window has rows for all four ports: new events, re-sent copies of recent
ones (duplicate), copies older than the expiry period (expired) and rows without an id (error).

The server counts every request it receives, from any process. A window's requests are those
between its commit point and the previous one (the store's manifests record the times): its
tasks, its commit, and the previous window's publication and clean-up, which in a steady stream
is what one window costs. The first ``--warmup`` windows (Spark's Python workers starting,
caches filling) are left out of the summary. Bytes copied are the staged files' sizes copied
server-side into the ports (CopyObject), from the windows' publication records.

Prints one line per window and the medians; the last line is ``requests_per_window=<median>``.
Usage: ``python bench/s3_requests.py [--windows 30] [--rows 20000] [--warmup 5] [--list N]``
(``--list N`` prints every request of window N).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from common import (  # noqa: E402
    EPOCH_2024_US,
    event_columns,
    local_session_builder,
    print_machine,
)
from servers import KINDS, S3Server  # noqa: E402

from dedupsink.store.store import BucketStore  # noqa: E402

MINUTE_US = 60_000_000


def window_table(rng: np.random.Generator, window: int, rows: int, recent: np.ndarray) -> pa.Table:
    """One minute of events: 85% new, 10% re-sent copies, 4% older than an hour, 1% no id."""
    start = EPOCH_2024_US + window * MINUTE_US
    times = np.sort(rng.integers(start, start + MINUTE_US, rows))
    table = event_columns(rng, times)
    ids = table.column("id").to_numpy(zero_copy_only=False).astype(object)
    event_times = table.column("event_time").cast(pa.int64()).to_numpy().copy()
    kinds = rng.random(rows)
    if len(recent):
        copies = kinds < 0.10
        ids[copies] = rng.choice(recent, copies.sum())
        late = (kinds >= 0.10) & (kinds < 0.14)
        event_times[late] -= 2 * 60 * MINUTE_US
    ids[kinds >= 0.99] = None
    table = table.set_column(0, "id", pa.array(ids, pa.string()))
    stamps = pa.array(event_times, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    return table.set_column(table.schema.get_field_index("event_time"), "event_time", stamps)


def write_input(folder: Path, windows: int, rows: int) -> None:
    rng = np.random.default_rng(42)
    recent = np.array([], dtype=object)
    base = int(time.time()) - 3600
    for window in range(windows):
        table = window_table(rng, window, rows, recent)
        path = folder / f"w{window:04d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (base + window, base + window))  # the file source reads oldest first
        recent = np.array(table.column("id").drop_null().to_pylist()[-2000:], dtype=object)


def run_stream(server: S3Server, folder: Path, checkpoint: Path, url: str) -> None:
    spark = local_session_builder("bench-s3-requests").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    schema = spark.read.parquet(str(folder)).schema
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(folder))
    writer = frame.repartition(2).writeStream.format("dedup").option("path", url)
    options = {"keys": "id", "expiryKey": "event_time", "expiryPeriod": "1 hour"}
    for name, value in server.storage_options.items():
        options[f"fs.{name}"] = value
    query = (
        writer.options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def per_window(server: S3Server, url: str, listed: set[int]) -> list[dict[str, Any]]:
    """Requests between consecutive commit points, by kind, with the bytes copied; the
    requests of the windows in ``listed`` are printed one by one."""
    store = BucketStore(f"{url}/_store", server.storage_options)
    manifests = [m for m in (store.read(v) for v in store.versions()) if m is not None]
    requests = server.requests()
    out = []
    for previous, manifest in itertools.pairwise(manifests):
        low, high = previous.committed_ms / 1000, manifest.committed_ms / 1000
        kinds = {kind: 0 for kind in KINDS}
        for request in requests:
            if low < request.at <= high:
                kinds[request.kind] += 1
                if manifest.version in listed:
                    since = (request.at - low) * 1000
                    print(
                        f"window {manifest.version} +{since:6.1f} ms: "
                        f"{request.kind} {request.op} {request.key}"
                    )
        publication = manifest.publication
        copied = sum(m.size or 0 for m in publication.moves) if publication else 0
        out.append({"window": manifest.version, **kinds, "copied": copied})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=30)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--list", type=int, action="append", default=[], help="print window N's requests"
    )
    args = parser.parse_args()
    print_machine()
    server = S3Server().start()
    try:
        with tempfile.TemporaryDirectory(prefix="dedup-s3-bench-") as scratch:
            folder = Path(scratch) / "in"
            folder.mkdir()
            write_input(folder, args.windows, args.rows)
            url = server.remote("requests").url
            server.reset_counts()
            run_stream(server, folder, Path(scratch) / "chk", url)
            windows = per_window(server, url, set(args.list))
    finally:
        server.stop()
    shown = [k for k in KINDS if any(w[k] for w in windows)]
    print(f"{'window':>6} " + " ".join(f"{k:>6}" for k in shown) + f" {'total':>6} {'copied':>10}")
    for w in windows:
        total = sum(w[k] for k in KINDS)
        counts = " ".join(f"{w[k]:>6}" for k in shown)
        print(f"{w['window']:>6} {counts} {total:>6} {w['copied']:>10,}")
    steady = windows[args.warmup :]
    totals = [sum(w[k] for k in KINDS) for w in steady]
    medians = {k: statistics.median(w[k] for w in steady) for k in shown}
    print(
        f"steady windows {steady[0]['window']}-{steady[-1]['window']}: median per kind "
        + ", ".join(f"{k} {v:g}" for k, v in medians.items())
        + f"; total median {statistics.median(totals):g}, max {max(totals)}; bytes copied a "
        f"window (median) {statistics.median(w['copied'] for w in steady):,.0f}"
    )
    print(f"requests_per_window={statistics.median(totals):g}")


if __name__ == "__main__":
    main()
