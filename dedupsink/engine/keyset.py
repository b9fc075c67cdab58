"""A sorted set of key fingerprints with their expiry values: one bucket's remembered keys.

Kept as three aligned numpy arrays sorted by ``h1``, one entry per fingerprint (the
largest stamp wins), so membership is a vectorised binary search and merging an insertion.
A large set also keeps a one-hash Bloom filter (one bit per slot, at least eight slots per
key, rounded up to a power of two: one to two bytes per key), built on first lookup: most
lookups are of keys never seen, and the filter turns away about nine in ten of them before
the binary search, whose cost grows with the set.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dedupsink.engine.fingerprint import Fingerprints


@dataclass(frozen=True)
class KeySet:
    h1: np.ndarray
    h2: np.ndarray
    stamps: np.ndarray | None  # None where keys carry no expiry value (Basic Dedup)

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
        return cls(h1[keep], h2[keep], None if stamps is None else stamps[keep])

    def __len__(self) -> int:
        return len(self.h1)

    @property
    def nbytes(self) -> int:
        stamps = 0 if self.stamps is None else self.stamps.nbytes
        # The filter counts before it is built, so a cache's accounting does not drift.
        filters = (1 << _filter_slots_log2(len(self))) // 8 if len(self) >= _FILTER_FROM_KEYS else 0
        return self.h1.nbytes + self.h2.nbytes + stamps + filters

    @cached_property
    def _filter(self) -> tuple[np.ndarray, np.uint64]:
        """Bit ``h1 >> shift`` is set for every key here: a clear bit means "not here"."""
        slots_log2 = _filter_slots_log2(len(self))
        shift = np.uint64(64 - slots_log2)
        flags = np.zeros(1 << slots_log2, dtype=np.bool_)
        flags[self.h1 >> shift] = True
        return np.packbits(flags), shift

    def _may_contain(self, h1: np.ndarray) -> np.ndarray:
        bits, shift = self._filter
        slots = h1 >> shift
        return (
            bits[slots >> np.uint64(3)] >> (np.uint8(7) - (slots & np.uint64(7)).astype(np.uint8))
        ) & 1 == 1

    def merge(self, other: KeySet) -> KeySet:
        """Both sets in one: the smaller is placed into the larger at its sorted positions,
        which allocates only the result (a sort of the concatenation needs three times that).

        One placement serves every lane, and repeated fingerprints can only meet where a key
        is placed (the larger set's neighbour at that position), so the check is as small as
        the smaller set. A filter the larger set has built is carried over when the result
        needs as many slots: its bits for the placed keys are set, nothing is rebuilt."""
        if len(other) == 0:
            return self
        if len(self) == 0:
            return other
        big, small = (self, other) if len(self) >= len(other) else (other, self)
        at = np.searchsorted(big.h1, small.h1, side="left")
        placed = at + np.arange(len(small))
        from_big = np.ones(len(big) + len(small), dtype=bool)
        from_big[placed] = False
        lanes = [(big.h1, small.h1), (big.h2, small.h2)]
        if big.stamps is not None and small.stamps is not None:
            lanes.append((big.stamps, small.stamps.astype(big.stamps.dtype)))
        merged = []
        for big_lane, small_lane in lanes:
            lane = np.empty(len(from_big), dtype=big_lane.dtype)
            lane[from_big] = big_lane
            lane[placed] = small_lane
            merged.append(lane)
        h1, h2 = merged[0], merged[1]
        stamps = merged[2] if len(merged) == 3 else None
        if _meets_repeats(big.h1, small.h1, at):
            return KeySet._settle_repeats(h1, h2, stamps, h1[1:] == h1[:-1])
        result = KeySet(h1, h2, stamps)
        result._carry_filter(big, small.h1)
        return result

    def _carry_filter(self, source: KeySet, added_h1: np.ndarray) -> None:
        """Take ``source``'s built filter, with the bits of ``added_h1`` set, if it has as
        many slots as this set's would (its keys and the added ones are all this set's)."""
        built = source.__dict__.get("_filter")
        if built is None or len(self) < _FILTER_FROM_KEYS:
            return
        bits, shift = built
        if shift != np.uint64(64 - _filter_slots_log2(len(self))):
            return
        bits = bits.copy()  # the source may still be in use
        slots = added_h1 >> shift
        marks = np.left_shift(1, 7 - (slots & np.uint64(7)).astype(np.uint8)).astype(np.uint8)
        np.bitwise_or.at(bits, slots >> np.uint64(3), marks)
        self.__dict__["_filter"] = (bits, shift)

    def held_in(self, other: KeySet) -> np.ndarray:
        """For each key here: does ``other`` hold it with at least its stamp?

        Keys whose ``h1`` other holds more than once (a 64-bit collision) may be answered
        False: a merge settles those as usual."""
        if len(self) == 0 or len(other) == 0:
            return np.zeros(len(self), dtype=bool)
        at = np.minimum(np.searchsorted(other.h1, self.h1, side="left"), len(other) - 1)
        held = (other.h1[at] == self.h1) & (other.h2[at] == self.h2)
        if self.stamps is not None and other.stamps is not None:
            held &= other.stamps[at] >= self.stamps
        return held

    def without(self, drop: np.ndarray) -> KeySet:
        """The keys not marked in ``drop`` (still sorted and distinct)."""
        keep = ~drop
        return KeySet(
            self.h1[keep], self.h2[keep], None if self.stamps is None else self.stamps[keep]
        )

    def alive(self, forget_at_or_below: float | None) -> KeySet:
        """The keys still remembered once those stamped at or below the expiry point are gone."""
        if forget_at_or_below is None or self.stamps is None or len(self) == 0:
            return self
        keep = self.stamps > forget_at_or_below
        if keep.all():
            return self
        return KeySet(self.h1[keep], self.h2[keep], self.stamps[keep])

    def contains(
        self,
        fps: Fingerprints,
        forget_at_or_below: float | None = None,
        filtered: bool = True,
        presorted: bool = False,
    ) -> np.ndarray:
        """For each query fingerprint: is it here with a stamp above the expiry point?

        ``filtered=False`` skips the Bloom filter, for a set replaced before it would repay
        building one (a bucket's small set of recent keys, rebuilt every window);
        ``presorted``: the queries are sorted by ``h1`` already."""
        found = np.zeros(len(fps), dtype=bool)
        if len(self) == 0 or len(fps) == 0:
            return found
        if filtered and len(self) >= _FILTER_FROM_KEYS:
            rows = np.flatnonzero(self._may_contain(fps.h1))
            found[rows] = self._search(fps.h1[rows], fps.h2[rows], forget_at_or_below, presorted)
            return found
        return self._search(fps.h1, fps.h2, forget_at_or_below, presorted)

    def _search(
        self,
        query_h1: np.ndarray,
        query_h2: np.ndarray,
        forget_at_or_below: float | None,
        presorted: bool = False,
    ) -> np.ndarray:
        found = np.zeros(len(query_h1), dtype=bool)
        if len(query_h1) == 0:
            return found
        # numpy's binary search narrows each search by the previous one when the queries are
        # sorted: sorting them first is several times faster than searching in row order.
        order = np.arange(len(query_h1)) if presorted else np.argsort(query_h1)
        if not presorted:
            query_h1, query_h2 = query_h1[order], query_h2[order]
        at = np.minimum(np.searchsorted(self.h1, query_h1, side="left"), len(self) - 1)
        same_h1 = self.h1[at] == query_h1
        hit = same_h1 & (self.h2[at] == query_h2)
        if forget_at_or_below is not None and self.stamps is not None:
            hit &= self.stamps[at] > forget_at_or_below
        # Remembered keys sharing h1 (a 64-bit collision) are rare: check those runs one by one.
        after = np.minimum(at + 1, len(self) - 1)
        for row in np.flatnonzero(same_h1 & (after > at) & (self.h1[after] == query_h1)):
            run = slice(at[row], np.searchsorted(self.h1, query_h1[row], side="right"))
            hits = self.h2[run] == query_h2[row]
            if forget_at_or_below is not None and self.stamps is not None:
                hits &= self.stamps[run] > forget_at_or_below
            hit[row] = bool(hits.any())
        found[order] = hit
        return found


# Below this many keys a binary search is cheap enough that building a filter does not pay.
# Merges carry a built filter (it is rebuilt only when the set doubles or drops keys), so it
# pays from a few thousand keys: a bucket of 30,000 answered 64 windows' lookups in 5.1 ms
# a window with it from 8,192 keys, 6.6 ms from 65,536 (10,000 keys: 4.4 and 4.8 ms).
_FILTER_FROM_KEYS = 8_192
_FILTER_SLOTS_PER_KEY = 8


def _meets_repeats(big_h1: np.ndarray, small_h1: np.ndarray, at: np.ndarray) -> bool:
    """Would placing ``small_h1`` at ``at`` in ``big_h1`` put equal first words side by side?
    ``at`` is the left insertion point, so only ``big_h1[at]`` can equal the placed key."""
    if len(small_h1) > 1 and bool((small_h1[1:] == small_h1[:-1]).any()):
        return True
    inside = at < len(big_h1)
    return bool((big_h1[at[inside]] == small_h1[inside]).any())


def _filter_slots_log2(keys: int) -> int:
    return max((keys * _FILTER_SLOTS_PER_KEY - 1).bit_length(), 3)
