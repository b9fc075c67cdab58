"""The local disk: a conditional create by hard link, positioned reads on a descriptor."""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator

from fsspec.implementations.local import LocalFileSystem

from dedupsink.errors import StoreError
from dedupsink.store.storage.base import Entry, Storage
from dedupsink.store.storage.paths import basename, join, parent


class LocalStorage(Storage):
    """The local disk (and filesystems built on fsspec's LocalFileSystem)."""

    family = "local"
    remote = False
    rm_reads_patterns = False

    @classmethod
    def handles(cls, fs_class: type) -> bool:
        return issubclass(fs_class, LocalFileSystem)

    def entries(self, folder: str) -> dict[str, Entry]:
        # One stat a file: fsspec's detailed listing builds a dozen fields for each, several
        # times the stat's cost, and the store lists its log in every task and every commit.
        found: dict[str, Entry] = {}
        try:
            listing = os.scandir(self.fs._strip_protocol(folder))
        except (FileNotFoundError, NotADirectoryError):
            return found
        with listing:
            for item in listing:
                try:
                    if item.is_dir():
                        continue
                    stat = item.stat()
                except FileNotFoundError:  # deleted since it was listed
                    continue
                found[item.name] = Entry(item.name, stat.st_size, f"{stat.st_mtime}:{stat.st_ino}")
        return found

    # Positioned reads on a file descriptor: a window's lookups and folds read dozens of
    # segments, and fsspec's file object costs more per read than the read itself.

    def read_into(self, path: str, offset: int, view: memoryview) -> int:
        with self._descriptor(path) as descriptor:
            filled = 0
            while filled < len(view):
                got = os.preadv(descriptor, [view[filled:]], offset + filled)
                if not got:
                    break
                filled += got
            return filled

    def read_range(self, path: str, start: int, end: int) -> bytes:
        with self._descriptor(path) as descriptor:
            data = os.pread(descriptor, max(end - start, 0), start)
            while len(data) < end - start:  # a short read: the rest, until the file's end
                more = os.pread(descriptor, end - start - len(data), start + len(data))
                if not more:
                    break
                data += more
            return data

    @contextlib.contextmanager
    def _descriptor(self, path: str) -> Iterator[int]:
        descriptor = os.open(self.fs._strip_protocol(path), os.O_RDONLY)
        try:
            yield descriptor
        finally:
            os.close(descriptor)

    def create(self, path: str, data: bytes) -> None:
        # A file written in place could be read half-written, or left torn by a crash; written
        # aside and synced, then hard-linked, it appears whole. link() refuses an existing name
        # (rename would silently replace it).
        aside = join(parent(path), f".{basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        self.ensure_folder(parent(path))
        with self.fs.open(aside, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            self.fs.link(aside, path)
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise StoreError(
                    f"the filesystem at {self.full_url(path)} does not support hard links, "
                    "which the store's conditional commit needs on a local disk"
                ) from exc
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(aside)

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        self.ensure_folder(parent(target))
        try:
            self.fs.mv(source, target)
        except FileNotFoundError as exc:
            self._published_already(source, target, exc)
