"""A sorted set of key fingerprints with their expiry values: one bucket's remembered keys.

Three aligned numpy arrays sorted by ``h1``, one entry per fingerprint (the largest stamp wins):
membership is a vectorised binary search, a merge one stable sort over two sorted runs.
``KeyFilter`` is the Bloom filter a bucket manager keeps over its large buckets: most lookups
are of keys never seen, which it turns away before the searches, whose cost grows with a bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dedupsink.engine.expiry_policy import is_alive, is_expired
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.sequence import NO_SEQUENCE


@dataclass(frozen=True)
class KeySet:
    h1: np.ndarray
    h2: np.ndarray
    stamps: np.ndarray | None  # None where keys carry no expiry value (Basic Dedup)
    shared_h1: bool = False  # two keys share an h1 (only ``_settle_repeats`` leaves them)
    # The arrays are a read-only map of a machine's shared file (store/shared.py), not memory
    # of this process: they count against no cache's byte bound.
    mapped: bool = False

    @classmethod
    def empty(cls, stamp_dtype: np.dtype | None) -> KeySet:
        stamps = None if stamp_dtype is None else np.empty(0, dtype=stamp_dtype)
        return cls(np.empty(0, np.uint64), np.empty(0, np.uint64), stamps)

    @classmethod
    def build(cls, h1: np.ndarray, h2: np.ndarray, stamps: np.ndarray | None) -> KeySet:
        """Sort by h1 and drop repeated fingerprints, keeping the largest stamp of each."""
        if len(h1) == 0:
            return cls(h1.astype(np.uint64), h2.astype(np.uint64), stamps)
        order = np.argsort(h1)
        h1, h2 = h1[order], h2[order]
        stamps = None if stamps is None else stamps[order]
        repeated = h1[1:] == h1[:-1]
        if repeated.any():
            return cls._settle_repeats(h1, h2, stamps, repeated)
        return cls(h1, h2, stamps)

    @classmethod
    def of_sorted(cls, h1: np.ndarray, h2: np.ndarray) -> KeySet:
        """Distinct fingerprints already sorted by h1, as a set without expiry values."""
        repeated = h1[1:] == h1[:-1]
        if repeated.any():  # a 64-bit collision: order its run as ``build`` does
            return cls._settle_repeats(h1, h2, None, repeated)
        return cls(h1, h2, None)

    @classmethod
    def _settle_repeats(
        cls, h1: np.ndarray, h2: np.ndarray, stamps: np.ndarray | None, repeated: np.ndarray
    ) -> KeySet:
        """Rows sharing h1 (the same key seen twice, or a 64-bit collision): order them by
        (h1, h2, stamp) and keep the last of each equal fingerprint."""
        in_run = np.zeros(len(h1), dtype=bool)
        in_run[1:] |= repeated
        in_run[:-1] |= repeated
        rows = np.flatnonzero(in_run)
        sort_keys = (h2[rows], h1[rows]) if stamps is None else (stamps[rows], h2[rows], h1[rows])
        rows = rows[np.lexsort(sort_keys)]
        last = np.ones(len(rows), dtype=bool)
        last[:-1] = (h1[rows][1:] != h1[rows][:-1]) | (h2[rows][1:] != h2[rows][:-1])
        keep = np.concatenate([np.flatnonzero(~in_run), rows[last]])
        keep.sort(kind="stable")
        # keep is in position order, and positions are sorted by h1 except inside the runs,
        # which were re-ordered by (h2, stamp): re-sort the few run rows by position order.
        order = np.argsort(h1[keep], kind="stable")
        keep = keep[order]
        h1 = h1[keep]
        shared = bool((h1[1:] == h1[:-1]).any())
        return cls(h1, h2[keep], None if stamps is None else stamps[keep], shared)

    def __len__(self) -> int:
        return len(self.h1)

    @property
    def stamp_dtype(self) -> np.dtype | None:
        return None if self.stamps is None else self.stamps.dtype

    @property
    def nbytes(self) -> int:
        stamps = 0 if self.stamps is None else self.stamps.nbytes
        return self.h1.nbytes + self.h2.nbytes + stamps

    def merge(self, other: KeySet) -> KeySet:
        """Both sets in one. A few keys go into a much larger set at their sorted positions,
        which copies the larger set once; otherwise the two are joined end to end and sorted
        with a stable sort, which finds them as two sorted runs and merges them in one pass
        (cheaper per key than placing, which wins only from ``_PLACE_FROM``).
        Sorting holds the joined lanes and the permutation beside the result, twice the
        transient memory of placing: merges larger than ``_SORT_UP_TO`` keys place."""
        if len(other) == 0:
            return self
        if len(self) == 0:
            return other
        big, small = (self, other) if len(self) >= len(other) else (other, self)
        if len(big) >= _PLACE_FROM * len(small) or len(big) + len(small) > _SORT_UP_TO:
            return big._placed(small)
        lanes = _lanes(big, small)
        h1 = np.concatenate(lanes[0])
        order = np.argsort(h1, kind="stable")
        h1 = h1[order]
        rest = [np.concatenate(pair)[order] for pair in lanes[1:]]
        h2, stamps = rest[0], (rest[1] if len(rest) == 2 else None)
        repeated = h1[1:] == h1[:-1]
        if repeated.any():
            return KeySet._settle_repeats(h1, h2, stamps, repeated)
        return KeySet(h1, h2, stamps)

    def _placed(self, small: KeySet) -> KeySet:
        """``small`` placed into this set at its sorted positions: one placement serves every
        lane, and repeated fingerprints can only meet where a key is placed (this set's
        neighbour at that position), so the check is as small as ``small``."""
        at = np.searchsorted(self.h1, small.h1, side="left")
        placed = at + np.arange(len(small))
        from_self = np.ones(len(self) + len(small), dtype=bool)
        from_self[placed] = False
        merged = []
        for own_lane, small_lane in _lanes(self, small):
            lane = np.empty(len(from_self), dtype=own_lane.dtype)
            lane[from_self] = own_lane
            lane[placed] = small_lane
            merged.append(lane)
        h1, h2 = merged[0], merged[1]
        stamps = merged[2] if len(merged) == 3 else None
        if _meets_repeats(self.h1, small.h1, at):
            return KeySet._settle_repeats(h1, h2, stamps, h1[1:] == h1[:-1])
        return KeySet(h1, h2, stamps, self.shared_h1 or small.shared_h1)

    def held_in(self, other: KeySet) -> np.ndarray:
        """For each key here: does ``other`` hold it with at least its stamp?

        Keys whose ``h1`` other holds more than once (a 64-bit collision) may be answered
        False: a merge settles those as usual."""
        if len(self) == 0 or len(other) == 0:
            return np.zeros(len(self), dtype=bool)
        at = np.searchsorted(other.h1[:-1], self.h1, side="left")  # clamped, as in contains
        held = (other.h1[at] == self.h1) & (other.h2[at] == self.h2)
        if self.stamps is not None and other.stamps is not None:
            held &= other.stamps[at] >= self.stamps
        return held

    def without(self, drop: np.ndarray) -> KeySet:
        """The keys not marked in ``drop`` (still sorted and distinct)."""
        keep = ~drop
        stamps = None if self.stamps is None else self.stamps[keep]
        return KeySet(self.h1[keep], self.h2[keep], stamps, self.shared_h1)

    def alive(self, forget_at_or_below: float | None) -> KeySet:
        """The keys still remembered once those stamped at or below the expiry point are gone."""
        stamps, forget = self.stamps, forget_at_or_below
        if forget is None or stamps is None or not self._may_hold_expired(forget):
            return self
        keep = is_alive(stamps, forget)
        return KeySet(self.h1[keep], self.h2[keep], stamps[keep], self.shared_h1)

    def contains(
        self, fps: Fingerprints, forget_at_or_below: float | None = None, presorted: bool = False
    ) -> np.ndarray:
        """For each query fingerprint: is it here with a stamp above the expiry point?
        ``presorted``: the queries are sorted by ``h1`` already."""
        if len(self) == 0 or len(fps) == 0:
            return np.zeros(len(fps), dtype=bool)
        query_h1, query_h2 = fps.h1, fps.h2
        # numpy's binary search narrows each search by the previous one when the queries are
        # sorted: sorting them first is several times faster than searching in row order.
        if not presorted:
            order = np.argsort(query_h1)
            query_h1, query_h2 = query_h1[order], query_h2[order]
        at, same_h1, hit = self._locate(query_h1, query_h2)
        stamps, forget = self.stamps, forget_at_or_below
        if forget is not None and stamps is not None and self._may_hold_expired(forget):
            hit &= is_alive(stamps[at], forget)
        if self.shared_h1:
            self._search_shared(query_h1, query_h2, forget_at_or_below, at, same_h1, hit)
        if presorted:
            return hit
        found = np.empty_like(hit)
        found[order] = hit
        return found

    def highest(self, fps: Fingerprints) -> np.ndarray:
        """For each query, sorted by ``h1``: its stamp here (sequence dedup: a producer's
        highest id), or ``NO_SEQUENCE`` if it is not here."""
        found = np.full(len(fps), NO_SEQUENCE, dtype=np.int64)
        if len(self) == 0 or len(fps) == 0 or self.stamps is None:
            return found
        at, same_h1, hit = self._locate(fps.h1, fps.h2)
        found[hit] = self.stamps[at[hit]]
        if self.shared_h1:  # a 64-bit collision: look along its run
            for row in np.flatnonzero(same_h1 & ~hit):
                run = slice(at[row], np.searchsorted(self.h1, fps.h1[row], side="right"))
                match = np.flatnonzero(self.h2[run] == fps.h2[row])
                if len(match):
                    found[row] = self.stamps[run][match[0]]
        return found

    def _locate(
        self, query_h1: np.ndarray, query_h2: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For queries sorted by ``h1``: the position of each one's first key of equal or larger
        ``h1``, whether that key has its ``h1``, and whether it is the query (both words)."""
        # Searching all keys but the last puts a query above them all at the last key, where
        # it is not found: the clamp a search of every key would need, without its pass.
        at = np.searchsorted(self.h1[:-1], query_h1, side="left")
        same_h1 = self.h1[at] == query_h1
        return at, same_h1, same_h1 & (self.h2[at] == query_h2)

    @cached_property
    def lowest_stamp(self) -> float | None:
        """The smallest stamp here (None without stamps, or empty)."""
        if self.stamps is None or len(self.stamps) == 0:
            return None
        return float(self.stamps.min())

    def an_eighth_expired(self, forget_at_or_below: float) -> bool:
        """Whether about an eighth of the keys here, or more, are at or below the expiry point."""
        if not self._may_hold_expired(forget_at_or_below):
            return False  # none expired: the rank's pass is spared
        return bool(is_expired(self._eighth_stamp, forget_at_or_below))

    @cached_property
    def _eighth_stamp(self) -> float:
        """The stamp an eighth of the way up (one pass over the stamps, once a set)."""
        assert self.stamps is not None  # only asked once _may_hold_expired found stamps
        rank = len(self) // 8
        return float(np.partition(self.stamps, rank)[rank])

    def _may_hold_expired(self, forget_at_or_below: float) -> bool:
        """Whether a stamp here may be at or below the expiry point. Most sets hold none, and
        skipping the stamp check spares three array passes a lookup."""
        lowest = self.lowest_stamp
        return lowest is not None and bool(is_expired(lowest, forget_at_or_below))

    def _search_shared(
        self,
        query_h1: np.ndarray,
        query_h2: np.ndarray,
        forget_at_or_below: float | None,
        at: np.ndarray,
        same_h1: np.ndarray,
        hit: np.ndarray,
    ) -> None:
        """Settle in ``hit`` the queries whose h1 several keys here share, one run at a time."""
        after = np.minimum(at + 1, len(self) - 1)
        for row in np.flatnonzero(same_h1 & (after > at) & (self.h1[after] == query_h1)):
            run = slice(at[row], np.searchsorted(self.h1, query_h1[row], side="right"))
            hits = self.h2[run] == query_h2[row]
            if forget_at_or_below is not None and self.stamps is not None:
                hits &= is_alive(self.stamps[run], forget_at_or_below)
            hit[row] = bool(hits.any())


