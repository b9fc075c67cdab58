"""Expiry values of rows, per mode, as numpy arrays with a mask of rows that have none.

tupleTime: microseconds since the epoch (timestamps, dates, ISO-8601 strings); ordered: the
number itself (int64, or float64 for floating and decimal columns; NaN and infinities are not
values); categorical: the ordinal of the category in order of first appearance, known only for
categories the store has already committed (a new category is newer than the latest point).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# pyarrow.compute (tens of ms to import) is imported by the functions that use it: Spark's
# planner and commit processes import this module for a query's first batch and need none.
from dedupsink.engine.settings import Settings
from dedupsink.units import MICROS_PER_DAY, micros_per

# ISO-8601 as producers write it: a 'T' or a space, an offset (``Z``, ``+02:00``, ``+0200``) or
# none (read as UTC), and a fraction of a second, which Arrow's strptime has no directive for:
# it is cut off and added back (``_fraction_micros``).
_ISO_FORMATS = (
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S%z",
    "%Y-%m-%d %H:%M:%S%z",
    "%Y-%m-%d",
)
# Named groups, as Arrow's extract_regex requires; the replacement keeps the first.
_FRACTION = r"(?P<seconds>:\d\d)\.(?P<digits>\d{1,9})"
_INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass
class ExpiryValues:
    """Per-row expiry values; ``missing`` rows have none (null or not interpretable)."""

    values: np.ndarray
    missing: np.ndarray
    unreadable: np.ndarray  # present but not a value of the domain (bad text, NaN, infinity)
    new_category: np.ndarray | None = None  # categorical: rows whose category is not yet known
    category_codes: pa.Array | None = None  # categorical: category text per row


def _time_values(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_timestamp(kind):
        factor = micros_per(kind.unit)
        if factor is None:  # nanoseconds ("ns") always fit in microseconds
            micros = array.cast(pa.timestamp("us", tz=kind.tz), safe=False).view(pa.int64())
            return np.asarray(micros.fill_null(0)), np.zeros(len(array), dtype=bool)
        return _scaled(np.asarray(array.view(pa.int64()).fill_null(0), dtype=np.int64), factor)
    if pa.types.is_date(kind):
        days = np.asarray(array.cast(pa.date32()).view(pa.int32()).fill_null(0), dtype=np.int64)
        return _scaled(days, MICROS_PER_DAY)
    whole_seconds = pc.replace_substring_regex(array, _FRACTION, r"\1")
    parsed = None
    for layout in _ISO_FORMATS:
        attempt = pc.strptime(whole_seconds, format=layout, unit="us", error_is_null=True)
        attempt = attempt.cast(pa.timestamp("us"))  # zoned layouts give UTC: one type for all
        parsed = attempt if parsed is None else pc.coalesce(parsed, attempt)
        if parsed.null_count == array.null_count:  # every value read: a source writes one layout
            break
    assert parsed is not None
    unreadable = np.asarray(pc.and_(pc.is_null(parsed), pc.is_valid(array)).fill_null(False))
    micros = np.asarray(parsed.view(pa.int64()).fill_null(0))
    return micros + _fraction_micros(array), unreadable


def _fraction_micros(text: pa.Array) -> np.ndarray:
    """The fraction of a second of each ISO-8601 text, in whole microseconds (0 without one;
    digits beyond the sixth are cut, as a cast to microseconds truncates)."""
    import pyarrow.compute as pc

    digits = pc.struct_field(pc.extract_regex(text, _FRACTION), ["digits"])
    six = pc.utf8_slice_codeunits(pc.utf8_rpad(digits, width=6, padding="0"), 0, 6)
    return np.asarray(six.cast(pa.int64()).fill_null(0), dtype=np.int64)


def _scaled(units: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """``units * factor`` microseconds; a time beyond the microsecond range (some 292,000 years
    from 1970) is not a value: flagged, instead of wrapping around into a wrong time."""
    if factor == 1:
        return units, np.zeros(len(units), dtype=bool)
    limit = _INT64_MAX // factor
    outside = (units > limit) | (units < -limit)
    return np.where(outside, 0, units) * factor, outside


def _ordered_values(array: pa.Array, kind: str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.compute as pc

    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        target = pa.float64() if kind == "float" else pa.int64()
        converted = _cast_or_null(array, target)
        unreadable = np.asarray(pc.and_(pc.is_null(converted), pc.is_valid(array)).fill_null(False))
        array = converted
    else:
        unreadable = np.zeros(len(array), dtype=bool)
    if kind == "float":
        values = np.asarray(array.cast(pa.float64()).fill_null(0.0), dtype=np.float64)
        unreadable |= ~np.isfinite(values)
        return np.where(np.isfinite(values), values, 0.0), unreadable
    # Unsigned values beyond int64 are not values of the domain (flagged, not a crash).
    converted = _cast_or_null(array, pa.int64())
    unreadable |= np.asarray(pc.and_(pc.is_null(converted), pc.is_valid(array)).fill_null(False))
    return np.asarray(converted.fill_null(0), dtype=np.int64), unreadable


def _cast_or_null(array: pa.Array, target: pa.DataType) -> pa.Array:
    import pyarrow.compute as pc

    try:
        return array.cast(target)
    except pa.ArrowException:  # invalid text, or a conversion Arrow lacks
        # Text with some non-numbers: convert the distinct values one by one (few, not per row).
        distinct = pc.unique(array)
        converted = []
        for value in distinct.to_pylist():
            try:
                converted.append(
                    pa.scalar(value, array.type).cast(target).as_py() if value is not None else None
                )
            except pa.ArrowException:  # invalid text, or a conversion Arrow lacks
                converted.append(None)
        return pc.take(pa.array(converted, type=target), pc.index_in(array, value_set=distinct))


def expiry_values(
    array: pa.Array, settings: Settings, categories: Mapping[str, int]
) -> ExpiryValues:
    """Expiry values of one column for tupleTime, ordered or categorical mode."""
    import pyarrow.compute as pc

    missing = array.is_null().to_numpy(zero_copy_only=False)
    if settings.mode == "tupleTime":
        values, unreadable = _time_values(array)
        return ExpiryValues(values, missing, unreadable & ~missing)
    if settings.mode == "ordered":
        values, unreadable = _ordered_values(array, settings.stamp_kind)
        return ExpiryValues(values, missing, unreadable & ~missing)
    text = array if pa.types.is_string(array.type) else array.cast(pa.string())
    encoded = pc.dictionary_encode(text)
    names = encoded.dictionary.to_pylist()
    # One dictionary lookup per distinct category, not per row.
    ordinals = np.array([categories.get(name, -1) for name in names] + [-1], dtype=np.int64)
    codes = np.asarray(encoded.indices.fill_null(len(names)), dtype=np.int64)
    values = ordinals[codes]
    new_category = (values < 0) & ~missing
    unreadable = np.zeros(len(array), dtype=bool)
    return ExpiryValues(values, missing, unreadable, new_category, text)
