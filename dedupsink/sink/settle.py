"""Keys new in several partitions of one window: exactly one of their rows is unique.

Each task classifies its own rows, so two tasks can both find a key new. They settle it in two
steps, written here together:

1. **In the task** (``settle_in_task``). A task holds back the unique rows of its last chunk
   (all of them in a micro-batch of usual size), *stages* its new keys in the window's staging
   folder (``<stem>-n<count>.keys``: 16 bytes a key, the i-th key the i-th unique row's, then
   those of rows it yielded), then reads the keys other partitions' tasks have staged so far
   and *yields* the held rows whose key is there: they go to ``duplicate`` (the last rows of
   its duplicate file) instead of ``unique``. Of two tasks sharing a key, the one that stages
   later sees the other and yields.
2. **In the commit** (``settle_window``). A task reports which partitions' keys it saw. When,
   for every two tasks with new keys, exactly one saw the other and the one that saw held all
   its unique rows, "saw" orders the tasks in time (a task stages before it reads), so of the
   tasks sharing a key the earliest keeps it and every other yields it: nothing is left to do
   and nothing is read. Otherwise (two tasks finished at the same moment and saw each other,
   a copy was in an earlier chunk, more than ``SETTLE_WITH_AT_MOST`` tasks) the commit reads
   every task's staged keys, laid end to end (the kept parts in partition order, then the
   yielded parts), in one hash pass: a kept key that occurs earlier is demoted to duplicate, a
   yielded key that does not occur earlier (nobody kept it) is promoted back to unique.
   Moving a row means rewriting that task's staged file, found by position without hashing
   any row: the one case in which the driver reads rows. Partitioning the input by key
   (``df.repartition(n, *keys)``) makes it never happen.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from dedupsink.engine.fingerprint import Fingerprints, first_occurrences
from dedupsink.errors import StoreCorruptError, StoreError
from dedupsink.sink.output import Output, PortFile, PortWriters, staged_stem

KEYS_SUFFIX = ".keys"
# A task settles with the staged keys of at most this many other tasks of its window; with
# more, reading them all costs more than the commit's settlement would, and the commit does it.
SETTLE_WITH_AT_MOST = 8


@dataclass
class Settlement:
    """What a task's settlement did, for its summary."""

    keys_file: str | None = None  # staged keys: of the unique rows, then of the yielded ones
    yielded: int = 0  # unique rows given up to another partition: the duplicate file's last rows
    saw: frozenset[tuple[int, int]] = frozenset()  # (partition, attempt) of the keys it read
    held_all: bool = False  # every unique row was written after the keys were read
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


def stage_keys(
    output: Output, folder: str, partition: int, attempt: int, keys: Fingerprints
) -> str:
    """Stage a task's new keys; the name carries the count, so that another task reading the
    file while it is being written (a local disk) can tell it is not complete yet."""
    relative = f"{folder}/{staged_stem(partition, attempt)}-n{len(keys)}{KEYS_SUFFIX}"
    output.storage.write(output.path(relative), bytes(keys.packed()))
    return relative


def read_keys(output: Output, relative: str, count: int) -> Fingerprints:
    data = output.storage.read(output.path(relative))
    if len(data) != 16 * count:
        raise StoreCorruptError(
            output.path(relative), f"holds {len(data)} bytes for {count} keys of 16 bytes"
        )
    return Fingerprints.from_packed(data)


def _staged_by_others(
    output: Output, folder: str, partition: int
) -> list[tuple[str, int, int, int]]:
    """(name, partition, attempt, count) of every keys file other partitions staged so far."""
    found = []
    for name in output.storage.entries(output.path(folder)):
        fields = name.removesuffix(KEYS_SUFFIX).split("-")
        if not name.endswith(KEYS_SUFFIX) or len(fields) != 4 or not fields[3][1:].isdigit():
            continue
        theirs = int(fields[0][1:])
        if theirs != partition:
            found.append((name, theirs, int(fields[1][1:]), int(fields[3][1:])))
    return found


