"""The store's history as its Arrow table: one row per committed window, oldest first
(``dedupsink.store.history.SCHEMA``), as ``spark.read.format("dedup")`` reads it."""

from __future__ import annotations

import pyarrow as pa

from dedupsink.inspection.location import Location
from dedupsink.store.history import read_history

__all__ = ["history"]


def history(location: Location, last: int | None = None) -> pa.Table:
    """The history of the located store; its last ``last`` windows when given."""
    rows = read_history(location.store())
    if last is not None and last < rows.num_rows:
        rows = rows.slice(rows.num_rows - max(last, 0))
    return rows
