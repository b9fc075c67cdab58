"""The store's recorded settings and the commit protocol's state as small typed records,
stored inside each manifest.

Each record is frozen and converts to and from the plain msgpack values the manifest holds
(``to_wire`` / ``from_wire``), so tools can still read a manifest without this package. The
glossary in docs/ARCHITECTURE.md defines the words used here (window, version, owner, fence,
publication).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from dedupsink.engine.classify import PORTS
from dedupsink.engine.expiry_policy import ExpiryPolicy, Mode
from dedupsink.engine.settings import KeyHash, Settings, StampKind
from dedupsink.options import ASSUME_SAME_EXPIRY_DEFAULT, OUTPUT_FORMAT_DEFAULT
from dedupsink.store.retry import StoreWaits


@dataclass(frozen=True)
class StoreSettings:
    """The settings a store was created with (``Settings`` but ``maxExpiryJump``, which may
    change): a query whose options resolve to others is refused (``store.check_settings``)."""

    mode: Mode
    keys: tuple[str, ...]
    key_types: tuple[str, ...]
    expiry_key: str | None
    expiry_type: str | None
    stamp_kind: StampKind
    # Periods and spans in the expiry key's units, int or float as resolved (and kept so).
    period: float | None
    span: float | None
    bucket_count: int
    assume_same_expiry: bool = ASSUME_SAME_EXPIRY_DEFAULT
    output_format: str = OUTPUT_FORMAT_DEFAULT
    sequence_key: str | None = None
    sequence_type: str | None = None
    # The key placement (``Settings.key_hash``, ``key_shards``); a store recorded before it
    # existed places keys by fingerprint alone, one shard a time bucket.
    key_hash: KeyHash = "fingerprint"
    key_shards: int = 1

    @classmethod
    def of(cls, settings: Settings) -> StoreSettings:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})

    def engine_settings(self) -> Settings:
        """The settings the engine classifies with (no ``maxExpiryJump``: nothing to check)."""
        return Settings(**{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def expiry(self) -> ExpiryPolicy:
        return ExpiryPolicy(self.mode, self.period, self.expiry_type)

    def expiry_point(self, latest: float | None) -> float | None:
        return self.expiry.expiry_point(latest)

    def to_wire(self) -> dict[str, Any]:
        wire = {f.name: getattr(self, f.name) for f in fields(self)}
        wire["keys"], wire["key_types"] = list(self.keys), list(self.key_types)
        if (self.key_hash, self.key_shards) == _PLACED_BY_FINGERPRINT:
            # As a store recorded before placement existed wrote it: its bytes stay the same.
            del wire["key_hash"], wire["key_shards"]
        return wire

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> StoreSettings:
        recorded = {f.name: value[f.name] for f in fields(cls) if f.name not in _ADDED_LATER}
        recorded["keys"], recorded["key_types"] = tuple(value["keys"]), tuple(value["key_types"])
        # A store created before the setting existed behaves as its default did then.
        same = value.get("assume_same_expiry", ASSUME_SAME_EXPIRY_DEFAULT)
        placement = {name: value[name] for name in ("key_hash", "key_shards") if name in value}
        return cls(**recorded, assume_same_expiry=same, **placement)


# Settings a store recorded before they existed lacks, read as their defaults then.
_ADDED_LATER = ("assume_same_expiry", "key_hash", "key_shards")
_PLACED_BY_FINGERPRINT = ("fingerprint", 1)


def now_ms() -> int:
    """The wall clock in milliseconds since the epoch, as the records keep their times."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Owner:
    """The query run that holds a store: its lease lasts ``timeout_ms`` after its last commit.

    ``run`` tells two runs of one query apart (each start from its checkpoint is a run); a
    run that lost the store is fenced by it. ``since`` is the version at which this run took
    the store (its epoch)."""

    query: str
    run: str
    heartbeat_ms: int
    timeout_ms: int
    since: int

    def lapses_at_ms(self) -> int:
        return self.heartbeat_ms + self.timeout_ms

    def to_wire(self) -> list[Any]:
        return [self.query, self.run, self.heartbeat_ms, self.timeout_ms, self.since]

    @classmethod
    def from_wire(cls, value: Any) -> Owner | None:
        if value is None:
            return None
        query, run, heartbeat_ms, timeout_ms, since = value
        return cls(query, run, int(heartbeat_ms), int(timeout_ms), int(since))