class KeyFilter:
    """A blocked Bloom filter: each key sets up to four bits of one 64-bit word (the word from
    ``h1``'s top bits, the bits from ``h2``: ``h1``'s low bits are shared by a bucket's keys), so
    a probe is one memory access; a word lacking any of a query's bits means "not here". Bits
    are only ever set: a stale bit costs a search, never a wrong answer, so one filter serves
    the successive versions of its buckets."""

    def __init__(self, keys: int) -> None:
        words_log2 = _filter_bytes_log2(keys) - 3
        self.shift = np.uint64(64 - words_log2)
        self.bits = np.zeros(1 << words_log2, dtype=np.uint64)

    @property
    def capacity(self) -> int:
        """The keys it holds at its designed rate of bits a key."""
        return self.bits.nbytes * 8 // _FILTER_BITS_PER_KEY

    def add(self, h1: np.ndarray, h2: np.ndarray) -> None:
        words, masks = _as_index(h1 >> self.shift), _masks(h2)
        # One fancy-indexed OR costs a third of ``bitwise_or.at`` out of the caches, but of keys
        # sharing a word it keeps only the last one's bits: those short of theirs are set again.
        # A probe meanwhile may find a word without some of these keys' bits, never without
        # bits set before this add (the caller adds a version's keys before serving it).
        self.bits[words] |= masks
        short = (self.bits[words] & masks) != masks
        if short.any():
            np.bitwise_or.at(self.bits, words[short], masks[short])

    def may_contain(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        masks = _masks(h2)
        return (self.bits[_as_index(h1 >> self.shift)] & masks) == masks


def _masks(h2: np.ndarray) -> np.ndarray:
    """Each key's bits within its filter word: two from each of two 12-bit fields of ``h2``,
    one table lookup each (fewer numpy calls than shifting a one into place four times)."""
    low = _BIT_PAIRS[_as_index(h2 & _FIELD)]
    return np.bitwise_or(low, _BIT_PAIRS[_as_index((h2 >> _FIELD_BITS) & _FIELD)], out=low)


def _as_index(positions: np.ndarray) -> np.ndarray:
    """Unsigned positions below 2**63 as numpy's index type, without a copy: indexing with
    uint64 converts them first, which took a third to half of each filter lookup."""
    return positions.view(np.intp)


_FIELD_BITS = np.uint64(12)
_FIELD = np.uint64(4095)
# Field value -> the word with bits (value mod 64) and (value div 64) set; the two coincide
# for one value in 64, which then sets one bit.
_BIT_PAIRS = np.array([(1 << (pair & 63)) | (1 << (pair >> 6)) for pair in range(4096)], np.uint64)


# A merge places the smaller set into the larger from this ratio of sizes up; below it sorting
# both is faster (bench/RESULTS.md, "Measurements behind design choices").
_PLACE_FROM = 128
# The largest merge that sorts. A batch write's task merges each chunk's new keys into the keys it
# found before, and its memory peaks in that merge: a larger sort took a backfill's workers over
# their memory bound (bench/RESULTS.md, "Measurements behind design choices").
_SORT_UP_TO = 1 << 18

# Below this many keys a bucket's binary searches stay in the CPU's caches and cost about what
# its queries' probes and its keys' bits would: a bucket is covered by the filter from here
# (bench/RESULTS.md, "Measurements behind design choices").
FILTER_FROM_KEYS = 8_192
_FILTER_BITS_PER_KEY = 8


def _lanes(big: KeySet, small: KeySet) -> list[tuple[np.ndarray, np.ndarray]]:
    """The lanes two sets merge, pair by pair: h1, h2 and, where both carry them, the stamps
    (as ``big``'s type)."""
    lanes = [(big.h1, small.h1), (big.h2, small.h2)]
    if big.stamps is not None and small.stamps is not None:
        lanes.append((big.stamps, small.stamps.astype(big.stamps.dtype)))
    return lanes


def _meets_repeats(big_h1: np.ndarray, small_h1: np.ndarray, at: np.ndarray) -> bool:
    """Would placing ``small_h1`` at ``at`` in ``big_h1`` put equal first words side by side?
    ``at`` is the left insertion point, so only ``big_h1[at]`` can equal the placed key."""
    if len(small_h1) > 1 and bool((small_h1[1:] == small_h1[:-1]).any()):
        return True
    inside = at < len(big_h1)
    return bool((big_h1[at[inside]] == small_h1[inside]).any())


def _filter_bytes_log2(keys: int) -> int:
    """At least ``_FILTER_BITS_PER_KEY`` bits a key, rounded up to a power of two bytes (at
    least eight: one word)."""
    return max((keys * _FILTER_BITS_PER_KEY - 1).bit_length() - 3, 3)
