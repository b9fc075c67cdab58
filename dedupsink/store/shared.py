"""The machine's shared copy of a store's committed segments: sorted files, memory-mapped.

Every committed segment (one bucket's keys in one window file) is decoded, given its final
stamps and sorted once per machine, into a file of the state folder named by the segment:
``<root>/dedupsink-state/<store id>/<window file>@<offset>.keys``. A committed segment never
changes (its window file is immutable and its stamps are final once the file is committed), so
the name is its identity. Every sink process of the machine maps the same file read-only and
searches it in place: the OS page cache holds one copy, shared, whatever the number of task
slots, and gives it back under memory pressure (clean file pages are dropped, not swapped).

The folder is the user's alone: both levels are created owner-only (0o700), and the folder is
used only if each is a real folder (not a link) of this process's user that no one else can
write; otherwise one warning, and the process keeps its keys private (the root may be the
system's temporary folder, shared by every user of the machine). Copies are read-only (0o444).

A file is written aside and linked into place (a link fails if the name exists), so a reader
sees a whole file or none; two processes building the same segment both succeed and map the
winner's. A write that fails (a full disk, a file size limit) removes the aside file and keeps
that segment's keys private. Each file carries a CRC-32 of its payload, checked the first time a
process maps it and again whenever the file's inode, size, mtime or ctime changed: a damaged or
truncated file is deleted and rebuilt from the store, never read as "no keys". A file truncated
in place while a process maps it is the one damage no check can catch: the process dies of
SIGBUS at its next read of the lost pages, and a retry of its task rebuilds the copy
(docs/RELIABILITY.md). ``sweep`` deletes the files of segments the store no longer lists, and
those no process of the machine has opened for ``IDLE_SECONDS``: the folder holds about what the
machine's tasks use.

Layout of a file: a 32-byte header (``DSKEYS01``, key count, flags, CRC-32 of the payload,
padding), then ``h1[n] | h2[n] | stamps[n]`` as little-endian 64-bit words, sorted by ``h1``
(no stamps in Basic Dedup).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
import struct
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path

import numpy as np

from dedupsink.engine.keyset import KeySet
from dedupsink.runtime import RUNTIME
from dedupsink.store.format import Segment

log = logging.getLogger("dedupsink")

MAGIC = b"DSKEYS01"
_HEADER = struct.Struct("<8sQIIQ")  # magic, count, flags, crc32, padding
_HAS_STAMPS, _FLOAT_STAMPS, _SHARED_H1 = 1, 2, 4
STATE_FOLDER = "dedupsink-state"
# A file of a segment no longer listed is kept this long after its last change: a process
# reading an older version may still be building or opening it.
SWEEP_GRACE_SECONDS = 120.0
# A file no process of the machine has opened for this long is deleted too (rebuilt from the
# store if needed again): the machine's disk holds the state its tasks use, not all it ever
# touched when partitions moved between executors. Opening a file renews it, at most once a
# ``_RENEW_SECONDS``.
IDLE_SECONDS = 1800.0
_RENEW_SECONDS = 60.0

# Owner-only folders; read-only copies (written owner-only, made read-only before linking).
_FOLDER_MODE, _ASIDE_MODE, _COPY_MODE = 0o700, 0o600, 0o444

# Files this process has checked, by path: (inode, size, mtime, ctime) when checked. A file is
# never rewritten in place, so a later map of the same inode needs no second read of its bytes;
# a write in place changes the size or mtime, and ctime too (which no one can set back).
_checked_lock = threading.Lock()
_checked: dict[str, tuple[int, int, int, int]] = RUNTIME.cache(
    "store.shared_checked", dict, _checked_lock
)
_CHECKED_BOUND = 200_000


def default_root(configured: str | None = None) -> Path:
    """The state folder's parent: ``stateCacheDir`` if given, else the executor's first local
    dir (standalone, Kubernetes and YARN set one of these for the executor and its Python
    workers), else the system's temporary folder."""
    if configured:
        return Path(configured)
    for variable, separator in (
        ("SPARK_EXECUTOR_DIRS", os.pathsep),
        ("SPARK_LOCAL_DIRS", ","),
        ("LOCAL_DIRS", ","),
    ):
        dirs = [d for d in os.environ.get(variable, "").split(separator) if d]
        if dirs:
            return Path(dirs[0])
    return Path(tempfile.gettempdir())


