"""Helpers to drive real streams through the dedup sink and read its ports back."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from servers import Remote

PORT_NAMES = ("unique", "duplicate", "expired", "error")
# Where a test's sink writes: a local directory, or a location on a storage server.
Output = Path | Remote


def as_remote(output: Output) -> Remote:
    return output if isinstance(output, Remote) else Remote(str(output), {})


def sink_target(output: Output) -> dict[str, str]:
    """The sink options that point it at ``output``: its path and storage options."""
    remote = as_remote(output)
    return {"path": remote.url, **remote.sink_options}


def _root(output: Output) -> tuple[Any, str]:
    remote = as_remote(output)
    fs = remote.fs()
    return fs, fs._strip_protocol(remote.url).rstrip("/")


def files_under(output: Output, folder: str = "") -> dict[str, int]:
    """Every file under ``output`` (or a folder of it) with its size, by relative path."""
    fs, root = _root(output)
    base = f"{root}/{folder}".rstrip("/")
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    return {
        name[len(base) + 1 :]: int(info.get("size") or 0)
        for name, info in found.items()
        if info.get("type") != "directory"
    }


def read_text(output: Output, relative: str) -> str:
    fs, root = _root(output)
    return bytes(fs.cat_file(f"{root}/{relative}")).decode()


def write_batches(input_dir: Path, batches: Sequence[pa.Table], start: int = 0) -> None:
    """One Parquet file per batch, named so the file source reads them in order."""
    input_dir.mkdir(parents=True, exist_ok=True)
    # The file source takes files oldest first; equal modification times would leave the order
    # to directory listing, so each file gets its own second (files added later stay newer).
    base = int(time.time()) - 3600
    for index, table in enumerate(batches, start=start):
        target = input_dir / f"batch-{index:05d}.parquet"
        pq.write_table(table, target)
        os.utime(target, (base + index, base + index))


def run_stream(
    spark: Any,
    input_dir: Path,
    output: Output,
    options: Mapping[str, str],
    checkpoint: Path,
    schema: Any = None,
    files_per_batch: int = 1,
    repartition: int | None = None,
) -> None:
    """Run the sink over every file of ``input_dir`` with availableNow, until done."""
    query = start_stream(
        spark,
        input_dir,
        {**sink_target(output), **options},
        checkpoint,
        schema=schema,
        files_per_batch=files_per_batch,
        repartition=repartition,
    )
    query.awaitTermination()


def read_port(output: Output, port: str) -> pa.Table:
    """A port read by pyarrow (which ignores _spark_metadata and _staging)."""
    fs, root = _root(output)
    return ds.dataset(f"{root}/{port}", filesystem=fs, format="parquet").to_table()


def port_values(output: Output, port: str, column: str) -> list[Any]:
    return sorted(read_port(output, port).column(column).to_pylist(), key=repr)


def spark_counts(spark: Any, output: Path) -> dict[str, int]:
    return {port: spark.read.parquet(str(output / port)).count() for port in PORT_NAMES}


def arrow_counts(output: Output) -> dict[str, int]:
    return {port: read_port(output, port).num_rows for port in PORT_NAMES}


# -- streams with any option set, format and master --------------------------------------------


def start_stream(
    spark: Any,
    input_dir: Path,
    options: Mapping[str, str],
    checkpoint: Path,
    *,
    schema: Any = None,
    files_per_batch: int = 1,
    repartition: int | None = None,
    sink_format: str = "dedup",
) -> Any:
    """Start an availableNow query with exactly ``options`` (``path`` included, or not)."""
    if schema is None:
        schema = spark.read.parquet(str(input_dir)).schema
    frame = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_batch)
        .parquet(str(input_dir))
    )
    if repartition:
        frame = frame.repartition(repartition)
    writer = frame.writeStream.format(sink_format)
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def run_jobs(spark: Any, jobs: Sequence[Mapping[str, Any]]) -> None:
    """Run streams described as JSON-able dicts (see ``run_script``), one after the other."""
    for job in jobs:
        start_stream(
            spark,
            Path(job["input"]),
            {"path": job["output"], **job.get("options", {})},
            Path(job["checkpoint"]),
            files_per_batch=job.get("files_per_batch", 1),
            repartition=job.get("repartition"),
            sink_format=job.get("format", "dedup"),
        ).awaitTermination()


def run_script(script: Path, argument: Mapping[str, Any], timeout: float = 300) -> None:
    """Run a test module as a script in its own process (its own SparkSession and master)."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(argument)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, f"{script.name} exited with {done.returncode}:\n{output}"


