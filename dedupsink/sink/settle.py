"""Keys new in several partitions of one window: exactly one of their rows is unique.

Each task classifies its own rows, so two tasks of one window can both find a key new. The
rule is **the lowest partition keeps the key**, and the tasks apply it themselves:

1. **In the task** (``settle_in_task``). Once it has classified its rows, a task *stages* its
   new keys in the window's staging folder (``<stem>-n<count>.keys``: each key's 16-byte
   fingerprint and, in the expiry modes, its expiry value; the i-th key is the i-th unique
   row's), then waits for the keys of every lower partition of the window (they run at the
   same time or earlier) and *yields* its unique rows whose key one of them has: they go to
   ``duplicate``. The unique rows of its last chunk are still in memory; those of earlier
   chunks (a large window) are in its staged unique file, which it rewrites itself, so no row
   is read on the driver. The keys of yielded rows are left out of its window file: the
   keeper remembers each key once, with its unique row's expiry value.
2. **In the commit** (``settle_window``). Each task reports which attempt of which lower
   partition it settled with. When every task settled with the final attempts of all lower
   partitions, nothing is left to do and nothing is read. Otherwise (a lower partition's
   attempt failed after its keys were read, a wait timed out, a task of a partition above
   ``SETTLE_WITH_AT_MOST`` left the reading to the commit), the commit reads every task's staged
   keys, laid end to end (the kept parts in partition order, then the yielded parts), in one
   hash pass: a kept key that occurs earlier is demoted to duplicate, a yielded key that does
   not occur earlier (nobody kept it) is promoted back to unique. Moving a row means rewriting
   that task's staged file: the one case in which the driver reads rows. Partitioning the input
   by key (``df.repartition(n, *keys)``) gives the commit nothing to move. A key promoted back
   has no window file remembering it; the commit writes one (``PromotedKeys``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dedupsink.engine.fingerprint import Fingerprints, first_occurrences
from dedupsink.errors import StoreCorruptError, StoreError
from dedupsink.sink.output import Output, PortFile, PortWriters, staged_stem

KEYS_SUFFIX = ".keys"
# A task settles with the keys of at most this many lower partitions (one read each, one at a
# time); above that the commit checks, and a window of more partitions should be partitioned by
# key.
SETTLE_WITH_AT_MOST = 32
# How long a task waits for the keys of lower partitions: at least this, or as long as it has
# run itself (a lower partition running late is about as far from done).
SETTLE_WAIT_SECONDS = 5.0
_POLL_FIRST_SECONDS = 0.02
_POLL_MAX_SECONDS = 0.5


@dataclass(frozen=True)
class StagedKeys:
    """A task's new keys as staged: fingerprints and (expiry modes) expiry values."""

    fingerprints: Fingerprints
    stamps: np.ndarray | None

    def __len__(self) -> int:
        return len(self.fingerprints)

    def take(self, rows: np.ndarray) -> StagedKeys:
        return StagedKeys(
            self.fingerprints.take(rows), None if self.stamps is None else self.stamps[rows]
        )

    def chunks(self) -> list[bytes | memoryview]:
        """The staged layout, as chunks to write in order (no joined copy)."""
        chunks: list[bytes | memoryview] = [self.fingerprints.packed()]
        if self.stamps is not None and len(self.stamps):
            chunks.append(self.stamps.astype(self.stamps.dtype.newbyteorder("<")).tobytes())
        return chunks

    @staticmethod
    def from_bytes(data: bytes, count: int, stamp_dtype: np.dtype | None, path: str) -> StagedKeys:
        width = 16 + (0 if stamp_dtype is None else 8)
        if len(data) != width * count:
            raise StoreCorruptError(path, f"holds {len(data)} bytes for {count} keys of {width}")
        fingerprints = Fingerprints.from_packed(data[: 16 * count])
        stamps = None
        if stamp_dtype is not None:
            little = np.dtype(stamp_dtype).newbyteorder("<")
            stamps = np.frombuffer(data, little, count, 16 * count).astype(stamp_dtype)
        return StagedKeys(fingerprints, stamps)

    @staticmethod
    def concat(parts: list[StagedKeys], stamp_dtype: np.dtype | None) -> StagedKeys:
        empty = np.empty(0, np.uint64)
        fingerprints = Fingerprints.concat(
            [Fingerprints(empty, empty)] + [p.fingerprints for p in parts]
        )
        if stamp_dtype is None:
            return StagedKeys(fingerprints, None)
        stamps = [np.empty(0, stamp_dtype)] + [p.stamps for p in parts if p.stamps is not None]
        return StagedKeys(fingerprints, np.concatenate(stamps))


