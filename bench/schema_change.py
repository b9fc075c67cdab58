"""The cost of a schema-changing window (``mergeSchema=true``) against a plain one, Delta and
Iceberg ports, local disk, without Spark (``LocalSink``: the tasks and the commit in this
process, two tasks a window).

Per format, in a fresh output: ``--warmup`` plain windows, then ``--rounds`` rounds of a plain
window followed by a window whose input carries one more column (a new query start with
``mergeSchema=true``, whose start is not timed: Spark starts a query for a new schema anyway).
Each timed window is its tasks and its commit; the commit's publication is where the schema
change is made (Delta: a ``metaData`` action in the log entry of each port, the port without
rows included; Iceberg: ``union_by_name`` in each port's snapshot transaction, a transaction of
its own for a port without rows). Prints the medians, then machine-readable lines
``schema_change_<format>_ms=<median>``, ``plain_<format>_ms=<median>``.

Usage: ``python bench/schema_change.py [--rows N] [--rounds N] [--warmup N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from dedupsink.sink.local import LocalSink

FORMATS = ("delta", "iceberg")


def window(schema: pa.Schema, first_id: int, rows: int) -> pa.Table:
    """``rows`` rows, a tenth of them copies of the window's own, every port but expired given
    rows (a few null keys go to error)."""
    ids: list[int | None] = [first_id + i for i in range(rows)]
    ids[: rows // 10] = ids[rows // 10 : rows // 5]
    ids[-1] = None
    columns = {"id": pa.array(ids, pa.int64()), "body": [f"event {i}" for i in range(rows)]}
    for field in schema:
        if field.name not in columns:
            columns[field.name] = pa.array([f"{field.name}-{i % 7}" for i in range(rows)])
    return pa.table(columns, schema)


def timed(sink: LocalSink, batch: int, table: pa.Table) -> float:
    started = time.perf_counter()
    sink.window(batch, table, partitions=2)
    return (time.perf_counter() - started) * 1000


def run(
    fmt: str, root: Path, rows: int, rounds: int, warmup: int
) -> tuple[list[float], list[float]]:
    schema = pa.schema([("id", pa.int64()), ("body", pa.string())])
    options = {"path": str(root / fmt), "outputFormat": fmt, "keys": "id", "mergeSchema": "true"}
    sink = LocalSink(options, schema)
    batch, first = 0, 0
    plain, changing = [], []
    for _ in range(warmup):
        timed(sink, batch, window(schema, first, rows))
        batch, first = batch + 1, first + rows
    for index in range(rounds):
        plain.append(timed(sink, batch, window(schema, first, rows)))
        batch, first = batch + 1, first + rows
        schema = schema.append(pa.field(f"added_{index}", pa.string()))
        sink = LocalSink(options, schema)
        sink.start()
        changing.append(timed(sink, batch, window(schema, first, rows)))
        batch, first = batch + 1, first + rows
    return plain, changing


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for fmt in FORMATS:
            plain, changing = run(fmt, Path(folder), args.rows, args.rounds, args.warmup)
            results[fmt] = (statistics.median(plain), statistics.median(changing))
    print(f"{args.rows} rows a window, two tasks, {args.rounds} rounds; medians, ms a window")
    print(f"{'format':<10}{'plain':>10}{'schema change':>16}{'extra':>10}")
    for fmt, (plain_ms, change_ms) in results.items():
        print(f"{fmt:<10}{plain_ms:>10.1f}{change_ms:>16.1f}{change_ms - plain_ms:>10.1f}")
    for fmt, (plain_ms, change_ms) in results.items():
        print(f"plain_{fmt}_ms={plain_ms:.1f}")
        print(f"schema_change_{fmt}_ms={change_ms:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
