"""Spark SQL's ``hash(...)`` over Arrow columns: Murmur3 x86 32-bit, seed 42, as Spark computes it.

Spark's ``HashPartitioning`` puts a row in partition ``pmod(hash(keys), N)``, where ``hash`` is
the ``Murmur3Hash`` expression: starting from the seed 42, each key column's value is hashed
with the running hash as its seed, a null leaving it unchanged. The store places keys by this
same value (``engine/placement.py``), so the bucket of a key follows the partitioning Spark gives
the input. It runs on every row of every batch, so every step is a numpy operation over a whole
column: the loops run over columns, over the 4-byte word positions of strings and over their
last bytes, never over rows.

Spark's own quirks are kept, type by type as Spark's Arrow conversion hands the columns over:

- booleans (as 1 or 0), bytes, shorts, ints and dates hash as one int (``hashInt``); longs and
  timestamps (microseconds, with a time zone or without) as one long (``hashLong``);
- floats and doubles as their bits (``floatToIntBits``, ``doubleToLongBits``), with ``-0.0``
  hashed as ``0.0`` and every NaN as the canonical one;
- strings and binaries by the legacy ``hashUnsafeBytes`` over their bytes: little-endian 4-byte
  words, then each trailing byte *sign-extended* and mixed as a word of its own, then the
  finalizer with the byte length;
- decimals of at most 18 digits (the type's precision) as their unscaled long, larger ones by
  ``hashUnsafeBytes`` over ``BigInteger.toByteArray()`` of the unscaled value (minimal
  big-endian two's complement).

Anything else (unsigned integers, nested types, nanosecond timestamps, ...) is refused: a value
that is not Spark's would put keys in buckets that do not follow Spark's partitioning.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from dedupsink.engine.fingerprint import UnsupportedKeyType

__all__ = ["SEED", "hash_int", "spark_hash", "spark_hashable"]

SEED = 42

_U32 = np.uint32
_U64 = np.uint64
_C1 = _U32(0xCC9E2D51)
_C2 = _U32(0x1B873593)
_H_MUL = _U32(5)
_H_ADD = _U32(0xE6546B64)
_F1 = _U32(0x85EBCA6B)
_F2 = _U32(0xC2B2AE35)
_INT_BYTES = _U32(4)
_LONG_BYTES = _U32(8)
# What Java's floatToIntBits and doubleToLongBits give for every NaN.
_FLOAT_NAN = _U32(0x7FC00000)
_DOUBLE_NAN = _U64(0x7FF8000000000000)
# Decimals of at most this many digits hash as their unscaled long (Spark's MAX_LONG_DIGITS).
_MAX_LONG_DIGITS = 18
# 2^(8k - 1) for k = 1..8: a non-negative value reaching k of them needs k + 1 bytes with a sign.
_BYTE_LIMITS = np.array([1 << (8 * k - 1) for k in range(1, 9)], dtype=_U64)
# Spark's timestamps are microseconds; coarser units convert to them exactly, finer ones do not.
_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
_SMALL_INTS = {8: "<i1", 16: "<i2", 32: "<i4"}


def spark_hashable(types: Sequence[pa.DataType]) -> bool:
    """Whether every type is one this module hashes exactly as Spark does."""
    return all(_supported(kind) for kind in types)


def spark_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` of each row, as an int32 array.

    Columns of one length, hashed in order, each value with the running hash as its seed;
    a null leaves the running hash unchanged. Raises ``UnsupportedKeyType`` for a column of a
    type ``spark_hashable`` refuses."""
    if not columns:
        raise ValueError("Spark's hash takes at least one column")
    rows = len(columns[0])
    for column in columns:
        if not _supported(column.type):
            raise UnsupportedKeyType(
                f"a key column of type {column.type} has no Spark hash computed here"
            )
        if len(column) != rows:
            raise ValueError(f"columns of {rows} and {len(column)} rows")
    h = np.full(rows, SEED, dtype=_U32)
    for column in columns:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        start = 0
        for chunk in chunks:
            # A slice of h is a view: each chunk updates its own rows in place.
            _hash_into(chunk, h[start : start + len(chunk)])
            start += len(chunk)
    return h.view(np.int32)


