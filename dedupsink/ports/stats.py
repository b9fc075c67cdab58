"""Delta Lake file statistics from a Parquet footer, as delta-rs writes them.

Every ``add`` action of a Delta commit carries a JSON ``stats`` string: ``numRecords`` and, per
column, ``minValues``, ``maxValues`` and ``nullCount`` (struct fields as nested objects), which
readers use to skip files. The tasks work it out from the footer of each port file they write
(the writer's own column statistics, merged over row groups), so the commit reads no file.

The rules are delta-rs's (1.6.6, ``crates/core/src/writer/stats.rs`` and the parquet crate it
writes with), checked against its output by ``tests/test_delta_stats.py``:

* which columns: the leaves of the first ``delta.dataSkippingNumIndexedCols`` top-level columns
  (default 32, ``-1`` all; a struct takes one slot however many fields it has), or the columns
  ``delta.dataSkippingStatsColumns`` names;
* no statistics at all (not even ``nullCount``) for binary columns and for anything inside a
  list or a map;
* strings longer than 64 bytes cut to a 64-byte prefix at a character boundary, the maximum's
  last character then incremented (the parquet crate's ``statistics_truncate_length``);
* dates ``YYYY-MM-DD``; timestamps to the millisecond, the fraction only when the value has
  one, ``2026-01-01T00:00:00.120Z`` with a zone and ``2026-01-01 00:00:00.120`` without;
  decimals as JSON numbers (integers at scale 0); a non-finite float as ``null``.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dedupsink.errors import PortTableError

NUM_INDEXED_COLS = "delta.dataSkippingNumIndexedCols"
NUM_INDEXED_COLS_DEFAULT = 32
STATS_COLUMNS = "delta.dataSkippingStatsColumns"
# The parquet crate's default statistics_truncate_length, which delta-rs's writer keeps.
STRING_PREFIX_BYTES = 64
_EPOCH = datetime.date(1970, 1, 1).toordinal()
_UNIT_PER_SECOND = {"milliseconds": 1_000, "microseconds": 1_000_000, "nanoseconds": 10**9}


@dataclass(frozen=True)
class StatsColumns:
    """Which columns of a Delta table get statistics: the leaves of the first ``indexed``
    top-level columns (-1: all), or, when the table names them, the columns ``named``."""

    indexed: int = NUM_INDEXED_COLS_DEFAULT
    named: tuple[tuple[str, ...], ...] | None = None

    @classmethod
    def of_configuration(cls, configuration: Mapping[str, str | None]) -> StatsColumns:
        """The columns a table's configuration asks statistics for."""
        named = configuration.get(STATS_COLUMNS)
        if named is not None:
            paths = tuple(_column_path(name) for name in named.split(",") if name.strip())
            return cls(named=paths)
        text = configuration.get(NUM_INDEXED_COLS)
        if text is None:
            return cls()
        try:
            indexed = int(text)
        except ValueError:
            indexed = -2
        if indexed < -1:
            raise PortTableError(
                f"the Delta table property {NUM_INDEXED_COLS}={text!r} is not an integer "
                "of -1 or more"
            )
        return cls(indexed=indexed)

    def chosen(self, leaves: list[tuple[str, ...]]) -> list[int]:
        """The positions of the leaf columns (paths in file order) that get statistics."""
        if self.named is not None:
            named = self.named
            return [i for i, path in enumerate(leaves) if any(path[: len(n)] == n for n in named)]
        if self.indexed == -1:
            return list(range(len(leaves)))
        chosen: list[int] = []
        tops: set[str] = set()
        for i, path in enumerate(leaves):
            if path[0] not in tops:
                if len(tops) >= self.indexed:
                    break
                tops.add(path[0])
            chosen.append(i)
        return chosen


def _column_path(name: str) -> tuple[str, ...]:
    """A column named in ``delta.dataSkippingStatsColumns``: dotted parts, each optionally in
    backticks (a name holding a dot)."""
    parts: list[str] = []
    current, quoted, text = "", False, name.strip()
    for char in text:
        if char == "`":
            quoted = not quoted
        elif char == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return tuple(parts)