@dataclass
class Settlement:
    """What a task's settlement did, for its summary."""

    keys_file: str | None = None  # staged keys: of the unique rows, then of the yielded ones
    yielded: int = 0  # unique rows given up to a lower partition: the duplicate file's last rows
    saw: frozenset[tuple[int, int]] = frozenset()  # (partition, attempt) of the keys it read
    complete: bool = False  # it read the keys of every lower partition
    superseded: list[str] = field(default_factory=list)  # staged files it replaced


@dataclass
class Holder:
    """One task's part in the commit's settlement (a view of its summary)."""

    partition: int
    attempt: int
    folder: str
    settlement: Settlement
    unique: int
    files: list[PortFile]


# -- staged keys -------------------------------------------------------------------------------


def stage_keys(output: Output, folder: str, partition: int, attempt: int, keys: StagedKeys) -> str:
    """Stage a task's new keys; the name carries the count, so that another task reading the
    file while it is being written (a local disk) can tell it is not complete yet."""
    relative = f"{folder}/{staged_stem(partition, attempt)}-n{len(keys)}{KEYS_SUFFIX}"
    output.storage.write(output.path(relative), keys.chunks())
    return relative


def read_keys(
    output: Output, relative: str, count: int, stamp_dtype: np.dtype | None
) -> StagedKeys:
    data = output.storage.read(output.path(relative))
    return StagedKeys.from_bytes(data, count, stamp_dtype, output.path(relative))


@dataclass(frozen=True)
class _Staged:
    """A keys file another task staged, as its listing shows it."""

    name: str
    partition: int
    attempt: int
    count: int
    size: int


def _staged(output: Output, folder: str) -> list[_Staged]:
    """Every keys file staged in a window's folder so far."""
    found = []
    for name, entry in output.storage.entries(output.path(folder)).items():
        fields = name.removesuffix(KEYS_SUFFIX).split("-")
        if name.endswith(KEYS_SUFFIX) and len(fields) == 4 and fields[3][1:].isdigit():
            partition, attempt, count = int(fields[0][1:]), int(fields[1][1:]), int(fields[3][1:])
            found.append(_Staged(name, partition, attempt, count, entry.size))
    return found


def lower_keys(
    output: Output, folder: str, partition: int, stamp_dtype: np.dtype | None, wait: float
) -> tuple[list[_Staged], bool]:
    """The keys files of every lower partition (its latest attempt), lowest first, waiting up to
    ``wait`` seconds for those not staged yet; and whether all of them were found complete. A
    file shorter than its count says is still being written (a local disk)."""
    deadline = time.monotonic() + wait
    pause = _POLL_FIRST_SECONDS
    width = 16 + (0 if stamp_dtype is None else 8)
    while True:
        found: dict[int, _Staged] = {}
        for staged in _staged(output, folder):
            known = found.get(staged.partition)
            complete = staged.size == width * staged.count
            later = known is None or staged.attempt > known.attempt
            if staged.partition < partition and complete and later:
                found[staged.partition] = staged
        if len(found) == partition or time.monotonic() >= deadline:
            return [found[p] for p in sorted(found)], len(found) == partition
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, _POLL_MAX_SECONDS)


def _yielded_to(output: Output, folder: str, lower: list[_Staged], keys: StagedKeys) -> np.ndarray:
    """Which of ``keys`` a lower partition has, reading one lower task's keys at a time (memory
    for the task's own keys and one other's, whatever the window's size)."""
    yielded = np.zeros(len(keys), dtype=bool)
    stamp_dtype = None if keys.stamps is None else keys.stamps.dtype
    mine = _SortedKeys(keys.fingerprints)
    for staged in lower:
        theirs = read_keys(output, f"{folder}/{staged.name}", staged.count, stamp_dtype)
        yielded[mine.rows_of(theirs.fingerprints)] = True
    return yielded