def hash_int(value: int, seed: int = SEED) -> int:
    """``Murmur3_x86_32.hashInt(value, seed)``, as a signed 32-bit int.

    ``value`` must be a 32-bit int: a larger literal is a long to Spark, hashed otherwise."""
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{value} is not a 32-bit int")
    seeds = np.array([seed & 0xFFFF_FFFF], dtype=_U32)
    hashed = _hash_ints(np.array([value], dtype=np.int32).view(_U32), seeds)
    return int(hashed.view(np.int32)[0])


def _supported(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _supported(kind.value_type)
    return (
        pa.types.is_null(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_signed_integer(kind)
        or pa.types.is_float32(kind)
        or pa.types.is_float64(kind)
        or pa.types.is_date32(kind)
        or (pa.types.is_timestamp(kind) and kind.unit in _MICROS_PER_UNIT)
        or _is_bytes(kind)
        or _is_view(kind)
        or pa.types.is_decimal128(kind)
    )


def _is_bytes(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def _is_view(kind: pa.DataType) -> bool:
    return pa.types.is_string_view(kind) or pa.types.is_binary_view(kind)


def _hash_into(array: pa.Array, h: np.ndarray) -> None:
    """Hash each row's value of ``array`` into ``h``, its running hash, in place."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    rows = len(array)
    if rows == 0 or array.null_count == rows:  # a null type's column too
        return
    valid = None if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)
    # Null slots hold arbitrary values: they are hashed with the rest (selecting the valid rows
    # first costs more than the arithmetic) and their results dropped at the end.
    if pa.types.is_boolean(kind):
        bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        flags = np.unpackbits(bits, bitorder="little")[array.offset : array.offset + rows]
        new = _hash_ints(flags.astype(_U32), h)
    elif pa.types.is_signed_integer(kind) and kind.bit_width <= 32:
        # Java widens a byte or a short to an int with its sign, as astype does.
        values = _values(array, _SMALL_INTS[kind.bit_width])
        new = _hash_ints(values.astype(np.int32).view(_U32), h)
    elif pa.types.is_date32(kind):
        new = _hash_ints(_values(array, "<i4").view(_U32), h)
    elif pa.types.is_int64(kind):
        new = _hash_longs(_values(array, "<i8"), h)
    elif pa.types.is_timestamp(kind):
        micros = _values(array, "<i8")
        if kind.unit != "us":
            # Values past what microseconds in a long can hold are no Spark timestamp: they wrap.
            micros = micros * np.int64(_MICROS_PER_UNIT[kind.unit])
        new = _hash_longs(micros, h)
    elif pa.types.is_float32(kind):
        floats = _values(array, "<f4")
        ints = floats.view(_U32).copy()
        ints[floats == 0] = 0  # Spark tests f == -0.0f, true of 0.0 and -0.0 alike
        ints[np.isnan(floats)] = _FLOAT_NAN
        new = _hash_ints(ints, h)
    elif pa.types.is_float64(kind):
        doubles = _values(array, "<f8")
        longs = doubles.view(_U64).copy()
        longs[doubles == 0] = 0
        longs[np.isnan(doubles)] = _DOUBLE_NAN
        new = _hash_longs(longs, h)
    elif pa.types.is_decimal128(kind):
        new = _hash_decimals(array, h)
    else:
        new = _hash_variable(array, h)
    if valid is None:
        h[...] = new
    else:
        np.copyto(h, new, where=valid)


def _values(array: pa.Array, dtype: str) -> np.ndarray:
    """The values buffer of a fixed-width array as numpy, without a copy (read-only)."""
    values = np.frombuffer(array.buffers()[1], dtype=dtype)
    return values[array.offset : array.offset + len(array)]


# Murmur3_x86_32's steps. Each works in place on the array it is given, apart from _mix_k1, whose
# input is often a read-only view of an Arrow buffer.


def _rotl(x: np.ndarray, r: int) -> None:
    high = x >> _U32(32 - r)
    x <<= _U32(r)
    x |= high


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    k1 = k1 * _C1
    _rotl(k1, 15)
    k1 *= _C2
    return k1


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> None:
    h1 ^= k1
    _rotl(h1, 13)
    h1 *= _H_MUL
    h1 += _H_ADD


def _fmix(h1: np.ndarray, length: np.ndarray | np.uint32) -> None:
    h1 ^= length
    h1 ^= h1 >> _U32(16)
    h1 *= _F1
    h1 ^= h1 >> _U32(13)
    h1 *= _F2
    h1 ^= h1 >> _U32(16)


def _hash_ints(ints: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """``hashInt`` of each uint32 with its seed."""
    h1 = seeds.copy()
    _mix_h1(h1, _mix_k1(ints))
    _fmix(h1, _INT_BYTES)
    return h1


def _hash_longs(longs: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """``hashLong`` of each 64-bit value with its seed: the low int, then the high one."""
    bits = longs.view(_U64)
    h1 = seeds.copy()
    _mix_h1(h1, _mix_k1(bits.astype(_U32)))  # astype keeps the low 32 bits
    _mix_h1(h1, _mix_k1((bits >> _U64(32)).astype(_U32)))
    _fmix(h1, _LONG_BYTES)
    return h1


def _hash_decimals(array: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """Decimals as Spark hashes them, by the precision of their type (not of each value)."""
    if array.type.precision <= _MAX_LONG_DIGITS:
        # The value fits in a long, so the low half of its 128-bit two's complement is the long.
        low_halves = np.frombuffer(array.buffers()[1], dtype="<i8")[::2]
        return _hash_longs(low_halves[array.offset : array.offset + len(array)], seeds)
    halves = np.frombuffer(array.buffers()[1], dtype="<i8")
    halves = halves[2 * array.offset : 2 * (array.offset + len(array))].reshape(-1, 2)
    # BigInteger.toByteArray is bitLength / 8 + 1 bytes long, where bitLength is that of the
    # value with its bits inverted if it is negative; with no sign bit left, the number of
    # bytes follows from which powers 2^(8k - 1) the high half, or else the low half, reaches.
    sign = halves[:, 1] >> 63
    high = (halves[:, 1] ^ sign).view(_U64)
    low = (halves[:, 0] ^ sign).view(_U64)
    kept = np.where(
        high != 0,
        9 + np.searchsorted(_BYTE_LIMITS, high, side="right"),
        1 + np.searchsorted(_BYTE_LIMITS, low, side="right"),
    )
    big_endian = np.ascontiguousarray(halves.view(np.uint8)[:, ::-1]).reshape(-1)
    starts = np.arange(16, 16 * len(halves) + 1, 16, dtype=np.int64) - kept
    return _hash_bytes(big_endian, starts, kept.astype(np.int64), seeds)


def _hash_variable(array: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """Strings and binaries: their bytes as Arrow stores them (UTF-8 for strings, as Spark)."""
    if _is_view(array.type):
        array = array.cast(pa.large_binary())  # views keep short values inline: make them flat
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype="<i8" if large else "<i4")
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    if data_buffer is None:  # every value empty
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(data_buffer, dtype=np.uint8)
    return _hash_bytes(data, offsets[:-1], np.diff(offsets), seeds)


def _hash_bytes(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    """Spark's legacy ``hashUnsafeBytes`` of each row's ``data[start : start + length]``."""
    h1 = seeds.copy()
    if len(lengths) == 0:
        return h1
    length = int(lengths[0])
    if length and (lengths == length).all() and (np.diff(starts) == length).all():
        _mix_rows_of_one_length(data[starts[0] : starts[0] + len(starts) * length], length, h1)
        _fmix(h1, _U32(length))
        return h1
    words = lengths >> 2
    if words.max() > 0:
        _mix_words(data, starts, words, h1)
    # The trailing bytes: Java reads each as a signed byte and widens it to an int, so a byte of
    # 0x80 and above mixes as 0xFFFFFF80 and above (unlike the reference MurmurHash3).
    trailing = lengths & 3
    tail_starts = starts + (words << 2) if trailing.max() > 0 else starts
    for position in range(int(trailing.max())):
        rows = np.flatnonzero(trailing > position)
        signed = data[tail_starts[rows] + position].view(np.int8).astype(np.int32)
        part = h1[rows]
        _mix_h1(part, _mix_k1(signed.view(_U32)))
        h1[rows] = part
    _fmix(h1, lengths.astype(_U32))
    return h1


def _mix_rows_of_one_length(data: np.ndarray, length: int, h1: np.ndarray) -> None:
    """Mix rows of ``length`` bytes each, stored one after the other (ids, UUIDs, codes: the
    usual key), into ``h1`` in place: their bytes as one matrix, its words read column by
    column, with no index to gather through."""
    matrix = data.reshape(-1, length)
    whole = length >> 2
    if whole:
        words = np.ascontiguousarray(matrix[:, : whole << 2]).view("<u4")
        for word in range(whole):
            _mix_h1(h1, _mix_k1(words[:, word]))
    for position in range(whole << 2, length):
        signed = np.ascontiguousarray(matrix[:, position]).view(np.int8).astype(np.int32)
        _mix_h1(h1, _mix_k1(signed.view(_U32)))


def _mix_words(data: np.ndarray, starts: np.ndarray, words: np.ndarray, h1: np.ndarray) -> None:
    """Mix the whole 4-byte little-endian words of each row into ``h1``, in place.

    Rows start at any byte, and numpy gathers from an unaligned uint32 view several times slower
    than from an aligned one; so rows are taken by ``start % 4``, each group's words read from a
    uint32 array aligned on its own starts (a copy of the bytes it spans, unless the buffer
    happens to be aligned that way already)."""
    phases = starts & 3
    if phases.min() == phases.max() and words.min() > 0:
        # One group of every row (values of one length that is a multiple of 4, such as UUIDs):
        # no row index to gather through, h1 updated where it is.
        _mix_word_group(data, starts, words, h1)
        return
    for phase in range(4):
        rows = np.flatnonzero((phases == phase) & (words > 0))
        if len(rows):
            part = h1[rows]
            _mix_word_group(data, starts[rows], words[rows], part)
            h1[rows] = part


def _mix_word_group(
    data: np.ndarray, starts: np.ndarray, count: np.ndarray, h1: np.ndarray
) -> None:
    """``_mix_words`` for rows whose starts are equal modulo 4, each with at least one word."""
    first = int(starts.min())
    end = int((starts + (count << 2)).max())
    grid = data[first:end].view("<u4")  # (end - first) is a multiple of 4: one phase
    if not grid.flags.aligned:
        grid = grid.copy()
    index = (starts - first) >> 2
    most, fewest = int(count.max()), int(count.min())
    part, order = h1, None
    if fewest < most:
        # Rows in order of their number of words, most first, so those that still have a word
        # at position w are a prefix: each position is one slice, with no mask over all rows.
        key = (most - count).astype(np.uint16 if most < 2**16 else np.int64)
        order = np.argsort(key, kind="stable")  # a radix sort for 16-bit keys
        index, count, part = index[order], count[order], h1[order]
    below = np.cumsum(np.bincount(count, minlength=most + 1))  # rows with at most w words
    for word in range(most):
        active = len(index) - int(below[word])
        k1 = _mix_k1(grid[index[:active]])
        index[:active] += 1
        _mix_h1(part[:active], k1)
    if order is not None:
        h1[order] = part
