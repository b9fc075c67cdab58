"""Plain Parquet ports: a folder per port, with Spark's file-sink log for Spark's readers.

Tasks stage their files under the window's ``_staging`` folder. The publication moves each to
its final name ``<port>/part-<version>-p<partition>-<n>.parquet`` (``Storage.publish``: a
rename, or a server-side copy on object stores), then writes one Spark sink-log entry per port
(``sparklog``), so ``spark.read.parquet(port)`` sees whole windows only and ``pyarrow.dataset``
never sees a staged file.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dedupsink.engine.classify import PORTS
from dedupsink.ports.base import Call, PortFormat, schema_record
from dedupsink.ports.evolution import PARQUET_WIDENING, arrow_shape, check_evolution
from dedupsink.ports.output import PortFile
from dedupsink.ports.sparklog import PortLog, is_compaction
from dedupsink.store.format import PortState
from dedupsink.store.records import LogEntry, Logged, Move, Publication
from dedupsink.store.storage import basename

if TYPE_CHECKING:
    from dedupsink.ports.repair import LogRepair
    from dedupsink.store.store import BucketStore


class ParquetPorts(PortFormat):
    """``outputFormat=parquet``: Parquet datasets with Spark's file-sink log (the default)."""

    name = "parquet"
    schema_files = True

    def check_tables(self, schema: pa.Schema) -> None:
        """Nothing to check: no table; the store's recorded schema is (``check_recorded``)."""

    def check_recorded(self, schema: pa.Schema, recorded: pa.Schema) -> None:
        """An input whose columns differ from the latest window's is refused without
        ``mergeSchema=true`` (a Spark reader not merging schemas would show one file's columns
        only); with it, the files simply carry the new columns, and types never change (Spark's
        reader merging the files' schemas refuses one column of two types)."""
        check_evolution(
            self.name,
            f"the Parquet ports under {self.options.path} (their latest window's)",
            arrow_shape(pa.ipc.read_schema(pa.py_buffer(schema_record(schema)))),
            arrow_shape(recorded),
            frozenset(),
            self.options.merge_schema,
            PARQUET_WIDENING,
        )

    def create_tables(self, schema: pa.Schema) -> None:
        """Nothing to create: a port's folder appears with its first file."""

    def has_windows(self) -> bool:
        # Every window logs an entry in every port.
        return any(PortLog(self.output, port).exists(0) for port in PORTS)

    def plan_port(
        self, port: str, state: PortState, files: list[PortFile], version: int, now_ms: int
    ) -> tuple[list[Move], LogEntry | None]:
        """Final names for the port's staged files and the port's next log entry; ``state``
        records the files logged since the last compaction, which the next one repeats."""
        moves = []
        for index, record in enumerate(files):
            partition = basename(record.path).split("-")[0]
            target = f"{port}/part-{version:010d}-{partition}-{index:03d}.parquet"
            moves.append(Move(record.path, target, record.size, record.rows))
        targets = tuple(move.target for move in moves)
        compaction = is_compaction(state.next_log)
        earlier = None if state.recent is None else tuple(state.recent)
        entry = LogEntry(
            port, state.next_log, targets, state.files, earlier if compaction else None
        )
        if compaction:
            state.recent = []
        elif state.recent is not None:
            state.recent.extend(Logged(m.target, m.size or 0, now_ms) for m in moves)
        state.files += len(moves)
        state.rows += sum(record.rows for record in files)
        state.next_log += 1
        return moves, entry

    def publish(self, publication: Publication, store_id: str, beside: Sequence[Call] = ()) -> None:
        """Each file under its final name, then the log entries with the calls ``beside``;
        safe to repeat. On an object store a request costs a round trip: the copies go
        together, then every entry together (``is_published`` asks for all of them, so an
        interrupted round is redone whole)."""
        storage, output = self.output.storage, self.output
        storage.together(
            partial(storage.publish, output.path(m.staged), output.path(m.target), m.size)
            for m in publication.moves
        )
        entries = [
            partial(PortLog(output, e.port).write, e, publication) for e in publication.entries
        ]
        storage.together([*entries, *beside])

    def publish_tables(self, publication: Publication, store_id: str) -> None:
        self.publish(publication, store_id)

    def is_published(self, publication: Publication, store_id: str) -> bool:
        """Whether every log entry is there (asked together: they are written together)."""
        logs = [partial(PortLog(self.output, e.port).exists, e.log_id) for e in publication.entries]
        return all(self.output.storage.gather(logs))

    def describe(self, port: str, store_id: str) -> dict[str, Any]:
        return {"log_entries_on_disk": len(PortLog(self.output, port).ids())}

    def repair(self, store: BucketStore, dry_run: bool = False) -> list[LogRepair]:
        from dedupsink.ports.repair import repair

        return repair(store, self.output, dry_run)
