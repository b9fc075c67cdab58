"""Keys new in several partitions of one window: exactly one of their rows is unique.

**The lowest partition keeps the key.** Each task stages its new keys (``SortedKeys``) and
yields to duplicate its unique rows whose key a lower partition staged (``settle_task``); the
commit checks that every task settled with the final attempts of all lower partitions and
otherwise settles the window itself (``settle_window``). The whole procedure:
docs/RELIABILITY.md, "Keys new in several partitions of a window".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pyarrow as pa

from dedupsink.engine.fingerprint import Fingerprints, first_occurrences
from dedupsink.engine.settings import Rows
from dedupsink.errors import StoreCorruptError, StoreError
from dedupsink.ports.output import Output, PortFile, PortWriters, staged_stem

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


_LANE = np.dtype("<u8")  # fingerprint words and expiry values, as staged
_ROW = np.dtype("<u4")  # a key's position among its task's new keys


@dataclass(frozen=True)
class StagedKeys:
    """A task's new keys in its order (the i-th key is the i-th unique row's): fingerprints and
    (expiry modes) expiry values."""

    fingerprints: Fingerprints
    stamps: np.ndarray | None
    runs: np.ndarray | None = None  # positions whose h1 come in sorted runs (NewKeys.by_h1)

    def __len__(self) -> int:
        return len(self.fingerprints)

    def take(self, rows: np.ndarray) -> StagedKeys:
        return StagedKeys(
            self.fingerprints.take(rows), None if self.stamps is None else self.stamps[rows]
        )


class SortedKeys:
    """Keys sorted by their fingerprint's first word, each with its position in its task's order:
    how keys are staged. Another task's sorted keys are then looked up walking both arrays
    forward (``_FirstWordFilter``, then a binary search of the few that may match).

    A staged file is four lanes end to end: ``h1``, ``h2`` (8 bytes each), the position (4
    bytes) and, in the expiry modes, the expiry value (8 bytes), all little-endian."""

    def __init__(self, h1: np.ndarray, h2: np.ndarray, rows: np.ndarray, stamps: np.ndarray | None):
        self.h1, self.h2, self.rows, self.stamps = h1, h2, rows, stamps

    def __len__(self) -> int:
        return len(self.h1)

    @staticmethod
    def of(keys: StagedKeys) -> SortedKeys:
        h1 = keys.fingerprints.h1
        if keys.runs is None:
            order = np.argsort(h1, kind="stable")
        else:  # a stable sort merges sorted runs in a fraction of the time of a full sort
            order = keys.runs[np.argsort(h1[keys.runs], kind="stable")]
        stamps = None if keys.stamps is None else keys.stamps[order]
        fingerprints = keys.fingerprints
        return SortedKeys(fingerprints.h1[order], fingerprints.h2[order], order, stamps)

    @staticmethod
    def width(stamp_dtype: np.dtype | None) -> int:
        """Bytes a staged key takes."""
        return 2 * _LANE.itemsize + _ROW.itemsize + (0 if stamp_dtype is None else _LANE.itemsize)

    def chunks(self) -> list[bytes | memoryview]:
        """The staged layout, as chunks to write in order (no joined copy)."""
        lanes: list[np.ndarray] = [self.h1, self.h2, self.rows.astype(_ROW)]
        if self.stamps is not None:
            lanes.append(self.stamps)
        lanes = [np.ascontiguousarray(lane, lane.dtype.newbyteorder("<")) for lane in lanes]
        return [lane.data.cast("B") if len(lane) else b"" for lane in lanes]

    @staticmethod
    def from_bytes(data: bytes, count: int, stamp_dtype: np.dtype | None, path: str) -> SortedKeys:
        width = SortedKeys.width(stamp_dtype)
        if len(data) != width * count:
            raise StoreCorruptError(path, f"holds {len(data)} bytes for {count} keys of {width}")
        lane, row = _LANE.itemsize * count, _ROW.itemsize * count
        h1 = np.frombuffer(data, _LANE, count, 0).astype(np.uint64, copy=False)
        h2 = np.frombuffer(data, _LANE, count, lane).astype(np.uint64, copy=False)
        rows = np.frombuffer(data, _ROW, count, 2 * lane).astype(np.int64)
        stamps = None
        if stamp_dtype is not None:
            little = np.dtype(stamp_dtype).newbyteorder("<")
            stamps = np.frombuffer(data, little, count, 2 * lane + row).astype(stamp_dtype)
        return SortedKeys(h1, h2, rows, stamps)

    def kept_first(self, yielded: np.ndarray) -> SortedKeys:
        """The same keys, renumbered: the kept ones first, then the yielded (each in order)."""
        kept = ~yielded
        position = np.empty(len(yielded), np.int64)
        position[kept] = np.arange(np.count_nonzero(kept))
        position[yielded] = np.count_nonzero(kept) + np.arange(np.count_nonzero(yielded))
        return SortedKeys(self.h1, self.h2, position[self.rows], self.stamps)

    def in_order(self) -> StagedKeys:
        """The keys back in their task's order."""
        order = np.empty_like(self.rows)
        order[self.rows] = np.arange(len(self.rows))
        stamps = None if self.stamps is None else self.stamps[order]
        return StagedKeys(Fingerprints(self.h1[order], self.h2[order]), stamps)

    def has_first_word(self, h1: np.ndarray) -> np.ndarray:
        """Which of ``h1`` are the first word of one of these keys."""
        if not len(self.h1):
            return np.zeros(len(h1), dtype=bool)
        at = np.minimum(np.searchsorted(self.h1, h1), len(self.h1) - 1)
        return np.asarray(self.h1[at] == h1)

    def rows_of(self, others: SortedKeys | Fingerprints) -> np.ndarray:
        """The positions (in this task's order) of the keys that ``others`` also has."""
        if not len(self.h1) or not len(others):
            return np.empty(0, np.int64)
        at = np.searchsorted(self.h1, others.h1)
        wanted1, wanted2 = others.h1, others.h2
        hits = []
        # Equal h1 with different h2 (a 64-bit collision) sit next to each other: step over.
        while True:
            inside = at < len(self.h1)
            at, wanted1, wanted2 = at[inside], wanted1[inside], wanted2[inside]
            same1 = self.h1[at] == wanted1
            at, wanted1, wanted2 = at[same1], wanted1[same1], wanted2[same1]
            same2 = self.h2[at] == wanted2
            hits.append(at[same2])
            if same2.all():
                break
            at, wanted1, wanted2 = at[~same2] + 1, wanted1[~same2], wanted2[~same2]
        return self.rows[np.concatenate(hits)]


