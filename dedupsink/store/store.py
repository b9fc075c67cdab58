"""The bucket store: versioned manifests and window files on any fsspec filesystem.

Layout under the store root::

    _log/<version:012d>.manifest    one immutable manifest per committed version (last 16 kept)
    _log/<version:012d>.published   marker: the version's port files are published
    data/<window file>.keys          window files (immutable; named w<window>-p<partition>-<id>)

Only whole-file writes, ranged reads, listing, a file rename and deletes are used: nothing a
remote filesystem lacks. A version becomes visible when its manifest appears under its final
name (written aside, then renamed), so a crash at any point leaves the previous version intact;
files a new version no longer references are deleted two versions later, so a reader of an
older version is not disturbed.
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dedupsink.engine.settings import Settings
from dedupsink.errors import StoreConflictError, StoreCorruptError, StoreError, StoreSettingsError
from dedupsink.options import (
    ASSUME_SAME_EXPIRY,
    ASSUME_SAME_EXPIRY_DEFAULT,
    BUCKET_SPAN,
    EXPIRY_KEY,
    EXPIRY_MODE,
    EXPIRY_PERIOD,
    KEYS,
    NUM_BUCKETS,
    bool_text,
)
from dedupsink.store.format import Manifest, Segment

LOG_DIR = "_log"
DATA_DIR = "data"
MANIFEST_SUFFIX = ".manifest"
PUBLISHED_SUFFIX = ".published"
KEEP_MANIFESTS = 16
TOMBSTONE_GRACE_VERSIONS = 2
_FETCH_THREADS = 8
_SETTING_OPTIONS = {
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
}
# Settings recorded since a later release: a store written before has no such field, and
# behaves as the default did then.
_SETTING_DEFAULTS: dict[str, Any] = {"assume_same_expiry": ASSUME_SAME_EXPIRY_DEFAULT}
_fetch_pool: ThreadPoolExecutor | None = None
# The manifest each store (by URL) last wrote or decoded in this process, with its path and
# bytes. A window reads the same version twice (its tasks, then its commit) and the commit has
# just written the version the next window's tasks read; decoding costs ~2 us per live window
# file, so a day's index would make every window slower. Versions are immutable, and a read
# still fetches the bytes and compares them, so a rewritten or damaged file is decoded afresh.
_last_manifest: dict[str, tuple[str, bytes, Manifest]] = {}


def now_ms() -> int:
    return int(time.time() * 1000)


def _pool() -> ThreadPoolExecutor:
    global _fetch_pool
    if _fetch_pool is None:
        _fetch_pool = ThreadPoolExecutor(_FETCH_THREADS, thread_name_prefix="dedup-fetch")
    return _fetch_pool


class BucketStore:
    """A store at one URL; pickles as that URL so it travels to executors."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = storage_options or {}
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.root = self.root.rstrip("/")

    def __reduce__(self) -> tuple[Any, ...]:
        return (BucketStore, (self.url, self.storage_options))

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def manifest_path(self, version: int) -> str:
        return self.path(LOG_DIR, f"{version:012d}{MANIFEST_SUFFIX}")

    def data_path(self, name: str) -> str:
        return self.path(DATA_DIR, name)

    # -- reading ---------------------------------------------------------------------------

    def _log_names(self) -> list[str]:
        """The file names (without folders) in the store's log folder; none before it exists."""
        try:
            names = self.fs.ls(self.path(LOG_DIR), detail=False)
        except FileNotFoundError:
            return []
        return [name.rstrip("/").rsplit("/", 1)[-1] for name in names]

    def versions(self) -> list[int]:
        """Committed versions still on disk, oldest first."""
        found = []
        for base in self._log_names():
            if base.endswith(MANIFEST_SUFFIX) and base[: -len(MANIFEST_SUFFIX)].isdigit():
                found.append(int(base[: -len(MANIFEST_SUFFIX)]))
        return sorted(found)

    def read(self, version: int | None = None) -> Manifest | None:
        """A committed manifest (the latest by default); None for an empty store."""
        if version is None:
            versions = self.versions()
            if not versions:
                return None
            version = versions[-1]
        path = self.manifest_path(version)
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        known = _last_manifest.get(self.url)
        if known is not None and known[0] == path and known[1] == data:
            manifest = known[2]
        else:
            manifest = Manifest.from_bytes(data, path)
            _last_manifest[self.url] = (path, data, manifest)
        # Callers get their own top-level object (some set fields on it to derive a version);
        # the nested containers are shared, and nothing mutates a committed version's.
        return copy.copy(manifest)

    def fetch(self, segments: Sequence[Segment]) -> list[memoryview]:
        """Read segments (range reads), several window files in parallel.

        The bytes land in one buffer allocated by the calling thread: bytes allocated by the
        pool's threads would come from their own malloc arenas, which keep freed memory."""
        buffer = memoryview(bytearray(sum(s.length for s in segments)))
        views, offset = [], 0
        for segment in segments:
            views.append(buffer[offset : offset + segment.length])
            offset += segment.length

        def one(segment: Segment, view: memoryview) -> memoryview:
            path = self.data_path(segment.file)
            try:
                filled = self._read_range(path, segment.offset, view)
            except FileNotFoundError as exc:
                raise StoreCorruptError(
                    path, "window file referenced by the index is missing"
                ) from exc
            return view[:filled]  # a short read: the segment's length check reports it

        if len(segments) <= 1:
            return [one(s, v) for s, v in zip(segments, views, strict=True)]
        return list(_pool().map(one, segments, views))

    def _read_range(self, path: str, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``path`` at ``offset``; returns the bytes read (fewer at the end
        of a short file). A local file is read straight into the view; other filesystems take
        one ranged request (their buffered files read ahead by megabytes)."""
        if not isinstance(self.fs, LocalFileSystem):
            data = self.fs.cat_file(path, start=offset, end=offset + len(view))
            view[: len(data)] = data
            return len(data)
        filled = 0
        with self.fs.open(path, "rb") as handle:
            handle.seek(offset)
            while filled < len(view):
                got = handle.readinto(view[filled:])
                if not got:
                    break
                filled += got
        return filled

    # -- creating and checking -------------------------------------------------------------

    def open(self, settings: Settings) -> Manifest:
        """The latest manifest, creating the store on first use; settings must match."""
        manifest = self.read()
        if manifest is None:
            manifest = Manifest(0, uuid.uuid4().hex, settings.identity(), now_ms())
            try:
                self.commit(manifest)
            except StoreConflictError:
                manifest = self.read()
                if manifest is None:
                    raise
        check_settings(manifest.settings, settings.identity(), self.url)
        return manifest

    # -- writing ---------------------------------------------------------------------------

    def write_window_file(self, name: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        """Write a window file, whole or as chunks in order (no joined copy of large folds)."""
        self.fs.makedirs(self.path(DATA_DIR), exist_ok=True)
        with self.fs.open(self.data_path(name), "wb") as handle:
            for chunk in [data] if isinstance(data, bytes | bytearray | memoryview) else data:
                handle.write(chunk)

    def commit(self, manifest: Manifest) -> None:
        """Make ``manifest`` the visible version: written aside, then renamed into place."""
        final = self.manifest_path(manifest.version)
        self.fs.makedirs(self.path(LOG_DIR), exist_ok=True)
        if self.fs.exists(final):
            raise StoreConflictError(
                f"store {self.url} already has version {manifest.version}: "
                "another writer committed first"
            )
        staged = self.path(LOG_DIR, f".{manifest.version:012d}-{uuid.uuid4().hex}.tmp")
        data = manifest.to_bytes()
        self.fs.pipe_file(staged, data)
        try:
            self.fs.mv(staged, final)
        except OSError:
            self._remove_quietly([staged])
            raise
        _last_manifest[self.url] = (final, data, copy.copy(manifest))

    def is_published(self, version: int) -> bool:
        return bool(self.fs.exists(self.path(LOG_DIR, f"{version:012d}{PUBLISHED_SUFFIX}")))

    def mark_published(self, version: int) -> None:
        self.fs.pipe_file(self.path(LOG_DIR, f"{version:012d}{PUBLISHED_SUFFIX}"), b"")

    def collect_garbage(self, manifest: Manifest) -> list[str]:
        """Delete tombstoned window files past their grace, old manifests and stray temp files."""
        due = [
            name
            for name, dropped in manifest.tombstones
            if dropped + TOMBSTONE_GRACE_VERSIONS <= manifest.version
        ]
        self._remove_quietly([self.data_path(name) for name in due])
        versions = self.versions()
        old = [v for v in versions if v <= manifest.version - KEEP_MANIFESTS]
        stale = []
        for version in old:
            stale.append(self.manifest_path(version))
            stale.append(self.path(LOG_DIR, f"{version:012d}{PUBLISHED_SUFFIX}"))
        self._remove_quietly(stale)
        return due

    def remove_orphans(self, manifest: Manifest, keep: set[str]) -> int:
        """Delete window files of earlier windows that no version references (failed attempts)."""
        try:
            names = [
                n.rstrip("/").rsplit("/", 1)[-1]
                for n in self.fs.ls(self.path(DATA_DIR), detail=False)
            ]
        except FileNotFoundError:
            return 0
        referenced = set(manifest.files) | {name for name, _ in manifest.tombstones} | keep
        orphans = [n for n in names if n not in referenced and _window_of(n) <= manifest.version]
        self._remove_quietly([self.data_path(n) for n in orphans])
        self._remove_quietly(self._dead_staged_manifests(manifest.version))
        return len(orphans)

    def _dead_staged_manifests(self, version: int) -> list[str]:
        """Manifests staged for versions up to ``version`` and never renamed: a writer crashed
        between writing and renaming, or lost the version to another writer."""
        dead = []
        for base in self._log_names():
            number = base[1:13]
            staged = base.startswith(".") and base.endswith(".tmp") and number.isdigit()
            if staged and int(number) <= version:
                dead.append(self.path(LOG_DIR, base))
        return dead

    def _remove_quietly(self, paths: list[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

    def disk_usage(self) -> tuple[int, int]:
        """(number of window files, bytes) under data/."""
        try:
            infos = self.fs.ls(self.path(DATA_DIR), detail=True)
        except FileNotFoundError:
            return 0, 0
        return len(infos), sum(int(info.get("size") or 0) for info in infos)


def _window_of(name: str) -> int:
    """The window number in a window file name ``w<window>-p<partition>-<id>.keys``."""
    head = name.split("-", 1)[0]
    return int(head[1:]) if head.startswith("w") and head[1:].isdigit() else -1


def window_file_name(window: int, partition: int) -> str:
    return f"w{window:010d}-p{partition:05d}-{uuid.uuid4().hex[:12]}.keys"


def recorded_settings(recorded: dict[str, Any]) -> dict[str, Any]:
    """A store's recorded settings, with the defaults of fields added since it was created."""
    return {**_SETTING_DEFAULTS, **recorded}


def check_settings(recorded: dict[str, Any], wanted: dict[str, Any], url: str) -> None:
    """Refuse options that contradict the settings the store was created with."""
    recorded = recorded_settings(recorded)
    for name, option in _SETTING_OPTIONS.items():
        if recorded.get(name) != wanted.get(name):
            if name == "assume_same_expiry":
                value = bool_text(bool(recorded.get(name)))
                raise StoreSettingsError(
                    option,
                    bool_text(bool(wanted.get(name))),
                    f"{value}, the value the store at {url} was created with (the store keeps "
                    "its keys by time bucket with true and by key hash with false)",
                )
            if name == "key_types":
                changed = [
                    f"{key}: {old} -> {new}"
                    for key, old, new in zip(
                        wanted["keys"], recorded.get(name) or [], wanted[name], strict=False
                    )
                    if old != new
                ]
                accepted = (
                    f"the column types the store at {url} was created with "
                    f"(changed: {', '.join(changed)})"
                )
            elif name == "expiry_type":
                column = wanted.get("expiry_key")
                accepted = (
                    f"the column type the store at {url} was created with "
                    f"(changed: {column}: {recorded.get(name)} -> {wanted.get(name)})"
                )
            else:
                accepted = f"{recorded.get(name)!r}, the value the store at {url} was created with"
            raise StoreSettingsError(option, wanted.get(name), accepted)
    if recorded.get("mode") is None:
        raise StoreError(f"store {url} has no recorded settings")
