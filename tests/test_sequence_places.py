"""Sequence dedup wherever the sink writes: on the S3 API server with Delta ports, and locally
with Iceberg and Parquet ports, windows run in this process (``LocalSink``: the sink's own
tasks and commit, without Spark), each port read back with its format's own reader and
compared, as multisets of (producer, id), with the rules of docs/SEMANTICS.md; the store holds
one entry per producer after every window.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from lakehouse import PortTables
from reference import ReferenceSequence
from servers import S3Server
from streams import PORT_NAMES

from dedupsink.sink.local import LocalSink
from dedupsink.store.store import BucketStore

SCHEMA = pa.schema([("producer", pa.string()), ("seq", pa.int64()), ("row", pa.int64())])
Row = tuple[str | None, int | None]
PRODUCERS = [f"device-{n}" for n in range(10)]


def windows_of(seed: int, count: int = 6, size: int = 60) -> list[list[Row]]:
    """Rows of 10 producers: growing ids with gaps, out of order inside a window, re-sends of
    the same and of earlier windows, and a null producer and a null id now and then."""
    rng = random.Random(seed)
    top = dict.fromkeys(PRODUCERS, 0)
    sent: list[Row] = []
    windows = []
    for _ in range(count):
        rows: list[Row] = []
        for _ in range(size):
            draw = rng.random()
            if draw < 0.2 and sent:
                rows.append(rng.choice(sent[-80:]))  # a re-send
            elif draw < 0.23:
                rows.append((None, 1) if draw < 0.215 else (rng.choice(PRODUCERS), None))
            else:
                producer = rng.choice(PRODUCERS)
                top[producer] += rng.choice([1, 1, 2, 7])  # gaps
                rows.append((producer, top[producer]))
        rng.shuffle(rows)  # ids of one producer out of order inside the window
        sent.extend(rows)
        windows.append(rows)
    return windows


def expected_ports(windows: list[list[Row]]) -> dict[str, Counter[Row]]:
    """Each port's (producer, id) pairs by the model; which copy is unique does not matter."""
    model = ReferenceSequence()
    ports: dict[str, Counter[Row]] = {port: Counter() for port in PORT_NAMES}
    for rows in windows:
        as_dicts = [{"producer": p, "seq": s} for p, s in rows]
        for row, port in zip(
            rows, model.window(as_dicts, lambda r: r["producer"], lambda r: r["seq"]), strict=True
        ):
            ports[port][row] += 1
    return ports


def table_of(rows: list[Row], start: int) -> pa.Table:
    return pa.table(
        {
            "producer": [p for p, _ in rows],
            "seq": [s for _, s in rows],
            "row": list(range(start, start + len(rows))),
        },
        schema=SCHEMA,
    )


def run_windows(options: dict[str, str], windows: list[list[Row]]) -> None:
    sink = LocalSink({**options, "keys": "producer", "sequenceKey": "seq"}, SCHEMA)
    storage = {k.removeprefix("fs."): v for k, v in options.items() if k.startswith("fs.")}
    store = BucketStore(f"{options['path']}/_store", storage)
    start = 0
    for batch_id, rows in enumerate(windows):
        sink.window(batch_id, table_of(rows, start), partitions=1 + batch_id % 3)
        start += len(rows)
        manifest = store.read()
        assert manifest is not None
        counts = [segment.count for segments in manifest.buckets.values() for segment in segments]
        producers = {p for window in windows[: batch_id + 1] for p, s in window if p and s}
        assert sum(counts) == manifest.remembered_keys == len(producers), "one entry a producer"
        assert all(len(segments) == 1 for segments in manifest.buckets.values())
        # The tasks' window files, folded by the commit that added them, are gone at once.
        written_now = {
            n
            for n in store.storage.entries(store.path("data"))
            if n.startswith(f"w{manifest.version:010d}-")
        }
        assert written_now == {
            n for n in manifest.files if n.startswith(f"w{manifest.version:010d}-")
        }


def as_rows(table: pa.Table) -> Counter[Row]:
    producers, ids = table.column("producer").to_pylist(), table.column("seq").to_pylist()
    return Counter(zip(producers, ids, strict=True))


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "parquet"])
def test_sequence_dedup_in_each_port_format(fmt: str, tmp_path: Path) -> None:
    windows = windows_of(seed=len(fmt))
    out = tmp_path / "out"
    run_windows({"path": str(out), "outputFormat": fmt}, windows)
    expected = expected_ports(windows)
    for port in PORT_NAMES:
        if fmt == "parquet":
            table = ds.dataset(str(out / port), format="parquet").to_table()
        else:
            table = PortTables(fmt, out).read(port)
        assert as_rows(table) == expected[port], port
    assert not expected["expired"] and sum(expected["duplicate"].values()) > 20


def test_sequence_dedup_on_s3_with_delta_ports(s3: S3Server, tmp_path: Path) -> None:
    windows = windows_of(seed=41)
    tables = PortTables("delta", s3.remote("sequence"))
    run_windows(tables.sink_options(), windows)
    expected = expected_ports(windows)
    for port in PORT_NAMES:
        assert as_rows(tables.read(port)) == expected[port], port