@dataclass
class Settlement:
    """What a task's settlement did, for its summary."""

    keys_file: str | None = None  # staged keys: of the unique rows, then of the yielded ones
    yielded: int = 0  # unique rows given up to a lower partition: the duplicate file's last rows
    saw: frozenset[str] = frozenset()  # the names of the lower partitions' keys files it read
    complete: bool = False  # it read the keys of every lower partition
    superseded: list[str] = field(default_factory=list)  # staged files it replaced


@dataclass
class SettlingTask:
    """A task as the commit's settlement sees it (a view of its summary): the files the
    settlement may rewrite are replaced in ``files``."""

    partition: int
    attempt: int
    folder: str
    settlement: Settlement
    unique: int
    files: list[PortFile]


# -- staged keys -------------------------------------------------------------------------------


def keys_file_name(folder: str, partition: int, attempt: int, count: int) -> str:
    """A staged keys file's name; it carries the count, so that another task reading the file
    while it is being written (a local disk) can tell it is not complete yet."""
    return f"{folder}/{staged_stem(partition, attempt)}-n{count}{KEYS_SUFFIX}"


def write_keys(output: Output, relative: str, keys: SortedKeys) -> str:
    output.storage.write(output.path(relative), keys.chunks())
    return relative


def stage_keys(output: Output, folder: str, partition: int, attempt: int, keys: SortedKeys) -> str:
    """Stage a task's new keys under a new name; returns it."""
    return write_keys(output, keys_file_name(folder, partition, attempt, len(keys)), keys)


def read_keys(
    output: Output, relative: str, count: int, stamp_dtype: np.dtype | None
) -> SortedKeys:
    data = output.storage.read(output.path(relative))
    return SortedKeys.from_bytes(data, count, stamp_dtype, output.path(relative))


@dataclass(frozen=True)
class _ListedKeysFile:
    """A keys file another task staged, as its listing shows it."""

    name: str
    partition: int
    attempt: int
    count: int
    size: int


def _listed_keys_files(output: Output, folder: str) -> list[_ListedKeysFile]:
    """Every keys file staged in a window's folder so far."""
    found = []
    for name, entry in output.storage.entries(output.path(folder)).items():
        fields = name.removesuffix(KEYS_SUFFIX).split("-")
        if name.endswith(KEYS_SUFFIX) and len(fields) == 4 and fields[3][1:].isdigit():
            partition, attempt, count = int(fields[0][1:]), int(fields[1][1:]), int(fields[3][1:])
            found.append(_ListedKeysFile(name, partition, attempt, count, entry.size))
    return found