@dataclass(frozen=True)
class Fence:
    """A query run that lost the store (taken over, or released by an operator): it may never
    commit to it again, whatever it believes about its lease."""

    query: str
    run: str
    by: str  # the query that took the store, or "release"
    version: int

    def to_wire(self) -> list[Any]:
        return [self.query, self.run, self.by, self.version]

    @classmethod
    def from_wire(cls, value: Any) -> Fence:
        query, run, by, version = value
        return cls(query, run, by, int(version))


@dataclass(frozen=True)
class Move:
    """One port file of a window: where its task staged it and the name it is published under
    (both relative to the output root: the same name where a format's tasks write straight
    into its tables), its size in bytes and its rows (None in plans written before they were
    recorded), and for Delta ports the ``stats`` JSON its add action carries (None: not
    worked out, as in plans written before it was)."""

    staged: str
    target: str
    size: int | None
    rows: int | None = None
    stats: str | None = None

    @property
    def port(self) -> str:
        """The port the file belongs to: the first folder of its published name."""
        return self.target.split("/", 1)[0]

    @property
    def in_place(self) -> bool:
        """Whether the file was staged where it is published (nothing to move)."""
        return self.staged == self.target

    def to_wire(self) -> list[Any]:
        wire = [self.staged, self.target, self.size, self.rows]
        # Without statistics a move is written as before they existed: the same bytes.
        return wire if self.stats is None else [*wire, self.stats]

    @classmethod
    def from_wire(cls, value: Any) -> Move:
        staged, target, size, rows, *rest = value
        return cls(staged, target, size, rows, rest[0] if rest else None)


@dataclass(frozen=True)
class Logged:
    """A published file as a sink-log entry lists it: name (relative to the output root),
    size and modification time."""

    target: str
    size: int
    modified_ms: int

    def to_wire(self) -> list[Any]:
        return [self.target, self.size, self.modified_ms]

    @classmethod
    def from_wire(cls, value: Any) -> Logged:
        target, size, modified_ms = value
        return cls(target, int(size), int(modified_ms))


@dataclass(frozen=True)
class LogEntry:
    """One entry of a port's Spark file-sink log: ``<port>/_spark_metadata/<log_id>`` listing
    ``files`` (targets relative to the output root). ``logged_before`` is how many files the
    port's log listed before it, which a compaction entry must repeat; a compaction also
    carries the files logged since the previous compaction (``earlier``: None in plans from
    before the store recorded them, whose entries are then read)."""

    port: str
    log_id: int
    files: tuple[str, ...]
    logged_before: int | None
    earlier: tuple[Logged, ...] | None = None

    def to_wire(self) -> list[Any]:
        earlier = None if self.earlier is None else [f.to_wire() for f in self.earlier]
        return [self.log_id, list(self.files), self.logged_before, earlier]

    @classmethod
    def from_wire(cls, port: str, value: Any) -> LogEntry:
        log_id, files, logged_before, earlier = value
        return cls(
            port,
            int(log_id),
            tuple(files),
            None if logged_before is None else int(logged_before),
            None if earlier is None else tuple(Logged.from_wire(f) for f in earlier),
        )


@dataclass(frozen=True)
class Publication:
    """How a committed window becomes readable, whatever the ports' format: its port files
    (``moves``: where each was staged, where it is published) and, for plain Parquet ports,
    one Spark sink-log entry per port (``entries``; none for table formats, whose own commits
    carry the files). Everything a publisher writes follows from this record (sizes and the
    modification time included), so publishing twice, or by two processes at once, writes the
    same bytes or finds the same table commit made."""

    version: int
    folder: str  # the window's staging folder, relative to the output root
    modified_ms: int
    moves: tuple[Move, ...]
    entries: tuple[LogEntry, ...]
    # The input's schema the window was written with (an Arrow IPC schema, every column
    # nullable, no metadata), which a table publisher merges into its table in the window's own
    # commit; and the store's schema version: 0 for the first schema the store recorded, one
    # more each time a window's differs from the window's before it. None and 0 in records
    # written before the schema was recorded (the keys are then absent, the bytes as before).
    schema: bytes | None = None
    schema_version: int = 0

    def size_of(self, target: str) -> int | None:
        for move in self.moves:
            if move.target == target:
                return move.size
        return None

    def entry(self, port: str) -> LogEntry | None:
        return next((e for e in self.entries if e.port == port), None)

    def files_of(self, port: str) -> list[Move]:
        """The port files of ``port`` in this window, in their published order."""
        return [move for move in self.moves if move.port == port]

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "window": self.version,
            "folder": self.folder,
            "modified_ms": self.modified_ms,
            "moves": [move.to_wire() for move in self.moves],
            "logs": {entry.port: entry.to_wire() for entry in self.entries},
        }
        if self.schema is not None:  # absent in older records, which re-encode identically
            wire["schema"], wire["schema_version"] = self.schema, self.schema_version
        return wire

    @classmethod
    def from_wire(cls, value: Any) -> Publication | None:
        if value is None:
            return None
        return cls(
            int(value["window"]),
            value["folder"],
            int(value["modified_ms"]),
            tuple(Move.from_wire(move) for move in value["moves"]),
            tuple(LogEntry.from_wire(port, entry) for port, entry in value["logs"].items()),
            value.get("schema"),
            int(value.get("schema_version", 0)),
        )


