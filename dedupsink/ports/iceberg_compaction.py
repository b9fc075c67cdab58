"""Compaction of Iceberg port tables: one snapshot of operation ``replace`` a port.

pyiceberg 0.12 has no rewrite API (Java's ``RewriteFiles``); its overwrite producer already
removes given data files and adds others, checking that each removed file is live in the
snapshot it starts from. ``_replace_producer`` is that producer with the operation Iceberg
defines for a rewrite that changes no data, ``replace`` (pyiceberg's summary update knows only
append, overwrite and delete: the totals are worked out as for an overwrite, under the
operation replace). The commit goes through a handle that does not retry
(``iceberg._without_retries``), so the catalog takes it only on top of the snapshot the
compaction read; a loser reads the table again (``compaction.compact_port``). Window
snapshots keep the store version in their summary and a replace snapshot records none: the
snapshot expiry runs only right after a window's snapshot, which is then the newest and kept,
so the newest window snapshot always names the publication.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dedupsink.errors import PortTableError
from dedupsink.ports.compaction import TableCompactor, TableFile, TableState
from dedupsink.ports.iceberg import IcebergPorts, _pyiceberg, _without_retries


@dataclass(frozen=True)
class _Read:
    """The table as read, and its live data files by path relative to the output root."""

    table: Any
    data_files: dict[str, Any]


class IcebergCompactor(TableCompactor):
    """Compaction of ``outputFormat=iceberg`` ports."""

    version_name = "snapshot"

    @property
    def iceberg(self) -> IcebergPorts:
        if not isinstance(self.ports, IcebergPorts):
            raise PortTableError(f"not Iceberg ports: {self.ports.name}")
        return self.ports

    def read(self, port: str) -> TableState | None:
        table = self.iceberg._table(port)
        if table is None or table.current_snapshot() is None:
            return None
        prefix = self._location(port) + "/"
        data_files = {}
        files = []
        for task in table.scan().plan_files():
            data_file = task.file
            if not data_file.file_path.startswith(prefix) or task.delete_files:
                continue  # not a file the sink wrote, or one with deletes: left as it is
            relative = f"{port}/{data_file.file_path[len(prefix) :]}"
            data_files[relative] = data_file
            files.append(
                TableFile(relative, int(data_file.file_size_in_bytes), int(data_file.record_count))
            )
        snapshot = table.current_snapshot()
        summary = snapshot.summary
        compacted = summary is not None and summary.operation.value == "replace"
        return TableState(
            int(snapshot.snapshot_id), tuple(files), _Read(table, data_files), compacted
        )

    def commit(
        self,
        port: str,
        base: TableState,
        removed: Sequence[TableFile],
        added: Sequence[TableFile],
        target_size: int,
    ) -> int | None:
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        exceptions = _pyiceberg().exceptions
        read: _Read = base.handle
        handle = _without_retries(read.table)
        transaction = handle.transaction()
        producer = _replace_producer()(transaction, handle.io)
        for gone in removed:
            producer.delete_data_file(read.data_files[gone.path])
        for new in added:
            url = self.iceberg._url(self.output.path(new.path))
            data_file = parquet_file_to_data_file(handle.io, transaction.table_metadata, url)
            producer.append_data_file(data_file)
        producer.commit()  # the snapshot's manifests and manifest list, named by nothing yet
        try:
            self._swap(port, transaction)
        except (exceptions.CommitFailedException, exceptions.CommitStateUnknownException):
            return None  # the table moved on, or the commit may have landed: read it again
        return int(producer.snapshot_id)

    def _swap(self, port: str, transaction: Any) -> None:
        """The commit point: the catalog takes the new metadata only on top of the snapshot
        read."""
        transaction.commit_transaction()

    def _location(self, port: str) -> str:
        return self.iceberg.table_location(port).rstrip("/")


@functools.cache
def _replace_producer() -> type:
    """pyiceberg's overwrite producer making a ``replace`` snapshot (see the module)."""
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class ReplaceFiles(_OverwriteFiles):  # type: ignore[misc]
        def __init__(self, transaction: Any, io: Any) -> None:
            super().__init__(operation=Operation.OVERWRITE, transaction=transaction, io=io)

        def _summary(self, snapshot_properties: Any = None) -> Summary:
            totals: Summary = super()._summary(snapshot_properties or {})
            return Summary(operation=Operation.REPLACE, **totals.additional_properties)

    return ReplaceFiles
