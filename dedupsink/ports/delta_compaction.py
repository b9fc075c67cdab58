"""Compaction of Delta port tables: one OPTIMIZE commit a port, written as the sink writes its
own commits.

The commit is the table's next log entry ``_delta_log/<base + 1>.json``, created only if absent
through the storage's conditional create (the one the sink's own-commit path uses): ``remove``
actions for the files rewritten and ``add`` actions for their replacements, all with
``dataChange=false``, and a ``commitInfo`` of operation ``OPTIMIZE``, as Delta's OPTIMIZE writes
them. Readers (and a streaming reader of the table) see no new data. A window published at the
same time takes the next free version whichever way it commits: the sink's conditional create
of the entry after its own last commit fails when a compaction took that version, and it reads
the table instead; delta-rs's commit reads the table on a conflict. This process's own-commit
record moves to the compaction's version when it followed this process's last window commit,
so the next window keeps its one-request commit. A checkpoint is written at the same versions
as after a window's commit.

delta-rs's own ``optimize.compact`` reads and rebases over the sink's commits correctly; it is
not used because it writes past fsspec, where a kill at each step of it cannot be tested (nor
its commit be the same conditional create), and it names and encodes files its own way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import pyarrow as pa

from dedupsink.errors import PortTableError
from dedupsink.ports.compaction import TableCompactor, TableFile, TableState
from dedupsink.ports.delta import (
    CHECKPOINT_INTERVAL,
    ENGINE_INFO,
    DeltaPorts,
    _deltalake,
    _own_commits,
)
from dedupsink.store.records import now_ms


class DeltaCompactor(TableCompactor):
    """Compaction of ``outputFormat=delta`` ports."""

    @property
    def delta(self) -> DeltaPorts:
        if not isinstance(self.ports, DeltaPorts):
            raise PortTableError(f"not Delta ports: {self.ports.name}")
        return self.ports

    def read(self, port: str) -> TableState | None:
        deltalake = _deltalake()
        table = self.delta._table(deltalake, port)
        if table is None:
            return None
        try:
            actions = pa.table(table.get_add_actions(flatten=True))
            latest = table.history(1)
        except deltalake.exceptions.DeltaError as exc:
            raise PortTableError(f"cannot read the Delta table {self._uri(port)}: {exc}") from exc
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        rows = (
            actions.column("num_records").to_pylist()
            if "num_records" in actions.schema.names
            else [None] * len(paths)
        )
        files = tuple(
            TableFile(f"{port}/{path}", int(size), None if count is None else int(count))
            for path, size, count in zip(paths, sizes, rows, strict=True)
        )
        compacted = bool(latest) and latest[0].get("operation") == "OPTIMIZE"
        return TableState(int(table.version()), files, table, compacted)

    def commit(
        self,
        port: str,
        base: TableState,
        removed: Sequence[TableFile],
        added: Sequence[TableFile],
        target_size: int,
    ) -> int | None:
        version = base.version + 1
        entry = optimize_entry(port, base.version, removed, added, target_size, now_ms())
        path = self.output.path(f"{port}/_delta_log/{version:020d}.json")
        try:
            self.output.storage.create(path, entry)
        except FileExistsError:
            return None
        uri = self._uri(port)
        own = _own_commits.get(uri)
        if own is not None and own.table_version == base.version:
            # This process made the version compacted: it also made the one after it.
            _own_commits[uri] = replace(own, table_version=version)
        if (version + 1) % CHECKPOINT_INTERVAL == 0:  # where a window's own commit writes one
            self.delta._checkpoint(port)
        return version

    def _uri(self, port: str) -> str:
        return self.delta.table_uri(port)


def optimize_entry(
    port: str,
    read_version: int,
    removed: Sequence[TableFile],
    added: Sequence[TableFile],
    target_size: int,
    at: int,
) -> bytes:
    """The Delta log entry of a compaction: OPTIMIZE's actions, one JSON object a line."""
    metrics = {
        "numFilesAdded": len(added),
        "numFilesRemoved": len(removed),
        "numAddedBytes": sum(f.size for f in added),
        "numRemovedBytes": sum(f.size for f in removed),
    }
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": at,
                "operation": "OPTIMIZE",
                "operationParameters": {"predicate": "[]", "targetSize": str(target_size)},
                "readVersion": read_version,
                "isBlindAppend": False,
                "operationMetrics": metrics,
                "engineInfo": ENGINE_INFO,
                "clientVersion": ENGINE_INFO,
            }
        }
    ]
    for gone in removed:
        remove = {
            "path": _relative(port, gone.path),
            "deletionTimestamp": at,
            "dataChange": False,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": gone.size,
        }
        actions.append({"remove": remove})
    for new in added:
        add = {
            "path": _relative(port, new.path),
            "partitionValues": {},
            "size": new.size,
            "modificationTime": at,
            "dataChange": False,
            "stats": new.stats or json.dumps({"numRecords": new.rows or 0}),
        }
        actions.append({"add": add})
    return "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions).encode()


def _relative(port: str, path: str) -> str:
    """A file's path in the table's log: relative to the table, URL-encoded."""
    return quote(path[len(port) + 1 :])
