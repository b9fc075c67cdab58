"""HDFS (and viewfs) through hdfs-native: a conditional create by a rename that refuses an
existing target."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from dedupsink.options import StorageBounds
from dedupsink.store.storage.base import Storage
from dedupsink.store.storage.paths import basename, join, parent


class HdfsStorage(Storage):
    """HDFS through hdfs-native: renames are atomic and refuse an existing target."""

    family = "hdfs"
    rm_reads_patterns = False
    protocols = ("hdfs", "viewfs")
    example_options = ("host", "port", "dfs.client.use.datanode.hostname")

    @classmethod
    def takes_option(cls, name: str, known: frozenset[str]) -> bool:
        # hdfs-native hands every other option to the client as a Hadoop setting, whose names
        # all have dots (dfs.ha.namenodes.ns); a name without one is a misspelling.
        return name in known or "." in name

    @classmethod
    def fs_options(cls, options: dict[str, Any], bounds: StorageBounds) -> dict[str, Any]:
        # hdfs-native lists without fsspec's listings cache and passes every option to the
        # client as a Hadoop setting, a string: use_listings_cache=False there, or any boolean,
        # fails the filesystem's construction ("'bool' object is not an instance of 'str'").
        return {
            name: ("true" if value else "false") if isinstance(value, bool) else value
            for name, value in options.items()
        }

    def create(self, path: str, data: bytes) -> None:
        aside = join(parent(path), f".{basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        self._call(f"PUT {aside}", self.fs.pipe_file, aside, data)
        try:
            # hdfs-native renames without overwrite by default; a rename whose reply was lost
            # finds its own file on the retry (FileExistsError), told apart by its bytes.
            self._call(f"RENAME {path}", self.fs.mv, aside, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(aside)
            raise

    def publish(self, source: str, target: str, size: int | None = None) -> None:
        self.ensure_folder(parent(target))  # a rename does not make the target's folder
        try:
            self._call(f"RENAME {target}", self.fs.mv, source, target)
        except FileNotFoundError as exc:
            self._published_already(source, target, exc)
        except FileExistsError:
            self.delete([source])  # an earlier publication made the target