class SharedSegments:
    """The shared copies of one store's segments on this machine."""

    def __init__(self, root: Path, store_id: str) -> None:
        self.root = root
        self.folder = root / STATE_FOLDER / store_id
        self._usable: bool | None = None

    def path(self, segment: Segment) -> str:
        return f"{self.folder}/{segment.file}@{segment.offset}.keys"

    @property
    def usable(self) -> bool:
        """Whether the folder holds this process's copies (decided once): created owner-only
        if missing, used only if it is this user's alone; otherwise one warning, and keys stay
        private (nothing in the folder is read, written or deleted)."""
        if self._usable is None:
            why = self._refusal()
            if why is not None:
                log.warning("dedup state folder %s: keys stay private", why)
            self._usable = why is None
        return self._usable

    def _refusal(self) -> str | None:
        """Why the folder cannot be used (a folder and the reason), None if it can."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"{self.root} cannot be created ({exc})"
        uid = os.geteuid()
        # The outer level first: inside a folder another user controls, nothing is created.
        for folder in (self.root / STATE_FOLDER, self.folder):
            try:
                _make_owner_only(folder)
                info = os.lstat(folder)
            except OSError as exc:
                return f"{folder} cannot be created ({exc})"
            why = _not_private(info, uid)
            if why is not None:
                return f"{folder} {why}"
        if not os.access(self.folder, os.W_OK | os.X_OK):
            return f"{self.folder} is not writable"
        return None

    def open(self, segment: Segment) -> KeySet | None:
        """The segment's keys mapped from its shared file; None if there is none yet, the
        folder is not used, or the file was damaged (then deleted, for the caller to rebuild)."""
        if not self.usable:
            return None
        path = self.path(segment)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._discard(path, str(exc))
            return None
        try:
            info = os.fstat(fd)
            check = self._needs_check(path, info)
            keys = _keys_of(_mapped(fd, info, mmap.ACCESS_READ), check)
        except (OSError, ValueError, _Damaged) as exc:
            self._discard(path, str(exc))
            return None
        finally:
            os.close(fd)
        if check:  # marked only once it passed: another thread may be opening it meanwhile
            self._mark_checked(path, info)
        if time.time() - info.st_mtime > _RENEW_SECONDS:
            with contextlib.suppress(OSError):
                os.utime(path)
        return keys

    def publish(self, segment: Segment, keys: KeySet) -> KeySet:
        """Write the segment's sorted keys as its shared file (unless a file is there already)
        and return them mapped from it; the keys as given if the folder is not used or the file
        cannot be written (a full disk: the aside file is removed, the batch goes on)."""
        if not self.usable:
            return keys
        path = self.path(segment)
        aside = f"{self.folder}/.{segment.file}@{segment.offset}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            fd = os.open(aside, os.O_RDWR | os.O_CREAT | os.O_EXCL, _ASIDE_MODE)
        except OSError as exc:
            return self._private(path, keys, exc)
        try:
            _write_all(fd, _encode(keys))
            os.fchmod(fd, _COPY_MODE)  # read-only before anyone can open it by its name
            os.link(aside, path)
            os.unlink(aside)
            info = os.fstat(fd)  # after the link and the unlink, which change the ctime
            mapped = _keys_of(_mapped(fd, info, mmap.ACCESS_READ), check=False)
        except FileExistsError:  # built first by another process: the same keys
            return self.open(segment) or keys
        except OSError as exc:
            return self._private(path, keys, exc)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(aside)
        self._mark_checked(path, info)  # written from these very keys: no read back
        return mapped

    @staticmethod
    def _private(path: str, keys: KeySet, exc: OSError) -> KeySet:
        log.warning("dedup could not write the shared copy %s (%s): keys stay private", path, exc)
        return keys

    def sweep(self, live_files: set[str], now: float | None = None) -> int:
        """Delete the shared files of window files the store no longer lists (and leftovers of
        writers that died) once older than ``SWEEP_GRACE_SECONDS``, and those not opened for
        ``IDLE_SECONDS``; the files deleted."""
        if not self.usable:
            return 0  # another user's folder, or a shared one: not ours to clean
        now = time.time() if now is None else now
        deleted = 0
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return 0
        for entry in entries:
            window_file = entry.name.rsplit("@", 1)[0]
            live = window_file in live_files and not entry.name.startswith(".")
            try:
                age = now - entry.stat().st_mtime
                if age < (IDLE_SECONDS if live else SWEEP_GRACE_SECONDS):
                    continue
                os.unlink(entry.path)  # a process mapping it keeps its pages until it unmaps
                deleted += 1
            except OSError:
                continue
        return deleted

    def _mark_checked(self, path: str, info: os.stat_result) -> None:
        with _checked_lock:
            if len(_checked) >= _CHECKED_BOUND:
                _checked.clear()
            _checked[path] = _stamp(info)

    def _needs_check(self, path: str, info: os.stat_result) -> bool:
        """Whether this process has not checked the file as it is now (a new file, or one
        changed since: another inode, size, mtime or ctime)."""
        with _checked_lock:
            return _checked.get(path) != _stamp(info)

    def _discard(self, path: str, why: str) -> None:
        log.warning("dedup shared copy %s is damaged (%s): rebuilt from the store", path, why)
        with _checked_lock:
            _checked.pop(path, None)
        with contextlib.suppress(OSError):
            os.unlink(path)


class _Damaged(Exception):
    """A shared file that does not hold what its header says (never leaves this module)."""


def _stamp(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _make_owner_only(folder: Path) -> None:
    """Create the folder owner-only if it is missing; an existing one is left as it is."""
    try:
        os.mkdir(folder, _FOLDER_MODE)
    except FileExistsError:
        return
    os.chmod(folder, _FOLDER_MODE)  # mkdir's mode passes through the umask


def _not_private(info: os.stat_result, uid: int) -> str | None:
    """Why a folder (its ``lstat``) is not this user's alone, None if it is."""
    mode = stat.S_IMODE(info.st_mode)
    seen = f"owner uid {info.st_uid}, mode {mode:#o}"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link ({seen})"
    if not stat.S_ISDIR(info.st_mode):
        return f"is not a folder ({seen})"
    if info.st_uid != uid:
        return f"belongs to another user ({seen}; this process runs as uid {uid})"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by other users ({seen})"
    return None