def delta_stats(metadata: pq.FileMetaData, columns: StatsColumns) -> str:
    """The ``stats`` JSON of a Delta ``add`` action for the Parquet file ``metadata`` is the
    footer of."""
    leaves = _leaf_paths(metadata.schema.to_arrow_schema())
    if len(leaves) != metadata.num_columns:
        raise PortTableError(
            f"a Parquet footer lists {metadata.num_columns} columns where its schema has "
            f"{len(leaves)} leaves"
        )
    minimums: dict[str, Any] = {}
    maximums: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    for index in columns.chosen(leaves):
        merged = _merged(metadata, index)
        if merged is None:
            continue
        low, high, null_count = merged
        *parents, name = leaves[index]
        targets = [_nested(d, parents) for d in (minimums, maximums, nulls)]
        if low is not None:
            targets[0][name] = _json_value(low)
        if high is not None:
            targets[1][name] = _json_value(high)
        targets[2][name] = null_count
    stats = {
        "numRecords": metadata.num_rows,
        "minValues": minimums,
        "maxValues": maximums,
        "nullCount": nulls,
    }
    return json.dumps(stats, separators=(",", ":"), ensure_ascii=False)


def _leaf_paths(schema: pa.Schema) -> list[tuple[str, ...]]:
    """Each Parquet leaf column's path, in file order; a leaf inside a list or a map is marked
    by an empty last part (it never gets statistics)."""
    leaves: list[tuple[str, ...]] = []

    def walk(kind: pa.DataType, path: tuple[str, ...], repeated: bool) -> None:
        if pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                walk(kind.field(i).type, (*path, kind.field(i).name), repeated)
        elif pa.types.is_map(kind):
            walk(kind.key_type, path, True)
            walk(kind.item_type, path, True)
        elif (
            pa.types.is_list(kind)
            or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)
        ):
            walk(kind.value_type, path, True)
        else:
            leaves.append((*path, "") if repeated else path)

    for field in schema:
        walk(field.type, (field.name,), False)
    return leaves


def _nested(stats: dict[str, Any], parents: list[str]) -> dict[str, Any]:
    for part in parents:
        stats = stats.setdefault(part, {})
    return stats


def _merged(metadata: pq.FileMetaData, index: int) -> tuple[Any, Any, int] | None:
    """A column's minimum, maximum (None: unknown) and null count over the row groups; None for
    a column that gets no statistics (binary, repeated, or none written)."""
    column = metadata.schema.column(index)
    if column.max_repetition_level > 0:
        return None
    logical = json.loads(column.logical_type.to_json())
    if column.physical_type == "BYTE_ARRAY" and logical.get("Type") != "String":
        return None
    low: Any = None
    high: Any = None
    nulls = 0
    found = False
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None:
            continue
        found = True
        nulls += stats.null_count if stats.has_null_count else 0
        if not stats.has_min_max:
            continue
        group_low = _scalar(stats.min_raw, column, logical, True)
        group_high = _scalar(stats.max_raw, column, logical, False)
        low = group_low if low is None else low if group_low is None else min(low, group_low)
        high = group_high if high is None else high if group_high is None else max(high, group_high)
    return (low, high, nulls) if found else None


class _Formatted(str):
    """A statistic already in its JSON form, compared as its underlying value."""

    value: Any

    def __new__(cls, text: str, value: Any) -> _Formatted:
        made = super().__new__(cls, text)
        made.value = value
        return made

    def __lt__(self, other: object) -> bool:
        return bool(self.value < other.value) if isinstance(other, _Formatted) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return bool(self.value > other.value) if isinstance(other, _Formatted) else NotImplemented


def _scalar(raw: Any, column: Any, logical: dict[str, Any], is_min: bool) -> Any:
    """One row group's minimum or maximum as delta-rs reads it; None where it reads none."""
    kind = logical.get("Type")
    physical = column.physical_type
    if physical == "BOOLEAN" or physical in ("FLOAT", "DOUBLE"):
        return raw
    if physical in ("INT32", "INT64"):
        if kind == "Date" and physical == "INT32":
            return _date(raw)
        if kind == "Timestamp" and physical == "INT64":
            return _timestamp(raw, logical)
        if kind == "Decimal":
            return _Decimal(raw / _powi(10.0, int(logical["scale"])), int(logical["scale"]))
        return raw
    if physical == "BYTE_ARRAY":  # a string: binary columns have no statistics
        cut = _cut_min(raw) if is_min else _cut_max(raw)
        try:
            return cut.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if physical == "FIXED_LEN_BYTE_ARRAY" and kind == "Decimal":
        return _fixed_decimal(raw, int(logical["precision"]), int(logical["scale"]))
    if physical == "FIXED_LEN_BYTE_ARRAY" and kind == "UUID" and len(raw) == 16:
        return str(uuid.UUID(bytes=raw))
    return None


