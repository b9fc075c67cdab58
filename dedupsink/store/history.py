"""The store's history: one row per committed window, kept far longer than its manifests.

Under ``<store>/_history/``: a *record* ``r<version>.rec`` per window, created only if absent
right after its commit point, from the manifest alone (``row_of``), so a redo writes the same
row; and *segments* ``s<first>-<last>.seg`` into which compaction folds aligned blocks of
records every ``FANOUT`` versions. Readers (``read_history``) keep one row a version from
records, segments and kept manifests, so they accept every state a crash can leave. Both files
are msgpack behind the manifest's 16-byte header (``DSH1``, CRC-32, length).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
import pyarrow as pa

from dedupsink.errors import DedupOptionError, StoreCorruptError
from dedupsink.runtime import RUNTIME
from dedupsink.store.format import Manifest
from dedupsink.store.records import StateUse, StoreSettings
from dedupsink.store.storage import Storage
from dedupsink.store.store import BucketStore, find_store
from dedupsink.units import MICROS_PER_DAY, number_text, utc_text

__all__ = [
    "COLUMNS",
    "FANOUT",
    "HISTORY_DIR",
    "KEEP_VERSIONS",
    "SCHEMA",
    "compact",
    "decode",
    "encode",
    "load_history",
    "read_history",
    "record_window",
    "row_of",
    "store_of",
]

HISTORY_DIR = "_history"
HISTORY_MAGIC = b"DSH1"
HISTORY_FORMAT = 1
FANOUT = 16  # versions a level-1 segment covers; each level folds sixteen of the one below
LEVELS = 3  # segments of 16, 256 and 4096 versions
KEEP_VERSIONS = 100_000  # segments ending this far behind the latest version are deleted
_HEADER = struct.Struct("<4sIQ")
_READ_ATTEMPTS = 5  # a reader racing a compaction lists again this many times
# Rows of the records this process created, by (store URL, store id, name): the compaction folds
# them without reading them back (on an object store, fifteen requests every sixteen windows).
_created: dict[tuple[str, str, str], list[Row]] = RUNTIME.cache("store.created_history", dict)
_CREATED_KEEP = 4 * FANOUT

# The history's columns in order, with their Arrow types. ``committed_at`` is stored as
# milliseconds since the epoch; the latest and expiry points as doubles in the store's own
# encoding of the expiry key (microseconds since the epoch for times and dates, a category's
# ordinal, the number itself), with a readable text beside each.
ERROR_REASONS = pa.list_(pa.struct([("reason", pa.string()), ("rows", pa.int64())]))
COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("version", pa.int64()),
    ("query_id", pa.string()),
    ("batch_id", pa.int64()),
    ("committed_at", pa.timestamp("us", tz="UTC")),
    ("unique", pa.int64()),
    ("duplicate", pa.int64()),
    ("expired", pa.int64()),
    ("error", pa.int64()),
    ("keys_added", pa.int64()),
    ("keys_forgotten", pa.int64()),
    ("keys_remembered", pa.int64()),
    # Keys at or below the expiry point still in window files, awaiting a fold (no re-send is
    # a duplicate of them: not remembered); null in rows recorded before they were counted
    # apart, whose ``keys_remembered`` included them.
    ("keys_expired_unfolded", pa.int64()),
    ("cross_partition_duplicates", pa.int64()),
    ("latest_point", pa.float64()),
    ("latest_point_text", pa.string()),
    ("expiry_point", pa.float64()),
    ("expiry_point_text", pa.string()),
    ("store_files", pa.int64()),
    ("store_bytes", pa.int64()),
    ("task_seconds", pa.float64()),
    # Wall time from the window's first task's start to its commit point, and of its commit
    # alone; null in rows recorded before they were.
    ("wall_seconds", pa.float64()),
    ("commit_seconds", pa.float64()),
    # The bytes of remembered keys the window's tasks used (records.StateUse); null in the
    # rows of windows committed before they were counted.
    ("state_loaded_bytes", pa.int64()),
    ("state_loaded_max_bytes", pa.int64()),
    ("state_fetched_bytes", pa.int64()),
    ("state_private_bytes", pa.int64()),
    ("state_mapped_bytes", pa.int64()),
    # The window's error rows by reason, most first; empty in windows without error rows and
    # in those committed before reasons were counted.
    ("error_reasons", ERROR_REASONS),
    # Requests to the storage the window's tasks and commit retried (throttled, reset, timed
    # out), and the seconds lost to them; null in rows recorded before they were counted.
    ("store_retries", pa.int64()),
    ("store_wait_seconds", pa.float64()),
    # The store's schema version the window was written with (records.Publication): 0 for the
    # first schema recorded, one more each time the input's columns changed; null in rows
    # recorded before it was.
    ("schema_version", pa.int64()),
)
SCHEMA = pa.schema([pa.field(name, kind) for name, kind in COLUMNS])
Row = dict[str, Any]
_WIRE_NAMES = tuple("committed_ms" if name == "committed_at" else name for name, _ in COLUMNS)


# -- rows ------------------------------------------------------------------------------------


def row_of(manifest: Manifest) -> Row | None:
    """The history row of the window that committed ``manifest``; None for a version that is
    no window (the store's creation, a release)."""
    last = manifest.last_window
    if last is None or last.version != manifest.version:
        return None
    settings = manifest.settings
    latest = manifest.latest
    expiry = settings.expiry_point(latest)
    return {
        "version": manifest.version,
        "query_id": last.query,
        "batch_id": last.batch,
        "committed_ms": manifest.committed_ms,
        **last.counts.as_dict(),
        "keys_added": last.new_keys,
        "keys_forgotten": last.dropped_keys,
        "keys_remembered": manifest.remembered_keys,
        "keys_expired_unfolded": manifest.expired_unfolded_keys,
        "cross_partition_duplicates": last.cross_partition_duplicates,
        "latest_point": None if latest is None else float(latest),
        "latest_point_text": point_text(latest, settings, manifest.categories),
        "expiry_point": None if expiry is None else float(expiry),
        "expiry_point_text": point_text(expiry, settings, manifest.categories),
        "store_files": len(manifest.files),
        "store_bytes": sum(window_file.nbytes for window_file in manifest.files.values()),
        "task_seconds": float(last.task_seconds),
        "wall_seconds": last.wall_seconds,
        "commit_seconds": last.commit_seconds,
        **_state_columns(last.state),
        "error_reasons": [{"reason": reason, "rows": rows} for reason, rows in last.error_reasons],
        "store_retries": last.store_waits.retries,
        "store_wait_seconds": round(last.store_waits.seconds, 3),
        **_schema_column(manifest),
    }


def _schema_column(manifest: Manifest) -> Row:
    publication = manifest.publication
    if publication is None or publication.schema is None:
        return {}
    return {"schema_version": publication.schema_version}


def _state_columns(state: StateUse) -> Row:
    if state == StateUse():
        return {}
    return {
        "state_loaded_bytes": state.loaded,
        "state_loaded_max_bytes": state.loaded_max,
        "state_fetched_bytes": state.fetched,
        "state_private_bytes": state.private,
        "state_mapped_bytes": state.mapped,
    }


def point_text(
    value: float | None, settings: StoreSettings | Mapping[str, Any], categories: Sequence[str]
) -> str | None:
    """A latest or expiry point as the expiry key's values read (as ``dedupsink inspect``
    shows it); None where there is none (Basic Dedup, an empty store). ``settings`` may also
    be a map of them as recorded (a tool's read of a manifest), of which ``mode`` and
    ``expiry_type`` are used."""
    if value is None:
        return None
    mode: str | None
    if isinstance(settings, StoreSettings):
        mode, expiry_type = settings.mode, str(settings.expiry_type or "")
    else:
        mode, expiry_type = settings.get("mode"), str(settings.get("expiry_type") or "")
    if mode in ("systemTime", "tupleTime"):
        if expiry_type.startswith("date") and value % MICROS_PER_DAY == 0:
            return utc_text(value, zone=False)[:10]
        return utc_text(value, zone=mode == "systemTime" or "tz=" in expiry_type)
    if mode == "categorical":
        ordinal = int(value)
        if ordinal < 0:
            return f"{ordinal} (no category)"
        return categories[ordinal] if ordinal < len(categories) else str(ordinal)
    return number_text(value)


def to_table(rows: Iterable[Row]) -> pa.Table:
    """Rows as an Arrow table of ``SCHEMA``, in the order given."""
    rows = list(rows)
    arrays = []
    for (name, kind), wire in zip(COLUMNS, _WIRE_NAMES, strict=True):
        values = [row.get(wire) for row in rows]
        if name == "error_reasons":
            values = [value or [] for value in values]  # rows recorded before: none counted
        if name == "committed_at":
            values = [None if v is None else v * 1000 for v in values]
            arrays.append(pa.array(values, pa.int64()).cast(kind))
        else:
            arrays.append(pa.array(values, kind))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


# -- files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryFile:
    """A record (``first == last``) or a segment of the rows of versions ``first..last``."""

    name: str
    first: int
    last: int

    @property
    def span(self) -> int:
        return self.last - self.first + 1

    def covers(self, version: int) -> bool:
        return self.first <= version <= self.last


def record_name(version: int) -> str:
    return f"r{version:012d}.rec"


def segment_name(first: int, last: int) -> str:
    return f"s{first:012d}-{last:012d}.seg"


def parse_name(name: str) -> HistoryFile | None:
    """The versions a history file's name says it holds; None for any other name (a local
    conditional create's file written aside, say)."""
    if name.startswith("r") and name.endswith(".rec") and name[1:-4].isdigit():
        version = int(name[1:-4])
        return HistoryFile(name, version, version)
    first, _, last = name[1:-4].partition("-")
    if name.startswith("s") and name.endswith(".seg") and first.isdigit() and last.isdigit():
        return HistoryFile(name, int(first), int(last))
    return None


def encode(rows: list[Row], first: int, last: int) -> bytes:
    """Rows as a history file's bytes: columns of plain msgpack values behind the header."""
    columns = {wire: [row.get(wire) for row in rows] for wire in _WIRE_NAMES}
    payload: bytes = msgpack.packb(
        {"format": HISTORY_FORMAT, "first": first, "last": last, "columns": columns},
        use_bin_type=True,
    )
    return _HEADER.pack(HISTORY_MAGIC, zlib.crc32(payload), len(payload)) + payload


def decode(data: bytes, url: str) -> list[Row]:
    """A history file's rows; damage is a ``StoreCorruptError`` naming the file."""
    if len(data) < _HEADER.size:
        raise StoreCorruptError(url, "history file is truncated")
    magic, crc, length = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != HISTORY_MAGIC:
        raise StoreCorruptError(url, "not a dedupsink history file")
    if len(payload) != length or zlib.crc32(payload) != crc:
        raise StoreCorruptError(url, "history file checksum mismatch (truncated or damaged)")
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        columns: dict[str, list[Any]] = value["columns"]
        count = len(columns["version"])
        return [{name: values[i] for name, values in columns.items()} for i in range(count)]
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreCorruptError(url, f"history file cannot be decoded: {exc}") from exc


class _History:
    """The ``_history`` folder of one store, read and written through its ``Storage``."""

    def __init__(self, store: BucketStore, store_id: str = "") -> None:
        self.store = store
        self.store_id = store_id  # known to a commit: its records' rows are kept in memory
        self.storage: Storage = store.storage
        self.folder = store.path(HISTORY_DIR)
        self.known: dict[str, list[Row]] = {}  # rows of files read or written by this call

    def path(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def url(self, name: str) -> str:
        return self.storage.full_url(self.path(name))

    def files(self) -> list[HistoryFile]:
        """The history's files, listed now (never from a cache), oldest first."""
        found = (parse_name(name) for name in self.storage.entries(self.folder))
        return sorted((f for f in found if f is not None), key=lambda f: (f.first, -f.last))

    def rows(self, file: HistoryFile) -> list[Row]:
        created = _created.get((self.store.url, self.store_id, file.name))
        if created is not None and self.store_id:
            return created
        if file.name not in self.known:
            self.known[file.name] = decode(
                self.storage.read(self.path(file.name)), self.url(file.name)
            )
        return self.known[file.name]

    def create(self, file: HistoryFile, rows: list[Row]) -> None:
        """Create ``file`` only if absent: if it exists, whoever made it wrote these rows."""
        try:
            self.storage.create(self.path(file.name), encode(rows, file.first, file.last))
        except FileExistsError:
            return
        self.known[file.name] = rows
        if file.span == 1 and self.store_id:
            _created[(self.store.url, self.store_id, file.name)] = rows
            while len(_created) > _CREATED_KEEP:
                del _created[next(iter(_created))]

    def delete(self, files: list[HistoryFile]) -> None:
        if files:
            self.storage.delete([self.path(f.name) for f in files])
        for file in files:
            _created.pop((self.store.url, self.store_id, file.name), None)

    def read_all(self, files: list[HistoryFile]) -> list[list[Row]]:
        """The rows of every file, several at once on a remote filesystem."""
        if len(files) <= 1 or not self.storage.remote:
            return [self.rows(f) for f in files]
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(self.rows, files))


# -- writing ---------------------------------------------------------------------------------


def record_window(store: BucketStore, manifest: Manifest) -> None:
    """The commit's part, after the commit point: the row of the window that committed
    ``manifest``, and every ``FANOUT`` versions the compaction (which must run before the
    garbage collection deletes old manifests, whose rows it writes when they have none)."""
    history = _History(store, manifest.store_id)
    row = row_of(manifest)
    if row is not None:
        version = manifest.version
        history.create(HistoryFile(record_name(version), version, version), [row])
    if manifest.version % FANOUT == 0:
        _compact(history, manifest.version)


def compact(store: BucketStore, version: int) -> None:
    """Compact the history as the commit of ``version`` does (see the module's docstring)."""
    _compact(_History(store), version)


def _compact(history: _History, version: int) -> None:
    files = history.files()
    files += _write_missing(history, files, version)
    for level in range(1, LEVELS + 1):
        files = _fold(history, files, FANOUT**level, version)
    history.delete([f for f in files if f.last <= version - KEEP_VERSIONS])


def _write_missing(history: _History, files: list[HistoryFile], version: int) -> list[HistoryFile]:
    """Records of the kept manifests' windows that no file holds (the commit that made them
    crashed after its commit point); returns the files written."""
    written = []
    for kept in history.store.versions():
        if kept == 0 or kept > version or any(f.covers(kept) for f in files):
            continue
        manifest = history.store.read(kept)
        row = None if manifest is None else row_of(manifest)
        if row is not None:
            file = HistoryFile(record_name(kept), kept, kept)
            history.create(file, [row])
            written.append(file)
    return written


def _fold(
    history: _History, files: list[HistoryFile], span: int, version: int
) -> list[HistoryFile]:
    """Fold the smaller files of each complete block of ``span`` versions (``k*span + 1`` to
    ``(k+1)*span``) into that block's segment; the folded files are deleted once it exists."""
    blocks: dict[int, list[HistoryFile]] = {}
    segments = {f.name for f in files if f.span == span}
    for file in files:
        block = (file.first - 1) // span
        if file.span < span and file.first >= 1 and (block + 1) * span <= version:
            blocks.setdefault(block, []).append(file)
    kept = [f for f in files if not any(f in group for group in blocks.values())]
    for block, group in sorted(blocks.items()):
        first, last = block * span + 1, (block + 1) * span
        segment = HistoryFile(segment_name(first, last), first, last)
        if segment.name not in segments:
            history.create(segment, _merged(history.read_all(group)))
        history.delete(group)
        kept.append(segment)
    return sorted(kept, key=lambda f: (f.first, -f.last))


def _merged(parts: Iterable[list[Row]]) -> list[Row]:
    """One row a version, in version order."""
    rows: dict[int, Row] = {}
    for part in parts:
        for row in part:
            rows.setdefault(int(row["version"]), row)
    return [rows[v] for v in sorted(rows)]


# -- reading ---------------------------------------------------------------------------------


def read_history(store: BucketStore) -> pa.Table:
    """Every window the history holds, one row a version, oldest first (``SCHEMA``)."""
    for _ in range(_READ_ATTEMPTS - 1):
        try:
            return to_table(_read_rows(_History(store)))
        except FileNotFoundError:
            continue  # a compaction deleted a file listed a moment ago: its rows are in a segment
    return to_table(_read_rows(_History(store)))


def load_history(
    path: str | None, storage_options: dict[str, Any] | None = None, store_path: str | None = None
) -> pa.Table:
    """The history of the store ``store_path``, or of the one ``path`` names (an output path,
    whose store is ``<path>/_store``, or a store path)."""
    if store_path is None:
        store_path = store_of(path, storage_options)
    return read_history(BucketStore(store_path, storage_options, "storePath"))


def store_of(path: str | None, storage_options: dict[str, Any] | None = None) -> str:
    """The store an output path (``<path>/_store``) or a store path names; refused, naming
    the path, where there is none."""
    found = None if not path else find_store(path, storage_options)
    if found is None:
        raise DedupOptionError(
            "path",
            path,
            "an output path whose _store folder holds a dedup store, or a store path "
            "(storePath); there is no store there",
        )
    return found[0]


def _read_rows(history: _History) -> list[Row]:
    files = history.files()
    parts = history.read_all(files)
    for kept in history.store.versions():
        if kept == 0 or any(f.covers(kept) for f in files):
            continue
        manifest = history.store.read(kept)
        if manifest is None:  # collected after the listing: its row is in a segment now
            raise FileNotFoundError(history.store.manifest_path(kept))
        row = row_of(manifest)
        if row is not None:
            parts.append([row])
    return _merged(parts)
