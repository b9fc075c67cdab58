"""The store's history as its Arrow table: one row per committed window, oldest first
(``dedupsink.store.history.SCHEMA``), as ``spark.read.format("dedup")`` reads it; and as the
``history`` JSON documents ``dedupsink history --json`` prints, one a window."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from dedupsink.inspection.jsonout import dumps, history_line
from dedupsink.inspection.location import Location
from dedupsink.inspection.points import PointDomain
from dedupsink.store.history import read_history

__all__ = ["history", "history_documents", "history_json_lines"]


def history(location: Location, last: int | None = None) -> pa.Table:
    """The history of the located store; its last ``last`` windows when given."""
    rows = read_history(location.store())
    if last is not None and last < rows.num_rows:
        rows = rows.slice(rows.num_rows - max(last, 0))
    return rows


def history_documents(location: Location, rows: pa.Table) -> Iterator[dict[str, Any]]:
    """``rows`` of the located store's history as ``history`` JSON documents, their points
    written in the store's domain (times ISO-8601 UTC, categories by name)."""
    manifest = location.store().read()
    domain = (
        PointDomain("basic")
        if manifest is None
        else PointDomain.of(manifest.settings, manifest.categories)
    )
    for row in rows.to_pylist():
        yield history_line(row, domain)


def history_json_lines(location: Location, rows: pa.Table) -> Iterator[str]:
    """The documents of ``history_documents``, one JSON line each (``history --json``)."""
    for document in history_documents(location, rows):
        yield dumps(document)