@dataclass(frozen=True)
class WindowCounts:
    """Rows per port of one window (or of a task of it)."""

    unique: int = 0
    duplicate: int = 0
    expired: int = 0
    error: int = 0

    def __getitem__(self, port: str) -> int:
        return int(getattr(self, port))

    @property
    def total(self) -> int:
        return self.unique + self.duplicate + self.expired + self.error

    def __add__(self, other: WindowCounts) -> WindowCounts:
        return WindowCounts(*(self[p] + other[p] for p in PORTS))

    def moved(self, rows: int, source: str, target: str) -> WindowCounts:
        """These counts with ``rows`` rows moved from port ``source`` to port ``target``."""
        values: dict[str, int] = {p: self[p] for p in PORTS}
        values[source] -= rows
        values[target] += rows
        return WindowCounts(**values)

    def as_dict(self) -> dict[str, int]:
        return {port: self[port] for port in PORTS}

    def text(self) -> str:
        return " ".join(f"{port}={self[port]}" for port in PORTS)

    @classmethod
    def from_dict(cls, value: dict[str, int]) -> WindowCounts:
        return cls(**{port: int(value.get(port, 0)) for port in PORTS})


@dataclass(frozen=True)
class StateUse:
    """The bytes of remembered keys a task used (``store/cache.py``), or a window's tasks did.

    ``loaded``: bytes of the buckets the lookups searched (from the process's cache or not);
    ``loaded_max``: the largest task's ``loaded``; ``fetched``: bytes of segments read from the
    store, no copy of them being on the machine; ``private``: what the tasks' processes hold
    in their own memory (cache and filter), summed over the processes; ``mapped``: the machine's
    shared copies the process maps, the largest of the processes (shared, so not summed)."""

    loaded: int = 0
    loaded_max: int = 0
    fetched: int = 0
    private: int = 0
    mapped: int = 0

    @classmethod
    def of_tasks(cls, tasks: Sequence[tuple[str, StateUse]]) -> StateUse:
        """A window's use from its tasks' (process, use): a process's holdings counted once,
        as its last task left them."""
        held = {process: use for process, use in tasks}
        return cls(
            loaded=sum(use.loaded for _, use in tasks),
            loaded_max=max((use.loaded for _, use in tasks), default=0),
            fetched=sum(use.fetched for _, use in tasks),
            private=sum(use.private for use in held.values()),
            mapped=max((use.mapped for use in held.values()), default=0),
        )

    def to_wire(self) -> list[int]:
        return [self.loaded, self.loaded_max, self.fetched, self.private, self.mapped]

    @classmethod
    def from_wire(cls, value: Any) -> StateUse:
        return cls(*(int(v) for v in value)) if value else cls()

    def task_text(self) -> str:
        """One task's use, as its log line says it."""
        return (
            f"state loaded {_megabytes(self.loaded)} ({_megabytes(self.fetched)} from the store);"
            f" this process holds {_megabytes(self.private)} private + {_megabytes(self.mapped)}"
            " mapped"
        )

    def text(self) -> str:
        return (
            f"state loaded {_megabytes(self.loaded)} (largest task {_megabytes(self.loaded_max)}"
            f", {_megabytes(self.fetched)} from the store), held {_megabytes(self.private)}"
            f" private + {_megabytes(self.mapped)} mapped"
        )


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