class _SortedKeys:
    """A task's keys sorted once, to find which of them another task's keys hold: a binary
    search per other key, no hashing of the two sets together."""

    def __init__(self, fingerprints: Fingerprints) -> None:
        self.order = np.lexsort((fingerprints.h2, fingerprints.h1))
        self.h1 = fingerprints.h1[self.order]
        self.h2 = fingerprints.h2[self.order]

    def rows_of(self, others: Fingerprints) -> np.ndarray:
        """The row positions of the keys that ``others`` also has."""
        if not len(self.h1) or not len(others):
            return np.empty(0, np.int64)
        at = np.searchsorted(self.h1, others.h1)
        hits = []
        # Equal h1 with different h2 (a 64-bit collision) sit next to each other: step over.
        while True:
            inside = at < len(self.h1)
            at, wanted1, wanted2 = at[inside], others.h1[inside], others.h2[inside]
            same1 = self.h1[at] == wanted1
            at, wanted1, wanted2 = at[same1], wanted1[same1], wanted2[same1]
            same2 = self.h2[at] == wanted2
            hits.append(at[same2])
            if same2.all():
                break
            at, others = at[~same2] + 1, Fingerprints(wanted1[~same2], wanted2[~same2])
        return self.order[np.concatenate(hits)]


# -- 1. in the task ----------------------------------------------------------------------------


@dataclass
class TaskSettlement:
    """The outcome of ``settle_in_task``: the settlement, and which of the task's new keys
    (in unique-row order) it yielded, to leave out of its window file."""

    settlement: Settlement
    yielded: np.ndarray


def settle_in_task(
    output: Output,
    folder: str,
    partition: int,
    attempt: int,
    keys: StagedKeys,
    held: pa.RecordBatch | None,
    writers: PortWriters,
    waited_since: float,
) -> TaskSettlement:
    """Stage the task's new keys, settle with the lower partitions, then write the held unique
    rows, yielding to duplicate every unique row whose key a lower partition has (rewriting the
    staged unique file for rows of earlier chunks)."""
    settlement = Settlement()
    settlement.keys_file = stage_keys(output, folder, partition, attempt, keys)
    held_rows = 0 if held is None else held.num_rows
    yielded = np.zeros(len(keys), dtype=bool)
    stamp_dtype = None if keys.stamps is None else keys.stamps.dtype
    if 0 < partition <= SETTLE_WITH_AT_MOST and len(keys):
        wait = max(SETTLE_WAIT_SECONDS, time.monotonic() - waited_since)
        lower, settlement.complete = lower_keys(output, folder, partition, stamp_dtype, wait)
        settlement.saw = frozenset((s.partition, s.attempt) for s in lower)
        yielded = _yielded_to(output, folder, lower, keys)
    else:
        settlement.complete = partition == 0 or not len(keys)
    earlier = len(keys) - held_rows
    if yielded[:earlier].any():
        settlement.superseded += _rewrite_unique(output, writers, yielded[:earlier])
    if held is not None:
        mine = yielded[earlier:]
        if (~mine).any():
            writers.write("unique", held if not mine.any() else held.filter(pa.array(~mine)))
        if mine.any():
            writers.write("duplicate", held.filter(pa.array(mine)))  # last rows of the file
    settlement.yielded = int(yielded.sum())
    if settlement.yielded:
        settlement.superseded.append(settlement.keys_file)
        reordered = StagedKeys.concat([keys.take(~yielded), keys.take(yielded)], stamp_dtype)
        settlement.keys_file = stage_keys(output, folder, partition, attempt, reordered)
    return TaskSettlement(settlement, yielded)


def _rewrite_unique(output: Output, writers: PortWriters, yielded: np.ndarray) -> list[str]:
    """Move the marked rows of the task's staged unique file (its earlier chunks' unique rows,
    in order) to its duplicate file, streaming the file back in batches; returns the file
    replaced."""
    record = writers.take("unique")
    if record is None or record.rows != len(yielded):
        raise StoreError(
            f"staged unique file {record and output.path(record.path)} holds "
            f"{record and record.rows} rows, but its task found {len(yielded)} keys for them"
        )
    start = 0
    with output.storage.fs.open(output.path(record.path), "rb") as handle:
        for batch in pq.ParquetFile(handle).iter_batches():
            mine = yielded[start : start + batch.num_rows]
            start += batch.num_rows
            if (~mine).any():
                writers.write("unique", batch.filter(pa.array(~mine)))
            if mine.any():
                writers.write("duplicate", batch.filter(pa.array(mine)))
    return [record.path]