def lower_keys(
    output: Output, folder: str, partition: int, stamp_dtype: np.dtype | None, wait: float
) -> tuple[list[_ListedKeysFile], bool]:
    """The keys files of every lower partition (its latest attempt), lowest first, waiting up to
    ``wait`` seconds for those not staged yet; and whether all of them were found complete. A
    file shorter than its count says is still being written (a local disk)."""
    deadline = time.monotonic() + wait
    pause = _POLL_FIRST_SECONDS
    width = SortedKeys.width(stamp_dtype)
    while True:
        found: dict[int, _ListedKeysFile] = {}
        for staged in _listed_keys_files(output, folder):
            known = found.get(staged.partition)
            complete = staged.size == width * staged.count
            later = known is None or staged.attempt > known.attempt
            if staged.partition < partition and complete and later:
                found[staged.partition] = staged
        if len(found) == partition or time.monotonic() >= deadline:
            return [found[p] for p in sorted(found)], len(found) == partition
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, _POLL_MAX_SECONDS)


def _yielded_to(
    output: Output, folder: str, lower: list[_ListedKeysFile], mine: SortedKeys
) -> np.ndarray:
    """Which of the task's keys a lower partition has (by position), reading one lower task's
    keys at a time (memory for the task's own keys and one other's, whatever the window's
    size). Of a large file only the first words are read, unless one of them is the task's."""
    yielded = np.zeros(len(mine), dtype=bool)
    first_words = _FirstWordFilter(mine.h1)
    for staged in lower:
        if not staged.count:
            continue  # a task that found no key new (an empty object: S3 refuses its range)
        path = output.path(f"{folder}/{staged.name}")
        if staged.size <= _READ_WHOLE_AT_MOST:
            data = output.storage.read(path)
            h1 = np.frombuffer(data, _LANE, staged.count).astype(np.uint64, copy=False)
        else:
            data = b""
            h1 = _lane(output.storage.read_range(path, 0, _LANE.itemsize * staged.count))
        at = first_words.candidates(h1)  # a few per cent of theirs, the shared keys among them
        at = at[mine.has_first_word(h1[at])]
        if not len(at):
            continue
        lane = _LANE.itemsize * staged.count
        h2 = (
            np.frombuffer(data, _LANE, staged.count, lane)
            if data
            else _lane(output.storage.read_range(path, lane, 2 * lane))
        ).astype(np.uint64, copy=False)
        yielded[mine.rows_of(Fingerprints(h1[at], h2[at]))] = True
    return yielded


def _lane(data: bytes) -> np.ndarray:
    return np.frombuffer(data, _LANE).astype(np.uint64, copy=False)


# A lower task's keys file up to this size is read whole (one request on an object store);
# a larger one lane by lane, its second words only when a first word matches.
_READ_WHOLE_AT_MOST = 1 << 20


class _FirstWordFilter:
    """Which first words a task's keys have, by their top bits: one byte a slot, about eight
    slots a key. Probing another task's (sorted) first words walks it forward and leaves the
    few per cent that may match for the binary search, which was most of settling's time."""

    def __init__(self, h1: np.ndarray) -> None:
        bits = min(24, max(10, int(np.ceil(np.log2(max(8 * len(h1), 1))))))
        self.shift = np.uint64(64 - bits)
        self.slots = np.zeros(1 << bits, dtype=bool)
        self.slots[h1 >> self.shift] = True

    def candidates(self, h1: np.ndarray) -> np.ndarray:
        """Positions in ``h1`` whose first word may be one of the task's."""
        return np.flatnonzero(self.slots[h1 >> self.shift])


# -- 1. in the task ----------------------------------------------------------------------------


@dataclass
class TaskSettlement:
    """The outcome of ``settle_task``: the settlement, and which of the task's new keys
    (in unique-row order) it yielded, to leave out of its window file."""

    settlement: Settlement
    yielded: np.ndarray
    # The write of the task's keys staged again without the yielded ones, left to the caller:
    # nothing in the task waits for it, so it goes beside the task's last writes.
    restage: Callable[[], object] | None = None


