"""Helpers to drive real streams through the dedup sink and read its ports back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

PORT_NAMES = ("unique", "duplicate", "expired", "error")


def write_batches(input_dir: Path, batches: Sequence[pa.Table], start: int = 0) -> None:
    """One Parquet file per batch, named so the file source reads them in order."""
    input_dir.mkdir(parents=True, exist_ok=True)
    for index, table in enumerate(batches, start=start):
        pq.write_table(table, input_dir / f"batch-{index:05d}.parquet")


def run_stream(
    spark: Any,
    input_dir: Path,
    output: Path,
    options: Mapping[str, str],
    checkpoint: Path,
    schema: Any = None,
    files_per_batch: int = 1,
    repartition: int | None = None,
) -> None:
    """Run the sink over every file of ``input_dir`` with availableNow, until done."""
    if schema is None:
        schema = spark.read.parquet(str(input_dir)).schema
    frame = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", files_per_batch)
        .parquet(str(input_dir))
    )
    if repartition:
        frame = frame.repartition(repartition)
    writer = frame.writeStream.format("dedup").option("path", str(output))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()


def read_port(output: Path, port: str) -> pa.Table:
    """A port read by pyarrow (which ignores _spark_metadata and _staging)."""
    return ds.dataset(str(output / port), format="parquet").to_table()


def port_values(output: Path, port: str, column: str) -> list[Any]:
    return sorted(read_port(output, port).column(column).to_pylist(), key=repr)


def spark_counts(spark: Any, output: Path) -> dict[str, int]:
    return {port: spark.read.parquet(str(output / port)).count() for port in PORT_NAMES}


def arrow_counts(output: Path) -> dict[str, int]:
    return {port: read_port(output, port).num_rows for port in PORT_NAMES}