# -- 2. in the commit --------------------------------------------------------------------------


def settled_in_tasks(holders: list[Holder]) -> bool:
    """Whether every task settled with the final attempt of every lower partition."""
    finals = {h.partition: h.attempt for h in holders}
    for holder in holders:
        if holder.unique + holder.settlement.yielded == 0:
            continue  # no new keys: nothing it could have shared
        lower = {(p, a) for p, a in finals.items() if p < holder.partition}
        if not holder.settlement.complete or not lower <= holder.settlement.saw:
            return False
        if holder.settlement.saw - lower:  # it read an attempt that then failed
            return False
    return True


@dataclass
class Moved:
    """Rows the commit moved between a task's ports."""

    holder: Holder
    rows: int
    source: str
    target: str
    replaced: str  # the staged file rewritten without them
    keys: StagedKeys | None = None  # the keys of rows promoted back to unique


def settle_window(
    output: Output, holders: list[Holder], stamp_dtype: np.dtype | None
) -> list[Moved]:
    """Leave each key new in this window with exactly one unique row; returns the moves made
    (the holders' files are replaced by the rewritten ones)."""
    holders = [h for h in holders if h.settlement.keys_file is not None]
    if len(holders) < 2 and not any(h.settlement.yielded for h in holders):
        return []
    if settled_in_tasks(holders):
        return []
    kept, given = [], []
    for holder in holders:
        total = holder.unique + holder.settlement.yielded
        keys = read_keys(output, holder.settlement.keys_file or "", total, stamp_dtype)
        kept.append(keys.fingerprints[: holder.unique])
        given.append(keys.take(np.arange(holder.unique, total)))
    first = first_occurrences(Fingerprints.concat(kept + [g.fingerprints for g in given]))
    marks = np.split(first, np.cumsum([len(part) for part in kept + given])[:-1])
    moves = []
    for holder, lost in zip(holders, marks[: len(kept)], strict=True):
        if (~lost).any():
            moves.append(_move_rows(output, holder, "unique", ~lost, "duplicate", at_end=False))
    for holder, back, keys in zip(holders, marks[len(kept) :], given, strict=True):
        if back.any():  # after demotions: a demotion adds its file at the end
            moved = _move_rows(output, holder, "duplicate", back, "unique", at_end=True)
            moved.keys = keys.take(back)
            moves.append(moved)
    return moves


def _move_rows(
    output: Output, holder: Holder, source: str, rows: np.ndarray, target: str, at_end: bool
) -> Moved:
    """Rewrite the task's (first) ``source`` file without the marked rows, which go to a new
    staged file of ``target``. ``at_end``: the marks cover the file's last rows (the yielded
    ones, at the end of the task's duplicate file)."""
    record = next(r for r in holder.files if r.port == source)
    if at_end:
        rows = np.concatenate([np.zeros(record.rows - len(rows), dtype=bool), rows])
    table = output.read_table(record.path)
    if table.num_rows != len(rows):
        raise StoreError(
            f"staged {source} file {output.path(record.path)} holds {table.num_rows} rows, "
            f"but its task staged {len(rows)} keys for it"
        )
    kept = [r for r in holder.files if r is not record]
    for port, mask in ((source, ~rows), (target, rows)):
        if mask.any():
            stem = staged_stem(holder.partition, holder.attempt)
            relative = f"{holder.folder}/{stem}.{port}.parquet"
            size = output.write_table(relative, table.filter(pa.array(mask)))
            kept.append(PortFile(port, relative, int(mask.sum()), size))
    holder.files[:] = kept
    return Moved(holder, int(rows.sum()), source, target, record.path)


def staged_files(holders: Iterable[Holder], moves: Iterable[Moved]) -> list[str]:
    """Every staged file of the window's tasks: port files, keys files, and those replaced."""
    names = [move.replaced for move in moves]
    for holder in holders:
        names.extend(r.path for r in holder.files)
        names.extend(holder.settlement.superseded)
        if holder.settlement.keys_file:
            names.append(holder.settlement.keys_file)
    return names
