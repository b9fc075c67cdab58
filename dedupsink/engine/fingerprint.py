"""128-bit fingerprints of key columns, computed column-wise over Arrow with numpy.

A key (its columns, nested struct fields flattened in order) becomes two independent 64-bit
lanes ``(h1, h2)``, fed little-endian 64-bit words, with no Python per row. Among ``n``
remembered keys the chance of any false duplicate is at most n^2 / 2^129. The hash is not
keyed: it guards against accident, not against an adversary who picks keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

# pyarrow.compute (tens of ms to import) is imported by the functions that use it: Spark's
# planner and commit processes import this module for a query's first batch and need none.
from dedupsink.errors import DedupError

__all__ = [
    "FINALIZER_MULTIPLIERS",
    "Fingerprints",
    "UnsupportedKeyType",
    "fingerprint",
    "key_leaves",
]

_U64 = np.uint64
_STAGED_WORD = np.dtype("<u8")
_SEED_A = _U64(0x9E3779B97F4A7C15)
_SEED_B = _U64(0xC2B2AE3D27D4EB4F)
_K1 = _U64(0x87C37B91114253D5)
_K2 = _U64(0x4CF5AD432745937F)
_K3 = _U64(0x52DCE729DA3ED5B1)
_K4 = _U64(0x38495AB5A5E8F1C3)
_F1 = _U64(0xFF51AFD7ED558CCD)
_F2 = _U64(0xC4CEB9FE1A85EC53)
# MurmurHash3's 64-bit finalizer multipliers, which sequence dedup spreads ids with too.
FINALIZER_MULTIPLIERS = (_F1, _F2)
# _TAIL_MASKS[k] keeps the low k bytes of a little-endian word.
_TAIL_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=_U64)
_LONG_KEY_BYTES = 128  # longer values are digested first (see _feed_long)


class UnsupportedKeyType(DedupError, TypeError):
    """A key column has a type that cannot be fingerprinted (list, map, null)."""


@dataclass(frozen=True)
class Fingerprints:
    """Two aligned uint64 lanes, one entry per row."""

    h1: np.ndarray
    h2: np.ndarray

    def __len__(self) -> int:
        return len(self.h1)

    def take(self, rows: np.ndarray) -> Fingerprints:
        return Fingerprints(self.h1[rows], self.h2[rows])

    def __getitem__(self, rows: slice) -> Fingerprints:
        return Fingerprints(self.h1[rows], self.h2[rows])

    @staticmethod
    def concat(parts: Sequence[Fingerprints]) -> Fingerprints:
        return Fingerprints(
            np.concatenate([p.h1 for p in parts]), np.concatenate([p.h2 for p in parts])
        )

    def packed(self) -> memoryview:
        """16 bytes a key, ``h1`` then ``h2`` as little-endian words: how keys are staged."""
        words = np.empty((len(self.h1), 2), dtype=_STAGED_WORD)
        words[:, 0] = self.h1
        words[:, 1] = self.h2
        return memoryview(words.tobytes()) if not len(words) else words.data.cast("B")

    def as_arrow(self) -> pa.FixedSizeBinaryArray:
        """The fingerprints as 16-byte binaries, to use Arrow's C++ hash kernels on them."""
        buffer = pa.py_buffer(self.packed())
        return pa.Array.from_buffers(pa.binary(16), len(self.h1), [None, buffer])


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U64(r)) | (x >> _U64(64 - r))


def fmix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> _U64(33))
    x = x * _F1
    x = x ^ (x >> _U64(33))
    x = x * _F2
    return x ^ (x >> _U64(33))


class _State:
    """The running two-lane state of every row; words are fed for all rows or a subset."""

    def __init__(self, n: int) -> None:
        self.a = np.full(n, _SEED_A, dtype=_U64)
        self.b = np.full(n, _SEED_B, dtype=_U64)

    def feed(self, word: np.ndarray, rows: np.ndarray | None = None) -> None:
        if rows is None:
            _mix_into(self.a, self.b, word)
        else:
            a, b = self.a[rows], self.b[rows]
            _mix_into(a, b, word)
            self.a[rows] = a
            self.b[rows] = b

    def digest(self) -> Fingerprints:
        return Fingerprints(fmix64(self.a + _rotl(self.b, 17)), fmix64(self.b ^ (self.a * _K3)))