def _write_all(fd: int, chunks: list[bytes | memoryview]) -> None:
    written = os.writev(fd, chunks)
    for chunk in chunks:  # a short write (a signal, a huge file): the rest, piece by piece
        view = memoryview(chunk).cast("B")
        if written >= len(view):
            written -= len(view)
            continue
        view, written = view[written:], 0
        while view:
            view = view[os.write(fd, view) :]


def _mapped(fd: int, info: os.stat_result, access: int) -> mmap.mmap:
    if info.st_size < _HEADER.size:
        raise _Damaged("shorter than its header")
    return mmap.mmap(fd, info.st_size, access=access)


def _encode(keys: KeySet) -> list[bytes | memoryview]:
    lanes = [keys.h1.astype("<u8", copy=False), keys.h2.astype("<u8", copy=False)]
    flags = _SHARED_H1 if keys.shared_h1 else 0
    if keys.stamps is not None:
        flags |= _HAS_STAMPS | (_FLOAT_STAMPS if keys.stamps.dtype.kind == "f" else 0)
        lanes.append(keys.stamps.astype("<f8" if flags & _FLOAT_STAMPS else "<i8", copy=False))
    payload = [np.ascontiguousarray(lane).data.cast("B") for lane in lanes]
    crc = 0
    for part in payload:
        crc = zlib.crc32(part, crc)
    return [_HEADER.pack(MAGIC, len(keys), flags, crc, 0), *payload]


def _keys_of(mapped: mmap.mmap, check: bool) -> KeySet:
    """The keys of a mapped file, its payload checked against its CRC when ``check``."""
    magic, count, flags, crc, _ = _HEADER.unpack_from(mapped, 0)
    lanes = 3 if flags & _HAS_STAMPS else 2
    if magic != MAGIC:
        raise _Damaged("not a shared keys file")
    # Not compared with the index's count: a fold may hold a key twice, which sorting keeps once.
    if len(mapped) != _HEADER.size + 8 * lanes * count:
        raise _Damaged(f"{len(mapped)} bytes for {count} keys")
    if check:
        view = memoryview(mapped)[_HEADER.size :]
        try:
            if zlib.crc32(view) != crc:
                raise _Damaged("checksum mismatch")
        finally:
            view.release()
    words = np.frombuffer(mapped, dtype="<u8", count=lanes * count, offset=_HEADER.size)
    h1, h2 = words[:count], words[count : 2 * count]
    stamps = None
    if flags & _HAS_STAMPS:
        stamps = words[2 * count :].view("<f8" if flags & _FLOAT_STAMPS else "<i8")
    return KeySet(h1, h2, stamps, bool(flags & _SHARED_H1), mapped=True)
