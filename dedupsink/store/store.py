"""The bucket store: versioned manifests and window files on any supported filesystem.

Layout under the store root::

    _log/<version:012d>.manifest    one immutable manifest per committed version (last 16 kept)
    data/<window file>.keys          window files (immutable; named w<window>-p<partition>-<id>)

A version is committed by the conditional create of its manifest (``Storage.create``): of two
writers exactly one succeeds, the other gets ``StoreConflictError``. Unreferenced files are
deleted later, in batches, so a reader of an older version is not disturbed.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from dedupsink.engine.settings import Settings, human_span
from dedupsink.errors import StoreConflictError, StoreCorruptError, StoreSettingsError
from dedupsink.options import (
    ASSUME_SAME_EXPIRY,
    BUCKET_SPAN,
    EXPIRY_KEY,
    EXPIRY_MODE,
    EXPIRY_PERIOD,
    KEYS,
    NUM_BUCKETS,
    OUTPUT_FORMAT,
    SEQUENCE_KEY,
    STORE_PATH,
    bool_text,
    default_store_path,
)
from dedupsink.options import STORE_DIRNAME_DEFAULT as STORE_DIRNAME
from dedupsink.runtime import RUNTIME
from dedupsink.store.format import Manifest, Segment
from dedupsink.store.records import StoreSettings, now_ms
from dedupsink.store.storage import Entry, Storage, StorageBounds

LOG_DIR = "_log"
DATA_DIR = "data"
MANIFEST_SUFFIX = ".manifest"
KEEP_MANIFESTS = 16
TOMBSTONE_GRACE_VERSIONS = 2
# Old manifests and dropped window files are deleted in batches: one bulk request every so many
# versions instead of one every window (object stores charge per request).
GARBAGE_EVERY = 16
_FETCH_THREADS = 8
# Segments of one window file closer than this are fetched with one ranged read.
_COALESCE_GAP = 1 << 20
_SETTING_OPTIONS = {
    # Before the mode, which follows from it: a store of the other kind is named by this option.
    "sequence_key": SEQUENCE_KEY,
    "sequence_type": SEQUENCE_KEY,
    "mode": EXPIRY_MODE,
    "keys": KEYS,
    "key_types": KEYS,
    "expiry_key": EXPIRY_KEY,
    "expiry_type": EXPIRY_KEY,
    "stamp_kind": EXPIRY_KEY,
    "period": EXPIRY_PERIOD,
    # Before the span and bucket count, which follow from it: a changed setting is named.
    "assume_same_expiry": ASSUME_SAME_EXPIRY,
    "span": BUCKET_SPAN,
    "bucket_count": NUM_BUCKETS,
    "output_format": OUTPUT_FORMAT,
}
_fetch_pool: ThreadPoolExecutor | None = None


class _KnownManifest:
    """The manifest a process last wrote or decoded for a store, with its bytes and what
    identifies its file. Versions are immutable (created only if absent), so the same version
    of the same store, with the same listed size and tag, is the same manifest: a window reads
    it in its tasks and again in its commit, and decoding grows with its live window files. A
    version this process wrote has no listing yet; the next read compares its bytes instead."""

    def __init__(self, manifest: Manifest, data: bytes, entry: Entry | None) -> None:
        self.manifest = manifest
        self.data = data
        self.entry = entry

    def matches(self, version: int, entry: Entry | None) -> bool:
        if self.manifest.version != version:
            return False
        return entry is not None and entry == self.entry

    def holds(self, version: int, data: bytes) -> bool:
        return self.manifest.version == version and self.data == data


_known: dict[str, _KnownManifest] = RUNTIME.cache("store.known_manifests", dict)

# The window files this process wrote lately to a remote store, by store URL and name. A task's
# own new keys are what its process reads first in the next window (its bucket cache merges
# every committed segment), and reading them back costs a request per window on an object
# store. Window files are immutable, and a segment is only ever fetched because a committed
# manifest names it.
_WRITTEN_KEEP_BYTES = 32 << 20
_WRITTEN_FILE_BYTES = 8 << 20
_written_lock = threading.Lock()
_written: OrderedDict[tuple[str, str], bytes] = RUNTIME.cache(
    "store.written_files", OrderedDict, _written_lock
)


def _remember_written(url: str, name: str, data: bytes) -> None:
    if len(data) > _WRITTEN_FILE_BYTES:
        return
    with _written_lock:
        _written[(url, name)] = data
        while sum(len(v) for v in _written.values()) > _WRITTEN_KEEP_BYTES:
            _written.popitem(last=False)


def _written_file(url: str, name: str) -> bytes | None:
    with _written_lock:
        return _written.get((url, name))


def _pool() -> ThreadPoolExecutor:
    global _fetch_pool
    if _fetch_pool is None:
        _fetch_pool = ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="dedup-fetch")
    return _fetch_pool


def manifest_name(version: int) -> str:
    return f"{version:012d}{MANIFEST_SUFFIX}"


class BucketStore:
    """A store at one URL; pickles as that URL and its storage options."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        option: str = STORE_PATH,
        bounds: StorageBounds | None = None,
    ) -> None:
        self.storage = Storage.for_url(url.rstrip("/"), storage_options, option, bounds)
        self.url = self.storage.url
        # Each segment read names its file's URL for its errors: built once, not per segment.
        self._data_url = self.storage.full_url(self.path(DATA_DIR))

    def __reduce__(self) -> tuple[Any, ...]:
        return (BucketStore, (self.url, self.storage.options, STORE_PATH, self.storage.bounds))

    def path(self, *parts: str) -> str:
        return self.storage.path(*parts)

    def manifest_path(self, version: int) -> str:
        return self.path(LOG_DIR, manifest_name(version))

    def data_path(self, name: str) -> str:
        return self.path(DATA_DIR, name)

    def data_url(self, name: str) -> str:
        """A window file's URL, as errors name it."""
        return f"{self._data_url}/{name}"

    # -- reading ---------------------------------------------------------------------------

    def _log(self) -> dict[int, Entry]:
        """Committed versions on disk with their listed entries (never a cached listing)."""
        found = {}
        for name, entry in self.storage.entries(self.path(LOG_DIR)).items():
            number = name.removesuffix(MANIFEST_SUFFIX)
            if name.endswith(MANIFEST_SUFFIX) and number.isdigit():
                found[int(number)] = entry
        return found

    def versions(self) -> list[int]:
        """Committed versions still on disk, oldest first."""
        return sorted(self._log())

    def latest_version(self) -> int | None:
        versions = self._log()
        return max(versions) if versions else None

    def read(self, version: int | None = None) -> Manifest | None:
        """A committed manifest (the latest by default); None for an empty store."""
        entry = None
        if version is None and self.storage.remote:
            found = self._read_after_known()
            if found is not None:
                return found
        if version is None:
            log = self._log()
            if not log:
                return None
            version = max(log)
            entry = log[version]
        known = _known.get(self.url)
        if known is not None and known.matches(version, entry):
            return copy.copy(known.manifest)
        path = self.manifest_path(version)
        try:
            data = self.storage.read(path)
        except FileNotFoundError:
            return None
        if known is not None and known.holds(version, data):
            manifest = known.manifest
        else:
            manifest = Manifest.from_bytes(data, self.storage.full_url(path))
        _known[self.url] = _KnownManifest(manifest, data, entry)
        # Callers get their own top-level object (some set fields on it to derive a version);
        # the nested containers are shared, and nothing mutates a committed version's.
        return copy.copy(manifest)

    def _read_after_known(self) -> Manifest | None:
        """The latest manifest when it is the one after the version this process knows, in one
        round trip instead of a listing's and a read's: versions are created one after another
        (each by the conditional create of the next name), so ``K+1`` present and ``K+2``
        absent make ``K+1`` the latest, as a listing would have said at that instant (a later
        commit is caught by the commit's conditional create either way). None where that does
        not hold: no known version, the known one still the latest, or several versions since.
        Tasks of a steady stream are the case it serves: their process read ``K`` a window ago
        and the driver has committed ``K+1`` since."""
        known = _known.get(self.url)
        if known is None:
            return None
        after = known.manifest.version + 1
        data, beyond = self.storage.gather(
            [partial(self._read_if_present, after), partial(self._read_if_present, after + 1)]
        )
        if data is None or beyond is not None:
            return None
        manifest = Manifest.from_bytes(data, self.storage.full_url(self.manifest_path(after)))
        _known[self.url] = _KnownManifest(manifest, data, None)
        return copy.copy(manifest)

    def _read_if_present(self, version: int) -> bytes | None:
        try:
            return self.storage.read(self.manifest_path(version))
        except FileNotFoundError:
            return None

    def read_base(self, version: int, store_id: str) -> Manifest:
        """The version a window's tasks classified against: the one this process last wrote or
        read when it is that version of this store (it cannot have changed), else read."""
        known = _known.get(self.url)
        if known is not None and (known.manifest.version, known.manifest.store_id) == (
            version,
            store_id,
        ):
            return copy.copy(known.manifest)
        manifest = self.read(version)
        if manifest is None or manifest.store_id != store_id:
            raise StoreConflictError(
                f"store {self.url} no longer has version {version} of store {store_id} that this "
                "window was classified against (was it deleted and created again?)"
            )
        return manifest

    def fetch(self, segments: Sequence[Segment]) -> list[memoryview]:
        """Read segments, one ranged read per run of nearby segments of a window file, several
        files in parallel.

        The bytes land in one buffer allocated by the calling thread: bytes allocated by the
        pool's threads would come from their own malloc arenas, which keep freed memory."""
        buffer = memoryview(bytearray(sum(s.length for s in segments)))
        views, offset = [], 0
        for segment in segments:
            views.append(buffer[offset : offset + segment.length])
            offset += segment.length
        reads = _coalesce(list(zip(segments, views, strict=True)))
        filled: dict[int, int] = {}

        def one(group: list[tuple[Segment, memoryview]]) -> None:
            path = self.data_path(group[0][0].file)
            start = group[0][0].offset
            end = max(s.offset + s.length for s, _ in group)
            mine = _written_file(self.url, group[0][0].file)
            try:
                if mine is not None:
                    data = mine[start:end]
                elif len(group) == 1:
                    filled[id(group[0][1])] = self.storage.read_into(path, start, group[0][1])
                    return
                else:
                    data = self.storage.read_range(path, start, end)
            except FileNotFoundError as exc:
                raise StoreCorruptError(
                    self.data_url(group[0][0].file),
                    "window file referenced by the index is missing",
                ) from exc
            for segment, view in group:
                part = data[segment.offset - start : segment.offset - start + segment.length]
                view[: len(part)] = part
                filled[id(view)] = len(part)

        if len(reads) <= 1 or not self.storage.remote:
            for group in reads:  # local reads are quicker than handing them to threads
                one(group)
        else:
            list(_pool().map(one, reads))
        # A short read leaves the view short: the segment's length check reports it.
        return [view[: filled.get(id(view), 0)] for view in views]

    # -- creating and checking -------------------------------------------------------------

    def open(self, settings: Settings) -> Manifest:
        """The latest manifest, creating the store on first use; settings must match."""
        manifest = self.read()
        if manifest is None:
            manifest = Manifest(0, uuid.uuid4().hex, StoreSettings.of(settings), now_ms())
            try:
                self.commit(manifest)
            except StoreConflictError:
                manifest = self.read()
                if manifest is None:
                    raise
        check_settings(manifest.settings, settings, self.url)
        return manifest

    # -- writing ---------------------------------------------------------------------------

    def write_window_file(self, name: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        """Write a window file, whole or as chunks in order (no joined copy of large folds)."""
        chunks = [data] if isinstance(data, bytes | bytearray | memoryview) else data
        self.storage.write(self.data_path(name), chunks)
        if self.storage.remote and sum(len(chunk) for chunk in chunks) <= _WRITTEN_FILE_BYTES:
            _remember_written(self.url, name, b"".join(chunks))

    def commit(self, manifest: Manifest) -> None:
        """Make ``manifest`` the visible version: created only if that version is absent.

        A writer that loses the race gets ``StoreConflictError`` naming the winner. A create
        whose reply was lost and whose retry found the version present is recognised by the
        bytes: if they are ours, the commit happened."""
        path = self.manifest_path(manifest.version)
        data = manifest.to_bytes()
        try:
            self.storage.create(path, data)
        except FileExistsError as exc:
            try:
                present = self.storage.read(path)
            except FileNotFoundError:
                present = b""
            if present != data:
                raise StoreConflictError(self._conflict_message(manifest.version, present)) from exc
        _known[self.url] = _KnownManifest(copy.copy(manifest), data, None)

    def _conflict_message(self, version: int, present: bytes) -> str:
        try:
            winner = Manifest.from_bytes(
                present, self.storage.full_url(self.manifest_path(version))
            )
        except StoreCorruptError:
            winner = None
        who = "another writer"
        if winner is not None and winner.last_window is not None:
            who = f"query {winner.last_window.query} (batch {winner.last_window.batch})"
        elif winner is not None and winner.owner is not None:
            who = f"query {winner.owner.query}"
        return (
            f"store {self.url} already has version {version}: {who} committed it first. This "
            "window was classified against the version before it and cannot be committed; "
            "restart the query to re-run the batch."
        )

    def collect_garbage(self, manifest: Manifest) -> list[str]:
        """Every ``GARBAGE_EVERY`` versions, delete in one bulk request: the window files dropped
        at least two versions ago, window files of earlier windows that no version references
        (failed attempts), manifests older than the last 16, and what conditional creates a
        crash interrupted left aside. Returns the window files deleted."""
        if manifest.version % GARBAGE_EVERY:
            return []
        log = self.storage.entries(self.path(LOG_DIR))
        data = self.storage.entries(self.path(DATA_DIR))
        referenced = set(manifest.files) | {name for name, _ in manifest.tombstones}
        due = garbage_due(manifest)
        orphans = [n for n in data if n not in referenced and _window_of(n) <= manifest.version]
        old = [n for n in log if _version_of(n) <= manifest.version - KEEP_MANIFESTS]
        aside = [n for n in log if _aside_of(n) <= manifest.version]
        files = [n for n in due if n in data] + orphans
        self.storage.delete(
            [self.data_path(n) for n in files] + [self.path(LOG_DIR, n) for n in old + aside]
        )
        return files

    def discard_window_files(self, names: list[str]) -> None:
        """Delete window files that no version ever listed as live (a sequence store's tasks'
        files, folded by the very commit that added them); the collection would otherwise
        keep them until it next runs."""
        if names:
            self.storage.delete([self.data_path(name) for name in names])

    def disk_usage(self) -> tuple[int, int]:
        """(number of window files, bytes) under data/."""
        entries = self.storage.entries(self.path(DATA_DIR))
        return len(entries), sum(entry.size for entry in entries.values())


def find_store(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[str, str | None] | None:
    """The store an output path or a store path names, and the output root whose ports it
    commits when that is known: ``(store URL, output URL or None)``; None if there is none."""
    url = url.rstrip("/")
    if BucketStore(url, storage_options, "PATH").latest_version() is not None:
        parent, _, name = url.rpartition("/")
        return url, parent if name == STORE_DIRNAME and parent else None
    default = default_store_path(url)
    if BucketStore(default, storage_options, "PATH").latest_version() is not None:
        return default, url
    return None


def garbage_due(manifest: Manifest) -> list[str]:
    return [
        name
        for name, dropped in manifest.tombstones
        if dropped + TOMBSTONE_GRACE_VERSIONS <= manifest.version
    ]


def _coalesce(
    pairs: list[tuple[Segment, memoryview]],
) -> list[list[tuple[Segment, memoryview]]]:
    """Group segments into reads: per window file, in offset order, while the gap is small."""
    groups: list[list[tuple[Segment, memoryview]]] = []
    for pair in sorted(pairs, key=lambda p: (p[0].file, p[0].offset)):
        last = groups[-1][-1][0] if groups else None
        if (
            last is not None
            and last.file == pair[0].file
            and pair[0].offset - (last.offset + last.length) <= _COALESCE_GAP
        ):
            groups[-1].append(pair)
        else:
            groups.append([pair])
    return groups


def _version_of(name: str) -> int:
    """The version of a manifest's name; a large number for any other name."""
    number = name.removesuffix(MANIFEST_SUFFIX)
    return int(number) if name.endswith(MANIFEST_SUFFIX) and number.isdigit() else 1 << 62


def _aside_of(name: str) -> int:
    """The version of a manifest a local or HDFS conditional create wrote aside before linking
    it into place (``.<version>.manifest.<id>.tmp``); a large number for any other name."""
    number = name[1:].split(".", 1)[0]
    if name.startswith(".") and name.endswith(".tmp") and number.isdigit():
        return int(number)
    return 1 << 62


def _window_of(name: str) -> int:
    """The window number in a window file name ``w<window>-p<partition>-<id>.keys``."""
    head = name.split("-", 1)[0]
    return int(head[1:]) if head.startswith("w") and head[1:].isdigit() else -1


def window_file_name(window: int, partition: int) -> str:
    return f"w{window:010d}-p{partition:05d}-{uuid.uuid4().hex[:12]}.keys"


def check_settings(recorded: StoreSettings, settings: Settings, url: str) -> None:
    """Refuse options that contradict the settings the store was created with."""
    # Compared as recorded, field by field: the option of the first that differs is named,
    # with the values as the store holds them (lists, not tuples).
    old, new = recorded.to_wire(), StoreSettings.of(settings).to_wire()
    for name, option in _SETTING_OPTIONS.items():
        if old[name] != new[name]:
            changed = _changed(name, old, new, url)
            raise StoreSettingsError(option, _setting_text(name, new), changed)


def _changed(name: str, recorded: dict[str, Any], wanted: dict[str, Any], url: str) -> str:
    if name == "key_types":
        changed = [
            f"{key}: {old} -> {new}"
            for key, old, new in zip(wanted["keys"], recorded[name], wanted[name], strict=False)
            if old != new
        ]
        return (
            f"the column types the store at {url} was created with (changed: {', '.join(changed)})"
        )
    if name == "expiry_type":
        column = wanted["expiry_key"]
        return (
            f"the column type the store at {url} was created with "
            f"(changed: {column}: {recorded[name]} -> {wanted[name]})"
        )
    text = f"{_setting_text(name, recorded)}, the value the store at {url} was created with"
    if name == "assume_same_expiry":
        text += " (the store keeps its keys by time bucket with true and by key hash with false)"
    return text


def _setting_text(name: str, settings: dict[str, Any]) -> object:
    """A recorded setting as the option's value is written: periods and spans in the expiry
    key's domain (``24 hours``, not microseconds), Basic Dedup as the absence of an expiry key."""
    value = settings[name]
    if name in ("period", "span"):
        return human_span(value, settings["mode"])
    if name == "mode" and value == "basic":
        return "none (Basic Dedup: no expiryKey)"
    if name == "sequence_key" and value is None:
        return "none (dedup by key, not by sequence)"
    if name == "keys":
        return ",".join(value or [])
    if name == "assume_same_expiry":
        return bool_text(bool(value))
    return value