# -- streams whose re-sent copies carry their own, later expiry values -------------------------


def later_resends(
    seed: int, windows: int, step: int = 10, same_value: float = 0.2
) -> list[list[tuple[int | None, int | None]]]:
    """Windows of ``(key, expiry value)`` rows in which Assumption 1 does not hold.

    Window ``w`` spans values ``w * step`` to ``w * step + step - 1``. It brings 8 to 14 new keys
    with values in its span, and copies of keys first sent 1 to 5 windows earlier: most carry a
    value in their own window's span (a send time, later than the first copy's), a fraction
    ``same_value`` their first copy's value (a plain re-send, late by then). A key comes at most
    once a window, so which row of a window is unique never depends on row order or
    partitioning. About every other window also has a row with a null key and one with a null
    value. Rows are shuffled within a window.
    """
    rng = random.Random(seed)
    scheduled: dict[int, list[tuple[int, int | None]]] = {}  # window -> (key, kept value)
    out: list[list[tuple[int | None, int | None]]] = []
    keys = 0
    for window in range(windows):
        start = window * step
        rows: list[tuple[int | None, int | None]] = [
            (key, start + rng.randrange(step) if kept is None else kept)
            for key, kept in scheduled.pop(window, [])
        ]
        for _ in range(rng.randint(8, 14)):
            value = start + rng.randrange(step)
            rows.append((keys, value))
            for offset in rng.sample(range(1, 6), rng.randint(0, 3)):
                kept = value if rng.random() < same_value else None
                scheduled.setdefault(window + offset, []).append((keys, kept))
            keys += 1
        if rng.random() < 0.5:
            rows.append((None, start + rng.randrange(step)))
        if rng.random() < 0.5:
            rows.append((rng.randrange(keys), None))
        rng.shuffle(rows)
        out.append(rows)
    return out


# -- the reference model (tests/reference.py) over whole streams -----------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROS_PER_DAY = 86_400_000_000
_TIME_LAYOUTS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d")


def windows_of(batches: Sequence[pa.Table], files_per_batch: int = 1) -> list[pa.Table]:
    """The windows Spark makes of the input files with ``maxFilesPerTrigger``."""
    return [
        pa.concat_tables(batches[i : i + files_per_batch])
        for i in range(0, len(batches), files_per_batch)
    ]


def field_value(row: Mapping[str, Any], name: str) -> Any:
    """A top-level or dotted nested value; a null struct makes its children null."""
    value: Any = row
    for part in name.split("."):
        if value is None:
            return None
        value = value[part]
    return value


def time_micros(value: Any) -> Any:
    """A tupleTime expiry value: microseconds since the epoch, or the reference's BAD."""
    from reference import BAD

    if value is None:
        return None
    if isinstance(value, str):
        for layout in _TIME_LAYOUTS:
            try:
                value = datetime.strptime(value, layout)
                break
            except ValueError:
                continue
        else:
            return BAD
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return (value - EPOCH) // timedelta(microseconds=1)
    if isinstance(value, date):
        return (value - date(1970, 1, 1)).days * MICROS_PER_DAY
    return BAD