def others_keys(
    output: Output, folder: str, partition: int
) -> tuple[Fingerprints, frozenset[tuple[int, int]]] | None:
    """Every complete set of keys other partitions' tasks have staged, and whose they are; None
    when more than ``SETTLE_WITH_AT_MOST`` tasks staged keys (the commit settles then)."""
    staged = _staged_by_others(output, folder, partition)
    if len({(p, a) for _, p, a, _ in staged}) > SETTLE_WITH_AT_MOST:
        return None
    parts, saw = [], set()
    for name, theirs, attempt, count in staged:
        data = output.storage.read(output.path(f"{folder}/{name}"))
        if len(data) == 16 * count:  # shorter: still being written
            parts.append(Fingerprints.from_packed(data))
            saw.add((theirs, attempt))
    empty = Fingerprints(np.empty(0, np.uint64), np.empty(0, np.uint64))
    return Fingerprints.concat([empty, *parts]), frozenset(saw)


# -- 1. in the task ----------------------------------------------------------------------------


def settle_in_task(
    output: Output,
    folder: str,
    partition: int,
    attempt: int,
    keys: Fingerprints,
    held: pa.RecordBatch | None,
    writers: PortWriters,
) -> tuple[Settlement, int]:
    """Stage the task's new keys, then write its held unique rows, yielding to duplicate those
    whose key another partition's task has staged; returns the settlement and how many held
    rows stayed unique."""
    settlement = Settlement(held_all=held is not None and held.num_rows == len(keys))
    if len(keys):
        settlement.keys_file = stage_keys(output, folder, partition, attempt, keys)
    if held is None:
        return settlement, 0
    yielded = np.zeros(held.num_rows, dtype=bool)
    seen = others_keys(output, folder, partition)
    if seen is None:
        settlement.held_all = False  # too many tasks to read: the commit settles
    else:
        others, settlement.saw = seen
        if len(others):
            mine = keys[len(keys) - held.num_rows :]
            yielded = ~first_occurrences(Fingerprints.concat([others, mine]))[len(others) :]
    if not yielded.any():
        writers.write("unique", held)
        return settlement, held.num_rows
    kept = np.concatenate([np.ones(len(keys) - held.num_rows, dtype=bool), ~yielded])
    if not yielded.all():
        writers.write("unique", held.filter(pa.array(~yielded)))
    writers.write("duplicate", held.filter(pa.array(yielded)))  # last rows of the file
    settlement.yielded = int(yielded.sum())
    reordered = Fingerprints.concat([keys.take(kept), keys.take(~kept)])
    if settlement.keys_file is not None:
        settlement.superseded.append(settlement.keys_file)
    settlement.keys_file = stage_keys(output, folder, partition, attempt, reordered)
    return settlement, held.num_rows - settlement.yielded


# -- 2. in the commit --------------------------------------------------------------------------


def settled_in_tasks(holders: list[Holder]) -> bool:
    """Whether the tasks' own settlement is complete (see the module docstring). A task that
    read the keys of an attempt that then failed may have yielded to rows nobody keeps."""
    finals = {(h.partition, h.attempt) for h in holders}
    if any(not h.settlement.saw <= finals for h in holders):
        return False
    for a, b in itertools.combinations(holders, 2):
        a_saw_b = (b.partition, b.attempt) in a.settlement.saw
        b_saw_a = (a.partition, a.attempt) in b.settlement.saw
        if a_saw_b == b_saw_a:
            return False
        seer = a if a_saw_b else b
        if not seer.settlement.held_all:
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


def settle_window(output: Output, holders: list[Holder]) -> list[Moved]:
    """Leave each key new in this window with exactly one unique row; returns the moves made
    (the holders' files are replaced by the rewritten ones)."""
    holders = [h for h in holders if h.settlement.keys_file is not None]
    if not holders or (len(holders) == 1 and not holders[0].settlement.yielded):
        return []
    if settled_in_tasks(holders):
        return []
    kept, given = [], []
    for holder in holders:
        total = holder.unique + holder.settlement.yielded
        keys = read_keys(output, holder.settlement.keys_file or "", total)
        kept.append(keys[: holder.unique])
        given.append(keys[holder.unique :])
    first = first_occurrences(Fingerprints.concat(kept + given))
    marks = np.split(first, np.cumsum([len(part) for part in kept + given])[:-1])
    moves = []
    for holder, lost in zip(holders, marks[: len(kept)], strict=True):
        if (~lost).any():
            moves.append(_move_rows(output, holder, "unique", ~lost, "duplicate", at_end=False))
    for holder, back in zip(holders, marks[len(kept) :], strict=True):
        if back.any():  # after demotions: a demotion adds its file at the end
            moves.append(_move_rows(output, holder, "duplicate", back, "unique", at_end=True))
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
            relative = (
                f"{holder.folder}/{staged_stem(holder.partition, holder.attempt)}.{port}.parquet"
            )
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
