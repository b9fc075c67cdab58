"""Engine benchmark: classification speed with a warm bucket cache, and store bytes per key.

Feeds 2,000,000 rows (36-character UUID string keys, 10% re-sends of a key seen within the
previous ~5,000 rows, an event time per key) through the executor-side task and the driver
commit exactly as the Spark sink runs them, on the local filesystem, in windows of 100,000
rows, and reports:

* engine rows/s: rows divided by the time spent in ``WindowClassifier.classify`` over the
  windows after the first (warm cache), on one core;
* task rows/s: the same for the whole task (classification + Parquet staging + window file);
* bytes on disk per remembered key: the store's window files plus its latest manifest.

Usage: ``python bench/engine_bench.py [--rows N] [--window N] [--mode basic|tupleTime]``
(Basic Dedup by default: the issue names no expiry; tupleTime uses a 1-hour period).
The last line is machine-readable: ``rows_per_s=<number> bytes_per_key=<number>``.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

from dedupsink.sink.local import LocalSink

EPOCH_2024_US = 1_704_067_200_000_000


def make_rows(rows: int, resend_fraction: float, seed: int = 7) -> pa.Table:
    """UUID keys, each with one event time; re-sends repeat a key from the last ~5,000 rows."""
    rng = np.random.default_rng(seed)
    originals = int(rows * (1 - resend_fraction))
    keys = np.array([str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**63, originals)])
    times = EPOCH_2024_US + np.arange(originals, dtype=np.int64) * 5_400  # ~185 rows per second
    resend_at = np.sort(rng.integers(1, originals, rows - originals))
    source = np.maximum(resend_at - rng.integers(1, 5_000, len(resend_at)), 0)
    position = np.concatenate([np.arange(originals), resend_at]).astype(np.float64)
    position[originals:] += 0.5  # a re-send lands just after the row it follows
    order = np.argsort(position, kind="stable")
    all_keys = np.concatenate([keys, keys[source]])[order]
    all_times = np.concatenate([times, times[source]])[order]
    return pa.table(
        {
            "id": pa.array(all_keys.tolist(), type=pa.string()),
            "event_time": pa.array(all_times, type=pa.timestamp("us", tz="UTC")),
        }
    )


def run(rows: int, window: int, mode: str) -> tuple[float, float]:
    table = make_rows(rows, 0.10)
    with tempfile.TemporaryDirectory() as tmp:
        raw = {"path": str(Path(tmp) / "out"), "keys": "id"}
        if mode == "tupleTime":
            raw |= {"expiryKey": "event_time", "expiryPeriod": "1 hour", "maxCachedBuckets": "64"}
        sink = LocalSink(raw, table.schema, query_id="bench")
        classify_s = task_s = 0.0
        warm_rows = 0
        for batch_id, start in enumerate(range(0, rows, window)):
            chunk = table.slice(start, window).to_batches(max_chunksize=10_000)
            summary = sink.task(batch_id, 0, chunk)
            sink.commit(batch_id, [summary])
            if batch_id > 0:
                classify_s += summary.classify_seconds
                task_s += summary.seconds
                warm_rows += sum(b.num_rows for b in chunk)
        store = sink.plan.store
        manifest = store.read()
        assert manifest is not None
        files, data_bytes = store.disk_usage()
        manifest_bytes = len(manifest.to_bytes())
        remembered = manifest.remembered_keys
        totals = manifest.totals.counts
    rows_per_s = warm_rows / classify_s
    bytes_per_key = (data_bytes + manifest_bytes) / max(remembered, 1)
    print(f"mode={mode} rows={rows} window={window}")
    print(
        "ports: "
        + " ".join(f"{port}={totals[port]}" for port in ("unique", "duplicate", "expired"))
    )
    print(f"engine (classify, warm cache): {rows_per_s:,.0f} rows/s")
    print(f"task (classify + staging + window file): {warm_rows / task_s:,.0f} rows/s")
    print(f"store: {files} window files, {data_bytes:,} B data + {manifest_bytes:,} B manifest")
    print(f"remembered keys: {remembered:,}; bytes on disk per remembered key: {bytes_per_key:.2f}")
    return rows_per_s, bytes_per_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--mode", choices=("basic", "tupleTime"), default="basic")
    args = parser.parse_args()
    rows_per_s, bytes_per_key = run(args.rows, args.window, args.mode)
    print(f"rows_per_s={rows_per_s:.0f} bytes_per_key={bytes_per_key:.2f}")


if __name__ == "__main__":
    main()