class _Decimal(float):
    """A decimal statistic: a float, written as an integer at scale 0."""

    scale: int

    def __new__(cls, value: float, scale: int) -> _Decimal:
        made = super().__new__(cls, value)
        made.scale = scale
        return made


def _fixed_decimal(raw: bytes, precision: int, scale: int) -> _Decimal | None:
    if len(raw) > 16:
        return None
    value = float(int.from_bytes(raw, "big", signed=True)) / _powi(10.0, scale)
    # delta-rs steps a value whose integer part rounded beyond the precision one float towards
    # zero; the sign counts as a digit there, as it does in delta-rs.
    if _is_normal(value) and len(str(_saturate(math.trunc(value), 127))) > precision - scale:
        value = math.nextafter(value, 0.0)
    return _Decimal(value, scale)


def _powi(base: float, exponent: int) -> float:
    """``base ** exponent`` by repeated squaring, as Rust's ``f64::powi`` works it out (for
    scales above 22 it can differ from ``pow`` in the last bit)."""
    result, negative, n = 1.0, exponent < 0, abs(exponent)
    while True:
        if n & 1:
            result *= base
        n //= 2
        if n == 0:
            break
        base *= base
    return 1 / result if negative else result


def _is_normal(value: float) -> bool:
    return math.isfinite(value) and abs(value) >= 2.2250738585072014e-308


def _saturate(value: int, bits: int) -> int:
    return max(-(2**bits), min(2**bits - 1, value))


def _date(days: int) -> _Formatted | None:
    try:
        day = datetime.date.fromordinal(_EPOCH + days)
    except (ValueError, OverflowError):
        return None
    return _Formatted(f"{day.year:04d}-{day.month:02d}-{day.day:02d}", days)


def _timestamp(value: int, logical: dict[str, Any]) -> _Formatted | None:
    per_second = _UNIT_PER_SECOND.get(str(logical.get("timeUnit")))
    if per_second is None:
        return None
    seconds, fraction = divmod(value, per_second)
    days, second_of_day = divmod(seconds, 86_400)
    day = _date(days)
    if day is None:
        return None
    hours, rest = divmod(second_of_day, 3_600)
    clock = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    # Milliseconds, written only when the value has a fraction at all.
    millis = f".{fraction * 1_000 // per_second:03d}" if fraction else ""
    if logical.get("isAdjustedToUTC"):
        return _Formatted(f"{day}T{clock}{millis}Z", value)
    return _Formatted(f"{day} {clock}{millis}", value)


def _cut_min(data: bytes) -> bytes:
    """A string minimum cut to at most ``STRING_PREFIX_BYTES`` at a character boundary."""
    if len(data) <= STRING_PREFIX_BYTES:
        return data
    for split in range(STRING_PREFIX_BYTES, 0, -1):
        if _boundary(data, split):
            return data[:split]
    return data


def _cut_max(data: bytes) -> bytes:
    """A string maximum cut as the minimum, its last character then incremented so that the
    prefix stays above the value; kept whole when no character can be."""
    if len(data) <= STRING_PREFIX_BYTES:
        return data
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # not a string: read as none later
    for split in range(STRING_PREFIX_BYTES, STRING_PREFIX_BYTES - 4, -1):
        if _boundary(data, split):
            return _incremented(data[:split].decode("utf-8")) or data
    return data


def _boundary(data: bytes, at: int) -> bool:
    return at >= len(data) or (data[at] & 0xC0) != 0x80


def _incremented(text: str) -> bytes | None:
    """``text`` with its last character that has a successor of the same UTF-8 length replaced
    by it, and what follows that character dropped."""
    for at in range(len(text) - 1, -1, -1):
        code = ord(text[at]) + 1
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            continue
        if len(chr(code).encode()) == len(text[at].encode()):
            return (text[:at] + chr(code)).encode()
    return None


def _json_value(value: Any) -> Any:
    if isinstance(value, _Formatted):
        return str(value)
    if isinstance(value, _Decimal):
        if not math.isfinite(value):
            return None
        if value.scale == 0:
            return _saturate(int(math.copysign(math.floor(abs(value) + 0.5), value)), 63)
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # as serde_json writes a NaN or an infinity
    return value