@dataclass(frozen=True)
class WindowRecord:
    """What a version's window was: who committed it and what it did (for ``inspect`` and the
    ``dedupsink run`` progress lines)."""

    # The version the window's commit created (stored under the key "window"): the window's
    # number wherever a person sees one (``run``'s lines, the sink's log, ``inspect``,
    # ``lookup``, the history, the report).
    version: int
    query: str
    batch: int
    counts: WindowCounts = field(default_factory=WindowCounts)
    new_keys: int = 0
    cross_partition_duplicates: int = 0
    dropped_keys: int = 0
    task_seconds: float = 0.0
    state: StateUse = field(default_factory=StateUse)
    # The window's error rows by reason, most first (empty in records written before).
    error_reasons: tuple[tuple[str, int], ...] = ()
    # Requests to the store and the ports' storage its tasks and its commit (up to the commit
    # point) retried, and the seconds lost to them: a brownout shows here.
    store_waits: StoreWaits = field(default_factory=StoreWaits)
    # Wall time from the window's first task's start to its commit point, and of its commit
    # alone (from the tasks' end to the commit point); None in records written before.
    wall_seconds: float | None = None
    commit_seconds: float | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "window": self.version,
            "query": self.query,
            "batch": self.batch,
            "counts": self.counts.as_dict(),
            "new_keys": self.new_keys,
            "cross_partition_duplicates": self.cross_partition_duplicates,
            "dropped_keys": self.dropped_keys,
            "task_seconds": self.task_seconds,
        }
        if self.state != StateUse():  # a record written before the state was counted: as then
            wire["state"] = self.state.to_wire()
        if self.error_reasons:  # absent when none, so older records re-encode identically
            wire["errors"] = [list(entry) for entry in self.error_reasons]
        if self.store_waits.retries:  # the same
            wire["store"] = [self.store_waits.retries, round(self.store_waits.seconds, 3)]
        if self.wall_seconds is not None:  # the same
            wire["wall"] = [self.wall_seconds, self.commit_seconds]
        return wire

    @classmethod
    def from_wire(cls, value: Any) -> WindowRecord | None:
        if not value:
            return None
        return cls(
            int(value["window"]),
            value["query"],
            int(value["batch"]),
            WindowCounts.from_dict(value["counts"]),
            int(value["new_keys"]),
            int(value["cross_partition_duplicates"]),
            int(value["dropped_keys"]),
            float(value["task_seconds"]),
            StateUse.from_wire(value.get("state")),
            tuple((str(reason), int(rows)) for reason, rows in value.get("errors") or ()),
            StoreWaits(*_waits(value.get("store"))),
            *_wall(value.get("wall")),
        )


def _wall(value: Any) -> tuple[float | None, float | None]:
    if not value:
        return None, None
    wall, commit = value
    return float(wall), None if commit is None else float(commit)


def _waits(value: Any) -> tuple[int, float]:
    retries, seconds = value or (0, 0.0)
    return int(retries), float(seconds)


def error_reasons(counts: Iterable[Mapping[str, int]]) -> tuple[tuple[str, int], ...]:
    """Tasks' error rows by reason, summed, most first (then by reason)."""
    total: dict[str, int] = {}
    for task in counts:
        for reason, rows in task.items():
            total[reason] = total.get(reason, 0) + rows
    return tuple(sorted(total.items(), key=lambda entry: (-entry[1], entry[0])))


@dataclass(frozen=True)
class StoreTotals:
    """What a store counted over all its windows: how many it committed, the keys (or
    producers) it remembers now, the rows each port was given, and the keys its window files
    still hold though they are at or below the expiry point (``expired_unfolded``: no re-send
    is a duplicate of them; they wait for a fold or their file's expiry to remove them).

    ``remembered`` are the keys that make a re-send a duplicate. A store committed before
    ``expired_unfolded`` was counted (the key absent) counted both as remembered, until its next
    window."""

    windows: int = 0
    remembered: int = 0
    counts: WindowCounts = field(default_factory=WindowCounts)
    expired_unfolded: int = 0

    def after_window(
        self, counts: WindowCounts, remembered: int, expired_unfolded: int = 0
    ) -> StoreTotals:
        return StoreTotals(self.windows + 1, remembered, self.counts + counts, expired_unfolded)

    def to_wire(self) -> dict[str, int]:
        if self == StoreTotals():
            return {}  # a store records no totals before its first window
        wire = {"remembered": self.remembered, "windows": self.windows, **self.counts.as_dict()}
        if self.expired_unfolded:  # absent when none: older totals re-encode identically
            wire["expired_unfolded"] = self.expired_unfolded
        return wire

    @classmethod
    def from_wire(cls, value: dict[str, int]) -> StoreTotals:
        if not value:
            return cls()
        return cls(
            int(value["windows"]),
            int(value["remembered"]),
            WindowCounts.from_dict(value),
            int(value.get("expired_unfolded", 0)),
        )
