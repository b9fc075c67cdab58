"""Spark SQL's ``hash(...)`` over Arrow columns: Murmur3 x86 32-bit, seed 42, as Spark computes it.

Spark's ``HashPartitioning`` puts a row in partition ``pmod(hash(keys), N)``, where ``hash`` is
the ``Murmur3Hash`` expression: starting from the seed 42, each key column's value is hashed
with the previous column's hash as its seed, a null leaving it unchanged. The store places keys
by this same value (``engine/placement.py``), so the bucket of a key follows the partitioning
Spark gives the input. Every function here is a column operation over numpy arrays; the loops
run over columns, over the 4-byte words of strings and over their last bytes, never over rows.

Spark's own quirks are kept: integers up to 32 bits, dates and booleans hash as one int,
longs and timestamps as two; floats and doubles as their bits with ``-0.0`` folded into
``0.0`` and every NaN the canonical one; strings and binaries by ``hashUnsafeBytes``, whose
trailing bytes (after the last whole word) are each mixed as a sign-extended int; decimals of
up to 18 digits as their unscaled long, larger ones by the bytes of ``BigInteger.toByteArray``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from dedupsink.engine.fingerprint import UnsupportedKeyType

SEED = 42
_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_U32 = np.uint32
# Decimals of at most this many digits hash as their unscaled long (Decimal.MAX_LONG_DIGITS).
_MAX_LONG_DIGITS = 18


def spark_hashable(types: Sequence[pa.DataType]) -> bool:
    """Whether every type is one this module hashes exactly as Spark does."""
    return all(_supported(kind) for kind in types)


def _supported(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _supported(kind.value_type)
    return (
        pa.types.is_null(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_signed_integer(kind)
        or (pa.types.is_floating(kind) and kind.bit_width in (32, 64))
        or pa.types.is_date32(kind)
        or pa.types.is_timestamp(kind)
        or _is_bytes(kind)
        or pa.types.is_decimal128(kind)
    )


def _is_bytes(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_binary_view(kind)
    )


def spark_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` of each row, as int32."""
    n = len(columns[0]) if columns else 0
    h = np.full(n, SEED, dtype=_U32)
    with np.errstate(over="ignore"):
        for column in columns:
            array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
            if pa.types.is_dictionary(array.type):
                array = array.dictionary_decode()
            _hash_column(array, h)
    return h.view(np.int32)


def hash_int(value: int, seed: int = SEED) -> int:
    """``Murmur3_x86_32.hashInt(value, seed)`` as a signed 32-bit int."""
    h = np.array([seed], dtype=np.int64).astype(_U32)
    with np.errstate(over="ignore"):
        _hash_ints(np.array([value], dtype=np.int64).astype(np.int32).view(_U32), h, None)
    return int(h.view(np.int32)[0])


def _hash_column(array: pa.Array, h: np.ndarray) -> None:
    """Hash ``array``'s values into ``h`` (each row's running hash), skipping nulls."""
    kind = array.type
    if pa.types.is_null(kind) or len(array) == 0:
        return
    valid = None if array.null_count == 0 else np.asarray(array.is_valid())
    if pa.types.is_boolean(kind):
        ints = np.asarray(array.fill_null(False), dtype=bool).astype(_U32)
        _hash_ints(ints, h, valid)
    elif (pa.types.is_signed_integer(kind) and kind.bit_width <= 32) or pa.types.is_date32(kind):
        values = np.asarray(array.cast(pa.int32()).fill_null(0), dtype=np.int32)
        _hash_ints(values.view(_U32), h, valid)
    elif pa.types.is_int64(kind):
        _hash_longs(np.asarray(array.fill_null(0), dtype=np.int64), h, valid)
    elif pa.types.is_timestamp(kind):
        micros = array.cast(pa.timestamp("us", kind.tz), safe=False).cast(pa.int64())
        _hash_longs(np.asarray(micros.fill_null(0), dtype=np.int64), h, valid)
    elif pa.types.is_float32(kind):
        values = np.asarray(array.fill_null(0.0), dtype=np.float32)
        values = np.where(values == 0.0, np.float32(0.0), values)  # -0.0 hashes as 0.0
        values = np.where(np.isnan(values), np.float32(np.nan), values)  # floatToIntBits' NaN
        _hash_ints(values.astype(np.float32).view(_U32), h, valid)
    elif pa.types.is_float64(kind):
        values = np.asarray(array.fill_null(0.0), dtype=np.float64)
        values = np.where(values == 0.0, 0.0, values)
        values = np.where(np.isnan(values), np.nan, values)
        _hash_longs(values.view(np.int64), h, valid)
    elif _is_bytes(kind):
        _hash_variable(array, h, valid)
    elif pa.types.is_decimal128(kind):
        _hash_decimals(array, h, valid)
    else:
        raise UnsupportedKeyType(f"Spark's hash of a key column of type {kind} is not computed")


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _U32(5) + _U32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray | np.uint32) -> np.ndarray:
    h1 = h1 ^ length
    h1 = h1 ^ (h1 >> _U32(16))
    h1 = h1 * _U32(0x85EBCA6B)
    h1 = h1 ^ (h1 >> _U32(13))
    h1 = h1 * _U32(0xC2B2AE35)
    return h1 ^ (h1 >> _U32(16))