def settle_task(
    output: Output,
    folder: str,
    partition: int,
    attempt: int,
    keys: StagedKeys,
    held: Rows | None,
    writers: PortWriters,
    waited_since: float,
) -> TaskSettlement:
    """Stage the task's new keys, settle with the lower partitions, then write the held unique
    rows, yielding to duplicate every unique row whose key a lower partition has (rewriting the
    staged unique files of earlier chunks that hold any)."""
    settlement = Settlement()
    mine = SortedKeys.of(keys)
    stage = partial(stage_keys, output, folder, partition, attempt, mine)
    held_rows = 0 if held is None else held.num_rows
    yielded = np.zeros(len(keys), dtype=bool)
    stamp_dtype = None if keys.stamps is None else keys.stamps.dtype
    if 0 < partition <= SETTLE_WITH_AT_MOST and len(keys):
        wait = max(SETTLE_WAIT_SECONDS, time.monotonic() - waited_since)
        # Only higher partitions read the task's keys, and it reads only lower ones': staging
        # them and looking for the lower ones go side by side.
        look = partial(lower_keys, output, folder, partition, stamp_dtype, wait)
        staged, (lower, settlement.complete) = output.storage.both(stage, look)
        settlement.saw = frozenset(s.name for s in lower)
        yielded = _yielded_to(output, folder, lower, mine)
    else:
        staged = stage()
        settlement.complete = partition == 0 or not len(keys)
    settlement.keys_file = staged
    earlier = len(keys) - held_rows
    if yielded[:earlier].any():
        settlement.superseded += _rewrite_unique(output, writers, yielded[:earlier])
    if held is not None:
        given = yielded[earlier:]
        if (~given).any():
            writers.write("unique", held if not given.any() else held.filter(pa.array(~given)))
        if given.any():
            writers.write("duplicate", held.filter(pa.array(given)))  # last rows of the file
    settlement.yielded = int(yielded.sum())
    if not settlement.yielded:
        return TaskSettlement(settlement, yielded)
    # Higher partitions may read either file: the superseded one holds the same keys and more.
    settlement.superseded.append(staged)
    kept = mine.kept_first(yielded)
    settlement.keys_file = keys_file_name(folder, partition, attempt, len(kept))
    return TaskSettlement(
        settlement, yielded, partial(write_keys, output, settlement.keys_file, kept)
    )


def _check_rows(output: Output, port: str, files: list[PortFile], keys: int, how: str) -> None:
    """A task's staged files hold one row per key it staged for them, or the store is damaged."""
    rows = sum(record.rows for record in files)
    if rows != keys:
        raise StoreError(
            f"staged {port} files {[output.path(r.path) for r in files]} hold {rows} rows, "
            f"but their task {how} {keys} keys for them"
        )


def _rewrite_unique(output: Output, writers: PortWriters, yielded: np.ndarray) -> list[str]:
    """Move the marked rows of the task's earlier unique files (one per chunk, in order) to its
    duplicate file, rewriting only the files that hold any; returns the files replaced."""
    files = writers.closed("unique")
    _check_rows(output, "unique", files, len(yielded), "found")
    replaced = []
    for record, marks in zip(files, _per_file(yielded, files), strict=True):
        if marks.any():
            table = output.read_table(record.path)  # one chunk's rows
            writers.replace(record, table.filter(pa.array(~marks)))
            writers.write("duplicate", table.filter(pa.array(marks)))
            replaced.append(record.path)
    return replaced


def _per_file(marks: np.ndarray, files: list[PortFile]) -> list[np.ndarray]:
    """``marks`` over files' rows laid end to end, cut into each file's part."""
    return np.split(marks, np.cumsum([record.rows for record in files])[:-1])


# -- 2. in the commit --------------------------------------------------------------------------


def every_task_settled(tasks: list[SettlingTask]) -> bool:
    """Whether every task settled with the keys the final attempt of every lower partition
    staged. Files are told apart by name, not by partition and attempt: a failed attempt of a
    re-run stage counts its attempts from 0 again, as another run of the batch does."""
    staged = {task.partition: _keys_files(task.settlement) for task in tasks}
    for task in tasks:
        if task.unique + task.settlement.yielded == 0:
            continue  # no new keys: nothing it could have shared
        if not task.settlement.complete:
            return False
        lower = [names for partition, names in staged.items() if partition < task.partition]
        read = task.settlement.saw
        if not all(names & read for names in lower):
            return False
        if read - frozenset().union(*lower):  # it read keys that no final attempt staged
            return False
    return True