def reference_outputs(
    windows: Sequence[pa.Table],
    mode: str,
    keys: Sequence[str],
    expiry_key: str | None = None,
    period: float | None = None,
    max_jump: float | None = None,
) -> dict[str, Counter[tuple[Any, ...]]]:
    """Rows per port (as counters of row tuples) that docs/SEMANTICS.md gives for these windows.

    In systemTime mode window ``n`` happens at time ``n * 1000`` (as if windows were a second
    apart, in milliseconds); give ``period`` in the same unit.
    """
    from reference import ReferenceDedup

    model = ReferenceDedup(mode, period, max_jump)
    columns = windows[0].schema.names
    expected: dict[str, Counter[tuple[Any, ...]]] = {port: Counter() for port in PORT_NAMES}

    def key(row: dict[str, Any]) -> tuple[Any, ...] | None:
        parts = tuple(field_value(row, name) for name in keys)
        return None if any(part is None for part in parts) else frozen(parts)

    value: Callable[[dict[str, Any]], Any] = lambda row: None  # noqa: E731
    if expiry_key is not None:
        convert = time_micros if mode == "tupleTime" else (lambda v: v)
        value = lambda row: convert(field_value(row, expiry_key))  # noqa: E731
    for number, window in enumerate(windows):
        rows = window.to_pylist()
        ports = model.window(rows, key, value, window_time=number * 1000.0)
        for row, port in zip(rows, ports, strict=True):
            expected[port][frozen(tuple(row[c] for c in columns))] += 1
    return expected


def frozen(value: Any) -> Any:
    """A hashable form of a row value (structs become sorted item tuples)."""
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(frozen(v) for v in value)
    return value


def port_rows(output: Output, port: str, columns: Sequence[str]) -> Counter[tuple[Any, ...]]:
    """A port's rows over ``columns`` (the input's; ``_dedup_error`` left out)."""
    table = read_port(output, port).select(list(columns))
    return Counter(frozen(tuple(row[c] for c in columns)) for row in table.to_pylist())


def assert_matches_reference(
    output: Output, expected: Mapping[str, Counter[tuple[Any, ...]]], columns: Sequence[str]
) -> None:
    actual = {port: port_rows(output, port, columns) for port in PORT_NAMES}
    assert actual == dict(expected)


# -- what must hold of the ports after every scenario -----------------------------------------


def spark_log_names(output: Output, port: str) -> list[str]:
    return sorted(name for name in files_under(output, f"{port}/_spark_metadata"))


def expected_log_names(windows: int) -> list[str]:
    """Spark's file-sink log: one entry per window, every tenth a compaction."""
    return sorted(f"{i}.compact" if (i + 1) % 10 == 0 else str(i) for i in range(windows))


def logged_file_names(output: Output, port: str) -> set[str]:
    names: set[str] = set()
    for entry in spark_log_names(output, port):
        lines = read_text(output, f"{port}/_spark_metadata/{entry}").splitlines()
        assert lines[0] == "v1", f"{entry}: {lines[0]!r}"
        names.update(json.loads(line)["path"].rsplit("/", 1)[-1] for line in lines[1:] if line)
    return names


def port_file_names(output: Output, port: str) -> set[str]:
    """Every file in a port directory outside Spark's log, at any depth."""
    return {name for name in files_under(output, port) if "_spark_metadata" not in name.split("/")}


def check_ports(spark: Any, output: Output, columns: Sequence[str], windows: int) -> None:
    """The invariants of every scenario (docs/SEMANTICS.md, rule 6), whatever the rows.

    Spark (through ``_spark_metadata``) and pyarrow (through the directory) count the same rows
    (Spark reads local outputs only: it has no S3 connector here); every port has its schema
    even when empty; each window has one log entry per port, with contiguous ids and a
    compaction every ten; a port directory holds exactly the logged files, so nothing staged or
    left by a failed attempt is visible to any reader.
    """
    local = isinstance(output, Path)
    if local:
        assert spark_counts(spark, output) == arrow_counts(output)
    for port in PORT_NAMES:
        names = [*columns, "_dedup_error"] if port == "error" else list(columns)
        if local:
            assert spark.read.parquet(str(output / port)).columns == names, port
        assert read_port(output, port).schema.names == names, port
        assert spark_log_names(output, port) == expected_log_names(windows), port
        files = port_file_names(output, port)
        assert all("/" not in name and not name.startswith(("_", "."))
                   for name in files), files  # fmt: skip
        assert files == logged_file_names(output, port), port


def output_listing(output: Output) -> dict[str, int]:
    """Every file under ``output`` with its size: to show that nothing was written."""
    return files_under(output)
