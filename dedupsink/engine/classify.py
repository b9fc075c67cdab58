"""Classify Arrow record batches of one window into unique / duplicate / expired / error.

The rules are those of docs/SEMANTICS.md. A ``WindowClassifier`` serves one task of one window: it
classifies each record batch of the task against the committed state (the latest point and a
``KeyIndex`` of remembered keys) and against the keys it has already found new in this window,
and collects those new keys, bucketed, for the store. Every step is a column operation; the only
Python loops run over columns, buckets or distinct categories, never over rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np
import pyarrow as pa

# pyarrow.compute (tens of ms to import) is imported by the functions that use it: Spark's
# planner and commit processes import this module for a query's first batch and need none.
from dedupsink.engine.expiry import ExpiryValues, expiry_values
from dedupsink.engine.expiry_policy import is_expired
from dedupsink.engine.fingerprint import Fingerprints, first_occurrences, key_leaves
from dedupsink.engine.keyset import KeySet
from dedupsink.engine.placement import bucket_of, key_fingerprints
from dedupsink.engine.sequence import (
    NO_SEQUENCE,
    SequenceIds,
    group_producers,
    highest_per_producer,
    sequence_ids,
    with_sequence,
)
from dedupsink.engine.settings import ERROR_COLUMN, Rows, Settings, column

UNIQUE, DUPLICATE, EXPIRED, ERROR = 0, 1, 2, 3
# systemTime keys are stored before their window's time is known (the commit sets it).
WINDOW_TIME_PLACEHOLDER = -1


class Port(StrEnum):
    """The four outputs of a window, in the order of their codes (``UNIQUE`` ... ``ERROR``); a
    port compares equal to its name, as options, manifests and folders spell it."""

    UNIQUE = "unique"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    ERROR = "error"


PORTS: tuple[Port, ...] = tuple(Port)


class KeyIndex(Protocol):
    """Committed remembered keys, looked up bucket by bucket (the bucket manager)."""

    def remembered(
        self, buckets: np.ndarray, fps: Fingerprints, forget_at_or_below: float | None
    ) -> np.ndarray: ...

    def highest(self, buckets: np.ndarray, fps: Fingerprints) -> np.ndarray:
        """Each key's largest remembered stamp (sequence dedup: a producer's highest id), or
        ``NO_SEQUENCE`` for a key not remembered."""
        ...


@dataclass(frozen=True)
class CommittedState:
    """What the windows committed before this one left behind."""

    latest: float | None = None
    categories: Mapping[str, int] = field(default_factory=dict)

    def expiry_point(self, settings: Settings) -> float | None:
        return settings.expiry_point(self.latest)


@dataclass
class BatchResult:
    """The port of every row and, for error rows in row order, the reason."""

    ports: np.ndarray
    error_reasons: pa.Array

    def count(self, port: int) -> int:
        return int(np.count_nonzero(self.ports == port))


@dataclass
class NewKeys:
    """Keys first seen in this window by this task, with their buckets and expiry values."""

    h1: np.ndarray
    h2: np.ndarray
    buckets: np.ndarray
    stamps: np.ndarray | None
    # Positions of the keys in ``h1`` order chunk by chunk: sorted runs, which a stable sort
    # merges in a fraction of the time a sort of the keys takes (None: not known).
    by_h1: np.ndarray | None = None


def stamp_dtype(settings: Settings) -> np.dtype | None:
    if not settings.stores_stamps:
        return None
    return np.dtype(np.float64 if settings.stamp_kind == "float" else np.int64)


class WindowClassifier:
    """Classifies the record batches one task receives in one window."""

    def __init__(self, settings: Settings, state: CommittedState, index: KeyIndex) -> None:
        self.settings = settings
        self.state = state
        self.index = index
        self.expiry_point = state.expiry_point(settings)
        self._pending = KeySet.empty(None)
        self._new: list[NewKeys] = []
        self.new_categories: list[str] = []
        self._new_category_index: dict[str, int] = {}
        self.max_stamp: float | None = None
        # Sequence dedup: each unique row's producer and id, for the producers' new highest ids.
        self._unique_ids: list[tuple[Fingerprints, np.ndarray]] = []

    def classify(self, batch: Rows) -> BatchResult:
        n = batch.num_rows
        keys = [column(batch, name) for name in self.settings.keys]
        reasons = np.full(n, -1, dtype=np.int8)
        reason_texts: list[str] = []

        def flag(mask: np.ndarray, text: str) -> None:
            fresh = mask & (reasons < 0)
            if fresh.any():
                reasons[fresh] = len(reason_texts)
                reason_texts.append(text)

        for name, array in zip(self.settings.keys, keys, strict=True):
            for leaf_name, leaf in _named_leaves(name, array):
                if leaf.null_count:
                    flag(
                        leaf.is_null().to_numpy(zero_copy_only=False),
                        f"null key column {leaf_name!r}",
                    )
        expiry = self._expiry(batch, flag)
        ids = self._sequence_ids(batch, flag)
        error = reasons >= 0
        ports = np.full(n, DUPLICATE, dtype=np.int8)
        ports[error] = ERROR
        known = (
            ~error
            if expiry is None or expiry.new_category is None
            else ~error & ~expiry.new_category
        )
        if expiry is not None and self.expiry_point is not None:
            ports[known & is_expired(expiry.values, self.expiry_point)] = EXPIRED
        if expiry is not None and known.any():
            top = expiry.values[known].max().item()
            self.max_stamp = top if self.max_stamp is None else max(self.max_stamp, top)
        candidates = np.flatnonzero(ports == DUPLICATE)
        if len(candidates) and ids is not None:
            self._decide_by_sequence(keys, ids, candidates, ports)
        elif len(candidates):
            self._decide(keys, expiry, candidates, ports)
        texts = pa.array(reason_texts, type=pa.string())
        return BatchResult(ports, texts.take(pa.array(reasons[error], type=pa.int8())))

    def _expiry(self, batch: Rows, flag: Callable[[np.ndarray, str], None]) -> ExpiryValues | None:
        if self.settings.expiry_key is None:
            return None
        name = self.settings.expiry_key
        values = expiry_values(column(batch, name), self.settings, self.state.categories)
        flag(values.missing, f"null expiry value in {name!r}")
        flag(
            values.unreadable, f"expiry value in {name!r} is not a valid {self.settings.mode} value"
        )
        jump = self.settings.max_expiry_jump
        if jump is not None and self.state.latest is not None:
            ahead = (
                ~values.missing & ~values.unreadable & (values.values > self.state.latest + jump)
            )
            if values.new_category is not None:
                ahead &= ~values.new_category
            flag(
                ahead,
                f"expiry value in {name!r} is more than maxExpiryJump ahead of the latest point",
            )
        return values

    def _sequence_ids(
        self, batch: Rows, flag: Callable[[np.ndarray, str], None]
    ) -> SequenceIds | None:
        name = self.settings.sequence_key
        if name is None:
            return None
        ids = sequence_ids(column(batch, name))
        flag(ids.missing, f"null sequence id in {name!r}")
        flag(ids.unreadable, f"sequence id in {name!r} is not a whole number within int64")
        return ids

    def _decide(
        self,
        keys: list[pa.Array],
        expiry: ExpiryValues | None,
        candidates: np.ndarray,
        ports: np.ndarray,
    ) -> None:
        # Hashing every row and indexing the fingerprints is cheaper than taking the candidate
        # rows out of the key columns (a copy of every string); null slots hash harmlessly.
        fps = key_fingerprints(self.settings, keys)
        if len(candidates) < len(ports):
            fps = fps.take(candidates)
        stamps = None
        if expiry is not None:
            stamps = expiry.values[candidates]
            if expiry.new_category is not None:
                stamps = self._provisional_ordinals(expiry, candidates, stamps)
        # One sort of the fingerprints serves finding first copies, looking them up among the
        # window's earlier new keys, and adding the new ones to those.
        by_h1, queries = _distinct_by_h1(fps)
        query_buckets = self._buckets(queries, None if stamps is None else stamps[by_h1])
        unseen = ~self.index.remembered(query_buckets, queries, self.expiry_point)
        fresh, by_h1_in_fresh = self._take_fresh(len(fps), by_h1, queries, unseen)
        ports[candidates[fresh]] = UNIQUE
        new_stamps = None if stamps is None else stamps[fresh]
        if self.settings.mode == "systemTime":
            new_stamps = np.full(len(fresh), WINDOW_TIME_PLACEHOLDER, dtype=np.int64)
        new_buckets = np.empty(len(fresh), dtype=np.int64)
        new_buckets[by_h1_in_fresh] = query_buckets[unseen]
        new = NewKeys(fps.h1[fresh], fps.h2[fresh], new_buckets, new_stamps, by_h1_in_fresh)
        self._new.append(new)

    def _decide_by_sequence(
        self, keys: list[pa.Array], ids: SequenceIds, candidates: np.ndarray, ports: np.ndarray
    ) -> None:
        """A row is unique if its id is above its producer's highest committed id and no
        earlier row of the window has the same (producer, id); the window's copies of one
        (producer, id) are found as a key mode finds copies of a key."""
        producers = key_fingerprints(self.settings, keys)
        if len(candidates) < len(ports):
            producers = producers.take(candidates)
        sequence = ids.values[candidates]
        groups = group_producers(producers)
        known = groups.fingerprints  # distinct, in (h1, h2) order: sorted by h1
        buckets = self._buckets(known, None)
        is_above = sequence > self.index.highest(buckets, known)[groups.of_row]
        lowest = sequence == NO_SEQUENCE
        if lowest.any():  # the lowest int64 is above no id: new only as a producer's first
            remembered = self.index.remembered(buckets, known, None)
            is_above |= lowest & ~remembered[groups.of_row]
        above = np.flatnonzero(is_above)
        pairs = with_sequence(producers.take(above), sequence[above])
        by_h1, queries = _distinct_by_h1(pairs)
        unseen = np.ones(len(by_h1), dtype=bool)
        fresh, by_h1_in_fresh = self._take_fresh(len(pairs), by_h1, queries, unseen)
        ports[candidates[above[fresh]]] = UNIQUE
        fresh_ids = sequence[above[fresh]]
        buckets = np.zeros(len(fresh), dtype=np.int64)  # (producer, id) keys are never stored
        self._new.append(
            NewKeys(pairs.h1[fresh], pairs.h2[fresh], buckets, fresh_ids, by_h1_in_fresh)
        )
        self._unique_ids.append((producers.take(above[fresh]), fresh_ids))

    def _take_fresh(
        self, count: int, by_h1: np.ndarray, queries: Fingerprints, unseen: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Of the distinct keys ``queries`` (rows ``by_h1`` of ``count``), those ``unseen`` and
        not among the window's earlier new keys join them; returns their rows in row order
        (as the unique port is written) and, for each in ``by_h1`` order, its place among them.
        ``unseen`` is narrowed in place to the keys taken."""
        unseen &= ~self._pending.contains(queries, presorted=True)
        fresh_by_h1 = by_h1[unseen]
        is_fresh = np.zeros(count, dtype=bool)
        is_fresh[fresh_by_h1] = True
        fresh = np.flatnonzero(is_fresh)
        position = np.empty(count, dtype=np.int64)
        position[fresh] = np.arange(len(fresh))
        added = KeySet.of_sorted(queries.h1[unseen], queries.h2[unseen])
        self._pending = self._pending.merge(added)
        return fresh, position[fresh_by_h1]

    def _provisional_ordinals(
        self, expiry: ExpiryValues, candidates: np.ndarray, stamps: np.ndarray
    ) -> np.ndarray:
        """New categories get -1, -2, ... in order of first appearance; the commit numbers them."""
        import pyarrow.compute as pc

        assert expiry.new_category is not None and expiry.category_codes is not None
        new_rows = np.flatnonzero(expiry.new_category[candidates])
        if len(new_rows) == 0:
            return stamps
        texts = expiry.category_codes.take(pa.array(candidates[new_rows]))
        encoded = pc.dictionary_encode(texts)
        local = []
        for name in encoded.dictionary.to_pylist():
            if name not in self._new_category_index:
                self._new_category_index[name] = len(self.new_categories)
                self.new_categories.append(name)
            local.append(-1 - self._new_category_index[name])
        stamps = stamps.copy()
        stamps[new_rows] = np.array(local, dtype=np.int64)[np.asarray(encoded.indices)]
        return stamps

    def _buckets(self, fps: Fingerprints, stamps: np.ndarray | None) -> np.ndarray:
        return bucket_of(self.settings, fps, stamps)

    def new_keys(self) -> NewKeys:
        """All keys this task found new in this window (no fingerprint twice)."""
        parts = self._new or [
            NewKeys(np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, np.int64), None)
        ]
        stamps = None
        if self.settings.stores_stamps:
            dtype = stamp_dtype(self.settings)
            stamps = np.concatenate(
                [p.stamps if p.stamps is not None else np.empty(0, dtype) for p in parts]
            )
        joined = NewKeys(
            np.concatenate([p.h1 for p in parts]),
            np.concatenate([p.h2 for p in parts]),
            np.concatenate([p.buckets for p in parts]),
            stamps,
            _joined_runs(parts),
        )
        self._new = [joined]  # one copy of a large window's keys, not two
        return joined

    def producer_highest_ids(self) -> NewKeys:
        """Sequence dedup: each producer of this task's unique rows with its highest id there,
        the keys its window file remembers. Whichever partition keeps a (producer, id) copied
        in several, it is unique in the window, so the ids of rows yielded to a lower partition
        count too: the window's highest id of a producer is the highest over its tasks."""
        parts = self._unique_ids
        if not parts:
            return NewKeys(*(np.empty(0, t) for t in (np.uint64, np.uint64, np.int64, np.int64)))
        fps, highest = highest_per_producer(
            Fingerprints.concat([p for p, _ in parts]), np.concatenate([i for _, i in parts])
        )
        return NewKeys(fps.h1, fps.h2, self._buckets(fps, None), highest)


