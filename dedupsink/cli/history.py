"""``dedupsink history``: the store's history (``dedupsink.inspection.history``) as a table for
people, or with ``--json`` as JSON lines, one object a window with the history's column names,
``committed_at`` as ISO-8601 UTC (``...Z``), so a long history streams into ``jq`` or ``tail``
without being held whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pyarrow as pa

from dedupsink.cli.display import table
from dedupsink.units import human_bytes, iso_utc

__all__ = ["json_lines", "render"]


def json_lines(rows: pa.Table) -> Iterator[str]:
    for row in rows.to_pylist():
        yield json.dumps({name: _json_value(value) for name, value in row.items()})


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso_utc(value)
    return value


def render(rows: pa.Table, store_url: str) -> str:
    """The history for people: one line a window, oldest first."""
    if rows.num_rows == 0:
        return f"store {store_url}: no window committed yet"
    headers = (
        "version",
        "committed (UTC)",
        "batch",
        "unique",
        "duplicate",
        "expired",
        "error",
        "keys +",
        "keys -",
        "remembered",
        "store",
        "latest point",
        "query",
    )
    lines = []
    for row in rows.to_pylist():
        committed: datetime = row["committed_at"]
        lines.append(
            (
                row["version"],
                committed.strftime("%Y-%m-%d %H:%M:%S"),
                row["batch_id"],
                row["unique"],
                row["duplicate"],
                row["expired"],
                row["error"],
                row["keys_added"],
                row["keys_forgotten"],
                row["keys_remembered"],
                human_bytes(row["store_bytes"]),
                row["latest_point_text"] or "-",
                row["query_id"],
            )
        )
    windows = "window" if rows.num_rows == 1 else "windows"
    return "\n".join([f"store {store_url}: {rows.num_rows} {windows}", *table(headers, lines)])
