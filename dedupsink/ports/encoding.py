"""How port files are encoded: Parquet (snappy), dictionary encoding chosen per column.

Dictionary encoding pays off for repetitive columns (a user, a country) and is wasted on nearly
distinct ones (ids, payloads, timestamps): Parquet tries it, overflows the dictionary page and
falls back, which makes writing a port file markedly slower (bench/RESULTS.md). A column's
first rows decide, as in Spark's writer the first page does: a task's first rows of a schema,
for every port file it writes (``PortWriters``).
"""

from __future__ import annotations

from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

# pyarrow.compute (tens of ms to import) is imported by the functions that use it: Spark's
# planner and commit processes import this module for a query's first batch and need none.
from dedupsink.engine.settings import ERROR_COLUMN

_DICTIONARY_SAMPLE_ROWS = 1024
_DICTIONARY_MAX_DISTINCT = 0.5


def port_schema(port: str, schema: pa.Schema) -> pa.Schema:
    """A port's schema: the input's, and for ``error`` the reason column after it."""
    if port == "error":
        return schema.append(pa.field(ERROR_COLUMN, pa.string(), nullable=False))
    return schema


def dictionary_columns(data: pa.Table | pa.RecordBatch) -> list[str]:
    """The flat columns worth dictionary-encoding: few distinct values among the first rows."""
    if data.num_rows == 0:
        # An empty port file, which the commit writes for each port a window left empty: its
        # process then imports no pyarrow.compute (tens of ms) for nothing.
        return []
    import pyarrow.compute as pc

    sample = data.slice(0, _DICTIONARY_SAMPLE_ROWS)
    chosen = []
    for index, field in enumerate(sample.schema):
        if pa.types.is_nested(field.type):
            continue
        try:
            distinct = pc.count_distinct(sample.column(index), mode="all").as_py()
        except pa.ArrowException:
            continue  # a type Arrow cannot count (e.g. an extension type): plain encoding
        if distinct <= _DICTIONARY_MAX_DISTINCT * sample.num_rows:
            chosen.append(field.name)
    return chosen


def open_parquet_writer(
    handle: IO[bytes], first: pa.Table | pa.RecordBatch, dictionary: list[str] | None = None
) -> pq.ParquetWriter:
    """The Parquet writer of every port file, with its encodings chosen from its first rows
    (or the columns ``dictionary`` names, chosen from earlier rows of the same data)."""
    chosen = dictionary_columns(first) if dictionary is None else dictionary
    return pq.ParquetWriter(handle, first.schema, use_dictionary=chosen)


def read_parquet(handle: IO[bytes]) -> pa.Table:
    return pq.read_table(handle)