def _distinct_by_h1(fps: Fingerprints) -> tuple[np.ndarray, Fingerprints]:
    """The first row of each distinct fingerprint, in ``h1`` order, and those fingerprints."""
    order = np.argsort(fps.h1)
    is_first = first_occurrences(fps, order)
    by_h1 = order[is_first[order]]
    return by_h1, fps.take(by_h1)


def _joined_runs(parts: list[NewKeys]) -> np.ndarray | None:
    """The parts' ``by_h1`` runs as positions in the joined keys."""
    if any(p.by_h1 is None for p in parts):
        return None
    starts = np.cumsum([0] + [len(p.h1) for p in parts[:-1]])
    return np.concatenate([p.by_h1 + start for p, start in zip(parts, starts, strict=True)])


def _named_leaves(name: str, array: pa.Array) -> list[tuple[str, pa.Array]]:
    """Scalar leaves of a key column with their dotted names, for null checks and messages."""
    if pa.types.is_struct(array.type):
        named: list[tuple[str, pa.Array]] = []
        children = array.flatten()
        for index, child in enumerate(children):
            named.extend(_named_leaves(f"{name}.{array.type.field(index).name}", child))
        return named or [(name, array)]
    return [(name, leaf) for leaf in key_leaves(array)]


def split(batch: Rows, result: BatchResult) -> dict[Port, Rows]:
    """The rows of each port that has any; error rows gain the reason column."""
    out: dict[Port, Rows] = {}
    for port, name in enumerate(PORTS):
        mask = result.ports == port
        if not mask.any():
            continue
        rows = batch.filter(pa.array(mask)) if not mask.all() else batch
        if port == ERROR:
            rows = rows.append_column(
                pa.field(ERROR_COLUMN, pa.string(), nullable=False), result.error_reasons
            )
        out[name] = rows
    return out