def _store(h: np.ndarray, new: np.ndarray, valid: np.ndarray | None) -> None:
    if valid is None:
        h[:] = new
    else:
        h[valid] = new[valid]


def _hash_ints(values: np.ndarray, h: np.ndarray, valid: np.ndarray | None) -> None:
    _store(h, _fmix(_mix_h1(h, _mix_k1(values)), _U32(4)), valid)


def _hash_longs(values: np.ndarray, h: np.ndarray, valid: np.ndarray | None) -> None:
    words = values.astype(np.int64).view(_U32).reshape(-1, 2)  # little-endian: low, then high
    h1 = _mix_h1(h, _mix_k1(words[:, 0]))
    h1 = _mix_h1(h1, _mix_k1(words[:, 1]))
    _store(h, _fmix(h1, _U32(8)), valid)


def _hash_variable(array: pa.Array, h: np.ndarray, valid: np.ndarray | None) -> None:
    kind = array.type
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        array = array.cast(pa.large_binary())
        kind = array.type
    large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.empty(0, np.uint8)
    )
    starts, lengths = offsets[:-1], np.diff(offsets)
    _store(h, _hash_bytes(data, starts, lengths, h), valid)


def _hash_bytes(
    data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    """``hashUnsafeBytes`` of each row's ``data[start:start + length]``, rows of one length at a
    time: their bytes as one matrix, whose aligned part is read as little-endian words."""
    result = np.empty_like(seeds)
    if len(lengths) and (lengths == lengths[0]).all():
        groups = [np.arange(len(lengths))]  # ids, UUIDs, fixed codes: the usual key
    else:
        order = np.argsort(lengths, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1)
    for rows in groups:
        length = int(lengths[rows[0]])
        result[rows] = _fmix(
            _hash_equal_length(data, starts[rows], length, seeds[rows]), _U32(length)
        )
    return result


def _hash_equal_length(
    data: np.ndarray, starts: np.ndarray, length: int, h1: np.ndarray
) -> np.ndarray:
    """The running hashes ``h1`` after the bytes of rows of ``length`` bytes each."""
    if length == 0:
        return h1
    if (np.diff(starts) == length).all() and starts[0] + len(starts) * length <= len(data):
        matrix = data[starts[0] : starts[0] + len(starts) * length].reshape(-1, length)
    else:
        matrix = data[starts[:, None] + np.arange(length)]
    whole = length // 4
    if whole:
        words = np.ascontiguousarray(matrix[:, : 4 * whole]).view("<u4")
        for word in range(whole):
            h1 = _mix_h1(h1, _mix_k1(words[:, word]))
    for byte in range(4 * whole, length):
        signed = np.ascontiguousarray(matrix[:, byte]).view(np.int8).astype(np.int32)
        h1 = _mix_h1(h1, _mix_k1(signed.view(_U32)))
    return h1


def _hash_decimals(array: pa.Array, h: np.ndarray, valid: np.ndarray | None) -> None:
    """Decimals as Spark hashes them: their unscaled long up to 18 digits, else the minimal
    big-endian two's-complement bytes of the unscaled value (``BigInteger.toByteArray``)."""
    raw = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    raw = raw[16 * array.offset : 16 * (array.offset + len(array))].reshape(-1, 16)
    if array.type.precision <= _MAX_LONG_DIGITS:
        low = np.ascontiguousarray(raw[:, :8]).view(np.int64).reshape(-1)
        _hash_longs(low, h, valid)
        return
    big_endian = np.ascontiguousarray(raw[:, ::-1])
    sign = np.where(big_endian[:, 0] >= 0x80, 0xFF, 0x00).astype(np.uint8)
    # A leading byte is redundant while it equals the sign and the next byte's top bit agrees.
    redundant = (big_endian[:, :15] == sign[:, None]) & (
        (big_endian[:, 1:] & 0x80) == (sign[:, None] & 0x80)
    )
    skipped = np.cumprod(redundant, axis=1).sum(axis=1)
    starts = np.arange(len(big_endian), dtype=np.int64) * 16 + skipped
    lengths = 16 - skipped.astype(np.int64)
    _store(h, _hash_bytes(big_endian.reshape(-1), starts, lengths, h), valid)