def _mix_into(a: np.ndarray, b: np.ndarray, word: np.ndarray) -> None:
    """One round for both lanes, in place (a temporary per lane, no other allocation)."""
    tmp = np.multiply(word, _K1)
    np.bitwise_xor(a, tmp, out=a)
    np.left_shift(a, _U64(31), out=tmp)
    np.right_shift(a, _U64(33), out=a)
    np.bitwise_or(a, tmp, out=a)
    np.multiply(a, _K2, out=a)
    np.multiply(word, _K3, out=tmp)
    np.bitwise_xor(b, tmp, out=b)
    np.left_shift(b, _U64(27), out=tmp)
    np.right_shift(b, _U64(37), out=b)
    np.bitwise_or(b, tmp, out=b)
    np.multiply(b, _K4, out=b)
    np.add(b, a, out=b)


def key_leaves(array: pa.Array) -> list[pa.Array]:
    """The scalar leaves of a key column, struct fields depth-first (parent nulls propagated)."""
    if pa.types.is_struct(array.type):
        leaves: list[pa.Array] = []
        for child in array.flatten():
            leaves.extend(key_leaves(child))
        return leaves
    if pa.types.is_dictionary(array.type):
        return [array.dictionary_decode()]
    return [array]


def fingerprint(columns: Sequence[pa.Array]) -> Fingerprints:
    """Fingerprint rows of the given key columns (values of null slots are arbitrary)."""
    n = len(columns[0]) if columns else 0
    state = _State(n)
    for column in columns:
        for leaf in key_leaves(column):
            _feed_leaf(state, leaf)
    with np.errstate(over="ignore"):
        return state.digest()


def _feed_leaf(state: _State, leaf: pa.Array) -> None:
    kind = leaf.type
    if (
        pa.types.is_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_large_binary(kind)
    ):
        _feed_variable(state, leaf)
    elif pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        _feed_variable(state, leaf.cast(pa.large_binary()))
    elif pa.types.is_fixed_size_binary(kind) or pa.types.is_decimal(kind):
        _feed_fixed_bytes(state, leaf)
    elif pa.types.is_boolean(kind):
        state.feed(np.asarray(leaf.cast(pa.uint8()).fill_null(0), dtype=np.uint8).astype(_U64))
    elif pa.types.is_floating(kind):
        values = np.asarray(leaf.cast(pa.float64()).fill_null(0.0), dtype=np.float64)
        # Equal numbers must give equal words: fold -0.0 into 0.0 and every NaN into one.
        values = np.where(values == 0.0, 0.0, values)
        values = np.where(np.isnan(values), np.nan, values)
        state.feed(values.view(_U64))
    elif pa.types.is_integer(kind):
        target = pa.uint64() if pa.types.is_unsigned_integer(kind) else pa.int64()
        state.feed(np.asarray(leaf.cast(target).fill_null(0)).view(_U64))
    elif pa.types.is_temporal(kind):
        width = pa.int32() if kind.bit_width == 32 else pa.int64()
        ints = leaf.view(width) if leaf.offset == 0 else leaf.cast(width, safe=False)
        state.feed(np.asarray(ints.fill_null(0)).astype(np.int64).view(_U64))
    elif pa.types.is_null(kind):
        state.feed(np.zeros(len(leaf), dtype=_U64))
    else:
        raise UnsupportedKeyType(f"a key column of type {kind} cannot be compared")