def _keys_files(settlement: Settlement) -> frozenset[str]:
    """The names of the keys files a task staged: its last, and those it replaced (which held
    the same keys in another order)."""
    staged = [settlement.keys_file, *settlement.superseded]
    return frozenset(
        path.rpartition("/")[2] for path in staged if path and path.endswith(KEYS_SUFFIX)
    )


@dataclass
class Moved:
    """Rows the commit moved between a task's ports."""

    task: SettlingTask
    rows: int
    source: str
    target: str
    replaced: list[str]  # the staged files rewritten without them
    keys: StagedKeys | None = None  # the keys of rows promoted back to unique
    # After a demotion, the keys the task still keeps: its window file, written before the
    # commit, also holds the demoted ones, with their rows' expiry values.
    still_kept: StagedKeys | None = None


def settle_window(
    output: Output, tasks: list[SettlingTask], stamp_dtype: np.dtype | None
) -> list[Moved]:
    """Leave each key new in this window with exactly one unique row; returns the moves made
    (the tasks' files are replaced by the rewritten ones)."""
    tasks = [task for task in tasks if task.settlement.keys_file is not None]
    if len(tasks) < 2 and not any(task.settlement.yielded for task in tasks):
        return []
    if every_task_settled(tasks):
        return []
    kept, given = [], []
    for task in tasks:
        total = task.unique + task.settlement.yielded
        staged = read_keys(output, task.settlement.keys_file or "", total, stamp_dtype)
        keys = staged.in_order()
        kept.append(keys.take(np.arange(task.unique)))
        given.append(keys.take(np.arange(task.unique, total)))
    first = first_occurrences(Fingerprints.concat([k.fingerprints for k in kept + given]))
    marks = np.split(first, np.cumsum([len(part) for part in kept + given])[:-1])
    moves = []
    for task, keys, firsts in zip(tasks, kept, marks[: len(kept)], strict=True):
        if (~firsts).any():
            moved = _move_rows(output, task, "unique", ~firsts, "duplicate", at_end=False)
            moved.still_kept = keys.take(firsts)
            moves.append(moved)
    for task, back, keys in zip(tasks, marks[len(kept) :], given, strict=True):
        if back.any():  # after demotions: a demotion adds its file at the end
            moved = _move_rows(output, task, "duplicate", back, "unique", at_end=True)
            moved.keys = keys.take(back)
            moves.append(moved)
    return moves


def _move_rows(
    output: Output, task: SettlingTask, source: str, rows: np.ndarray, target: str, at_end: bool
) -> Moved:
    """Rewrite the task's ``source`` files (laid end to end in order) without the marked rows,
    which go to new staged files of ``target``; a rewritten file keeps its place. ``at_end``: the
    marks cover the last rows of the first file (the yielded ones, at the end of the task's
    duplicate file)."""
    sources = [r for r in task.files if r.port == source]
    if at_end:
        sources = sources[:1]
        rows = np.concatenate([np.zeros(sources[0].rows - len(rows), dtype=bool), rows])
    _check_rows(output, source, sources, len(rows), "staged")
    replaced = []
    for record, marks in zip(sources, _per_file(rows, sources), strict=True):
        if not marks.any():
            continue
        table = output.read_table(record.path)
        if table.num_rows != record.rows:
            raise StoreError(
                f"staged {source} file {output.path(record.path)} holds {table.num_rows} rows, "
                f"but its task wrote {record.rows}"
            )
        at = task.files.index(record)
        moved = _write_staged_file(output, task, target, table.filter(pa.array(marks)))
        left = _write_staged_file(output, task, source, table.filter(pa.array(~marks)))
        task.files[at : at + 1] = [] if left is None else [left]
        task.files += [] if moved is None else [moved]
        replaced.append(record.path)
    return Moved(task, int(rows.sum()), source, target, replaced)


def _write_staged_file(
    output: Output, task: SettlingTask, port: str, rows: pa.Table
) -> PortFile | None:
    if not rows.num_rows:
        return None
    relative = output.new_staging_file(task.folder, port, task.partition, task.attempt)
    return output.write_port_file(port, relative, rows)


def staged_files(tasks: Iterable[SettlingTask], moves: Iterable[Moved]) -> list[str]:
    """Every staged file of the window's tasks: port files, keys files, and those replaced."""
    names = [name for move in moves for name in move.replaced]
    for task in tasks:
        names.extend(r.path for r in task.files)
        names.extend(task.settlement.superseded)
        if task.settlement.keys_file:
            names.append(task.settlement.keys_file)
    return names
