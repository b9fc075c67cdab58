"""``repair``: check every Spark sink-log entry the store can vouch for, rewrite the damaged ones.

A port's log entries are what Spark's readers list the port through; one that is torn, edited
or lost makes them fail or miss files (``pyarrow.dataset`` reads the directory and is not
affected). The store's last versions each record their window's publication, from which every
entry they planned can be written again, byte for byte; ``repair`` compares each with the entry
on disk and rewrites what differs (or only reports it, with ``dry_run``), oldest first, so a
compaction is rebuilt from repaired entries. Stop the query first: a window being published
would be reported as missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from dedupsink.ports.output import Output
from dedupsink.ports.sparklog import PortLog
from dedupsink.store.records import LogEntry, Publication
from dedupsink.store.store import BucketStore


@dataclass(frozen=True)
class LogRepair:
    """An entry found damaged or missing (and rewritten, unless a dry run)."""

    port: str
    log_id: int
    path: str


def planned_entries(store: BucketStore, output: Output) -> list[tuple[LogEntry, Publication]]:
    """Every log entry the kept versions planned, with its publication, oldest first; a
    publication whose files are not all in place yet (interrupted) is left to the query."""
    planned: dict[tuple[str, int], tuple[LogEntry, Publication]] = {}
    for version in store.versions():
        manifest = store.read(version)
        if manifest is None or manifest.publication is None:
            continue
        if not _moved(output, manifest.publication):
            continue
        for entry in manifest.publication.entries:
            planned[(entry.port, entry.log_id)] = (entry, manifest.publication)
    return [planned[key] for key in sorted(planned, key=lambda k: (k[1], k[0]))]


def _moved(output: Output, publication: Publication) -> bool:
    """Whether every file of a publication is in place under its final name."""
    return all(output.storage.exists(output.path(move.target)) for move in publication.moves)


def repair(store: BucketStore, output: Output, dry_run: bool = False) -> list[LogRepair]:
    """Rewrite the damaged or missing sink-log entries the store vouches for."""
    found = []
    for entry, publication in planned_entries(store, output):
        log = PortLog(output, entry.port)
        if log.matches(entry, publication):
            continue
        found.append(LogRepair(entry.port, entry.log_id, log.entry_path(entry.log_id)))
        if not dry_run:
            log.rewrite(entry, publication)
    return found