def _feed_variable(state: _State, leaf: pa.Array) -> None:
    """Feed strings/binaries word by word, then their length; rows grouped by word count."""
    offset_type = np.int64 if leaf.type in (pa.large_string(), pa.large_binary()) else np.int32
    _, offsets_buffer, data_buffer = leaf.buffers()[:3]
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)
    offsets = offsets[leaf.offset : leaf.offset + len(leaf) + 1].astype(np.int64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if leaf.null_count:
        lengths = np.where(leaf.is_null().to_numpy(zero_copy_only=False), 0, lengths)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else None
    if data is None or len(data) == 0:
        state.feed(lengths.astype(_U64))
        return
    back_to_back = len(lengths) and offsets[-1] - offsets[0] == len(lengths) * lengths[0]
    if back_to_back and (lengths == lengths[0]).all() and lengths[0] <= _LONG_KEY_BYTES:
        # Equal lengths (ids, UUIDs): the values lie back to back, so reshape, no gather. (A null
        # slot may still span bytes in the data buffer; then the general path below runs.)
        _feed_equal_length(state, data[offsets[0] : offsets[-1]], len(lengths), int(lengths[0]))
        return
    long_rows = lengths > _LONG_KEY_BYTES
    if long_rows.any():
        _feed_long(state, data, starts, lengths, np.flatnonzero(long_rows))
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = data
    windows = np.lib.stride_tricks.as_strided(padded, shape=(len(data) + 1, 8), strides=(1, 1))
    words_needed = np.where(long_rows, -1, (lengths + 7) // 8)
    for width in np.unique(words_needed[words_needed >= 0]):
        rows = np.flatnonzero(words_needed == width)
        row_starts, row_lengths = starts[rows], lengths[rows]
        for j in range(int(width)):
            remaining = np.clip(row_lengths - 8 * j, 0, 8)
            positions = np.minimum(row_starts + 8 * j, len(data))
            word = windows[positions].view(_U64).ravel() & _TAIL_MASKS[remaining]
            state.feed(word, rows)
        state.feed(row_lengths.astype(_U64), rows)


def _feed_long(
    state: _State, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray
) -> None:
    """Values over 128 bytes are rare (documents, blobs as keys): each is first digested to
    128 bits with BLAKE2b, one call per such value, so a 1 MB key costs one pass, not 131,072
    vector rounds. Which path a value takes depends only on its length, so it is stable."""
    digests = np.empty((len(rows), 2), dtype=_U64)
    for out, row in enumerate(rows.tolist()):
        value = data[starts[row] : starts[row] + lengths[row]].tobytes()
        digests[out] = np.frombuffer(hashlib.blake2b(value, digest_size=16).digest(), dtype="<u8")
    state.feed(np.ascontiguousarray(digests[:, 0]), rows)
    state.feed(np.ascontiguousarray(digests[:, 1]), rows)
    state.feed(lengths[rows].astype(_U64), rows)


def _feed_equal_length(state: _State, data: np.ndarray, n: int, length: int) -> None:
    words = (length + 7) // 8
    matrix = np.zeros((n, words * 8), dtype=np.uint8)
    matrix[:, :length] = data.reshape(n, length)
    as_words = matrix.view(_U64)
    for j in range(words):
        state.feed(np.ascontiguousarray(as_words[:, j]))
    state.feed(np.full(n, length, dtype=_U64))


def _feed_fixed_bytes(state: _State, leaf: pa.Array) -> None:
    width = leaf.type.byte_width
    words = (width + 7) // 8
    raw = np.frombuffer(leaf.buffers()[1], dtype=np.uint8)[
        leaf.offset * width : (leaf.offset + len(leaf)) * width
    ]
    matrix = np.zeros((len(leaf), words * 8), dtype=np.uint8)
    matrix[:, :width] = raw.reshape(len(leaf), width)
    as_words = matrix.view(_U64)
    for j in range(words):
        state.feed(np.ascontiguousarray(as_words[:, j]))


def first_occurrences(fps: Fingerprints, order: np.ndarray | None = None) -> np.ndarray:
    """A mask of the rows that hold the first copy of their fingerprint in this array
    (``order``: the rows sorted by ``h1``, when the caller has it)."""
    n = len(fps)
    if n == 0:
        return np.zeros(0, dtype=bool)
    # Sorting one lane is several times cheaper than hashing both, and most arrays repeat few
    # fingerprints: only rows whose h1 occurs twice need the exact pass over both lanes.
    ordered = np.sort(fps.h1) if order is None else fps.h1[order]
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated) == 0:
        return np.ones(n, dtype=bool)
    if 4 * len(repeated) > n:
        return _first_by_hash(fps)
    involved = _rows_holding(fps.h1, repeated)
    first = np.ones(n, dtype=bool)
    first[involved] = _first_by_hash(fps.take(involved))
    return first


def _rows_holding(words: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The indices of the words that may be among ``values``: all that are, and a few percent more
    that share a slot of a bit table on the top bits (harmless to the exact pass after)."""
    bits = max(12, min(22, int(32 * len(values)).bit_length()))
    shift = _U64(64 - bits)
    table = np.zeros(1 << bits, dtype=bool)
    table[values >> shift] = True
    return np.flatnonzero(table[words >> shift])


def _first_by_hash(fps: Fingerprints) -> np.ndarray:
    import pyarrow.compute as pc

    codes = np.asarray(pc.dictionary_encode(fps.as_arrow()).indices)
    # dictionary_encode numbers values in order of first appearance, so a row is a first copy
    # exactly when its code exceeds every code before it.
    running_max = np.maximum.accumulate(codes)
    first = np.empty(len(codes), dtype=bool)
    first[0] = True
    first[1:] = codes[1:] > running_max[:-1]
    return first
