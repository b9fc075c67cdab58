"""Soak: 400 micro-batches with expiry, in one process, watching memory and the store's size.

Hundreds of Spark micro-batches take far too long on a small machine, so the windows run through the
sink's own batch code without Spark's transport (``InProcessSink``: the data source's
``streamWriter``, ``run_task`` for each of two partitions, the writer's ``commit``), all in this
process, which therefore plays both the Python worker and the driver. Each window brings new
keys, re-sent copies of recent keys (duplicates), copies older than the expiry period
(expired), errors and copies within the window; expiry drops whole window files from the index
and garbage collection deletes them, so the store must stay the same size while the ports grow.

Checked: resident memory after warm-up stays flat; the store's window files and manifests stay
bounded and are purged; nothing is left staged; and every input row is in exactly one port,
exactly once, as the reference model says.
"""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from faults import InProcessSink, assert_exactly_once, logged_rows_by_port, rows_by_port
from streams import PORT_NAMES, port_rows, reference_outputs

pytestmark = pytest.mark.slow

# Thirteen expiry periods and 25 garbage collections after the warm-up: a leak or a store that
# grows shows between the first and the last hundred (600 windows took four minutes).
WINDOWS = 400
WARM_UP = 100
MINUTE_US = 60_000_000
BASE_US = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
SCHEMA = pa.schema([("rid", pa.int64()), ("id", pa.int64()), ("t", pa.timestamp("us", "UTC"))])
OPTIONS = {"keys": "id", "expiryKey": "t", "expiryPeriod": "30 minutes"}


def key_time(window: int, i: int) -> int:
    return BASE_US + window * MINUTE_US + i * 100_000


def window_rows(w: int) -> pa.Table:
    """Window ``w`` is minute ``w``: 100 new keys, 40 re-sent from 5 windows back, 20 from 40
    windows back (past the 30-minute period), 5 copies within the window, 5 null keys."""
    ids: list[int | None] = []
    times: list[int] = []
    for i in range(100):
        ids.append(w * 1000 + i)
        times.append(key_time(w, i))
    for back, count in ((5, 40), (40, 20)):
        if w >= back:
            for i in range(count):
                ids.append((w - back) * 1000 + i)
                times.append(key_time(w - back, i))
    for i in range(5):
        ids.append(w * 1000 + i)
        times.append(key_time(w, i))
        ids.append(None)
        times.append(key_time(w, 0))
    rids = [w * 1000 + i for i in range(len(ids))]
    return pa.table(
        [pa.array(rids, pa.int64()), pa.array(ids, pa.int64()), pa.array(times, SCHEMA[2].type)],
        schema=SCHEMA,
    )


def rss_bytes() -> int:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def store_files(out: Path) -> tuple[int, int]:
    data = out / "_store" / "data"
    log = out / "_store" / "_log"
    return (
        sum(1 for _ in data.iterdir()) if data.exists() else 0,
        sum(1 for _ in log.iterdir()) if log.exists() else 0,
    )


def test_four_hundred_windows_with_expiry_keep_memory_flat_and_the_store_bounded(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    sink = InProcessSink(str(out), OPTIONS, SCHEMA)
    inputs = [window_rows(w) for w in range(WINDOWS)]
    rss: list[int] = []
    files: list[tuple[int, int]] = []
    written = 0
    for w, table in enumerate(inputs):
        sink.window(w, table, partitions=2)
        written += 2
        rss.append(rss_bytes())
        files.append(store_files(out))
    steady_rss = rss[WARM_UP:]
    growth = max(steady_rss) - steady_rss[0]
    assert growth < 48 * 2**20, f"RSS grew {growth / 2**20:.1f} MB after warm-up"
    # Late windows use no more memory than early ones (no slow leak hiding under the bound).
    early = sum(steady_rss[:100]) / 100
    late = sum(steady_rss[-100:]) / 100
    assert late - early < 24 * 2**20, f"RSS {early / 2**20:.0f} -> {late / 2**20:.0f} MB"
    data_files = [d for d, _ in files[WARM_UP:]]
    log_files = [m for _, m in files[WARM_UP:]]
    # About 30 windows of 2 files live, plus the grace before deletion and compaction output.
    assert max(data_files) <= 100, max(data_files)
    assert max(data_files[-100:]) <= max(data_files[:100]) + 4
    # Manifests are collected every 16 versions: at most the 16 kept, the 15 committed since, and
    # aside files of interrupted creates.
    assert max(log_files) <= 2 * 16 + 2
    assert written > 5 * max(data_files)  # expired window files really were purged
    assert not list((out / "_staging").rglob("*.parquet"))
    visible = rows_by_port(out)
    assert_exactly_once(visible, inputs)
    assert logged_rows_by_port(out) == visible
    windows = [table.drop_columns(["rid"]) for table in inputs]
    expected = reference_outputs(windows, "tupleTime", ["id"], "t", 30 * MINUTE_US)
    assert {port: port_rows(out, port, ["id", "t"]) for port in PORT_NAMES} == dict(expected)
    counts = {port: len(rids) for port, rids in visible.items()}
    assert min(counts.values()) > WINDOWS, counts  # every port saw traffic throughout
    print(
        f"soak: {WINDOWS} windows, {sum(len(t) for t in inputs)} rows {counts}; RSS "
        f"{steady_rss[0] / 2**20:.0f} -> {steady_rss[-1] / 2**20:.0f} MB (max growth "
        f"{growth / 2**20:.1f} MB); store files max {max(data_files)} data, {max(log_files)} log"
    )
