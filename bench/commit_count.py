"""What counting the expired keys awaiting fold costs a commit (``CountExpiredUnfolded``).

The sink's tasks and commit run in this process without Spark (``LocalSink``), two tasks a
window, each window ``--keys`` new keys (ids never seen before, so the state grows by them until
they expire). Modes (``--mode``):

* ``systemTime`` (default): ``expiryPeriod`` ``--period`` seconds; a window starts every
  ``--interval`` seconds, so the expiry point passes through the store's files as in a stream;
* ``categorical``: the expiry key is a category number, a new one every ``--per-category``
  windows, ``expiryPeriod`` 4 categories;
* ``own``: an int64 expiry key of each row's own value (``assumeSameExpiry=false``), all distinct,
  ``expiryPeriod`` ``--period`` windows' worth of values: files record no stamp counts.

Per window: the commit's seconds (``LocalSink.commit``); then, on the version it committed, the
count twice, timed: as the commit makes it (files with stamp counts counted from them, only the
others' keys read) and with every file's stamp counts left out (every file the expiry point
straddles read, as before they were recorded), with the keys each reads. Both must agree.
Prints the means over the windows after the first ``--warm-up``. ``--stamp-counts-cap 0`` has
files record no stamp counts (``format.STAMP_COUNTS_CAP`` for this process), so the commit
reads every straddling file as before they were recorded: the commit's time without them.

Usage: ``python bench/commit_count.py [--mode systemTime] [--windows 80] [--keys 5000]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from dedupsink.engine.classify import stamp_dtype
from dedupsink.sink.local import LocalSink
from dedupsink.store import format as store_format
from dedupsink.store.cache import segment_stamps
from dedupsink.store.format import Manifest, Segment
from dedupsink.store.transaction import CountExpiredUnfolded, NextVersion

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64())])


def options(mode: str, path: Path, period: int) -> dict[str, str]:
    common = {"path": str(path), "keys": "id", "outputFormat": "parquet"}
    if mode == "systemTime":
        return {**common, "expiryMode": "systemTime", "expiryPeriod": f"{period} seconds"}
    if mode == "categorical":
        return {**common, "expiryMode": "categorical", "expiryKey": "n", "expiryPeriod": "4"}
    return {**common, "expiryKey": "n", "expiryPeriod": str(period), "assumeSameExpiry": "false"}


def window_rows(mode: str, window: int, keys: int, per_category: int) -> pa.Table:
    ids = np.arange(window * keys, (window + 1) * keys, dtype=np.int64)
    n = np.full(keys, window // per_category) if mode == "categorical" else ids
    return pa.table([pa.array(ids), pa.array(n, pa.int64())], schema=SCHEMA)


def timed_count(
    sink: LocalSink, manifest: Manifest, with_stamp_counts: bool
) -> tuple[float, int, int]:
    """The count on ``manifest`` as its commit made it: seconds, keys counted, keys read."""
    plan = sink.plan
    dtype = stamp_dtype(plan.settings)
    assert dtype is not None
    read = segment_stamps(plan.store, dtype)
    read_keys = 0

    def counting(at: Manifest, segments: list[Segment]) -> np.ndarray:
        nonlocal read_keys
        read_keys += sum(s.count for s in segments)
        return read(at, segments)

    if not with_stamp_counts:
        files = {name: replace(f, stamp_counts=None) for name, f in manifest.files.items()}
        manifest = replace(manifest, files=files)
    next_version = NextVersion(manifest, manifest)
    started = time.perf_counter()
    CountExpiredUnfolded(plan.settings.expiry, counting).apply(next_version)
    return time.perf_counter() - started, next_version.expired_unfolded_keys, read_keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", choices=["systemTime", "categorical", "own"], default="systemTime"
    )
    parser.add_argument("--windows", type=int, default=80)
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--period", type=int, default=20, help="seconds (own: windows)")
    parser.add_argument("--interval", type=float, default=0.4, help="seconds between windows")
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--stamp-counts-cap", type=int, default=store_format.STAMP_COUNTS_CAP)
    args = parser.parse_args()
    store_format.STAMP_COUNTS_CAP = args.stamp_counts_cap
    period = args.period * args.keys if args.mode == "own" else args.period
    with tempfile.TemporaryDirectory(prefix="commit-count-") as work:
        sink = LocalSink(options(args.mode, Path(work) / "out", period), SCHEMA, "bench-count")
        rows: list[tuple[float, float, float, int, int]] = []
        for window in range(args.windows):
            started = time.perf_counter()
            table = window_rows(args.mode, window, args.keys, args.per_category)
            summaries = sink.tasks(window, table, partitions=2)
            tick = time.perf_counter()
            report = sink.commit(window, summaries)
            commit_seconds = time.perf_counter() - tick
            manifest = sink.plan.store.read()
            assert report is not None and manifest is not None
            now, counted, read_now = timed_count(sink, manifest, with_stamp_counts=True)
            before, counted_before, read_before = timed_count(sink, manifest, False)
            assert counted == counted_before == report.expired_unfolded, (counted, counted_before)
            rows.append((commit_seconds, now, before, read_now, read_before))
            if args.mode == "systemTime":
                time.sleep(max(0.0, args.interval - (time.perf_counter() - started)))
        kept = rows[args.warm_up :]
        print(
            f"{args.mode}: {args.windows} windows of {args.keys:,} keys, "
            f"{report.remembered + report.expired_unfolded:,} keys in the store at the end "
            f"({report.expired_unfolded:,} expired awaiting fold), "
            f"{len(manifest.files)} window files"
        )
        counts = [f.stamp_counts for f in manifest.files.values()]
        widest = max((len(c) for c in counts if c is not None), default=0)
        print(
            f"files without stamp counts: {sum(c is None for c in counts)}; "
            f"most stamps a file records: {widest}; manifest: {len(manifest.to_bytes()):,} bytes"
        )
        print(f"mean commit seconds: {statistics.mean(r[0] for r in kept):.4f}")
        print(
            f"count with stamp counts:    {statistics.mean(r[1] for r in kept):.4f} s, "
            f"{statistics.mean(r[3] for r in kept):,.0f} keys read a commit"
        )
        print(
            f"count reading every straddling file: {statistics.mean(r[2] for r in kept):.4f} s, "
            f"{statistics.mean(r[4] for r in kept):,.0f} keys read a commit"
        )


if __name__ == "__main__":
    main()
