"""fsspec's in-process memory filesystem: creates and publications under one lock."""

from __future__ import annotations

import threading

from fsspec.implementations.memory import MemoryFileSystem

from dedupsink.store.storage.base import Storage

_MEMORY_LOCK = threading.Lock()


class MemoryStorage(Storage):
    """fsspec's in-process memory filesystem (tests and tools; Spark's workers cannot see it)."""

    family = "memory"
    remote = False
    example_options = ("skip_instance_cache",)

    @classmethod
    def handles(cls, fs_class: type) -> bool:
        return issubclass(fs_class, MemoryFileSystem)

    def create(self, path: str, data: bytes) -> None:
        with _MEMORY_LOCK:
            if self.fs.exists(path):
                raise FileExistsError(path)
            self.fs.pipe_file(path, data)

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        with _MEMORY_LOCK:
            if not self.fs.exists(source):
                self._published_already(source, target, FileNotFoundError(source))
                return
            # fs.mv reads '[', '*', '?' in a name as a pattern: copy and remove this file.
            self.fs.cp_file(source, target)
            self.fs.rm_file(source)
