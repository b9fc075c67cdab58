"""``dedupsink history``: the store's history (``dedupsink.inspection.history``) as a table for
people; with ``--json``, ``dedupsink.inspection.history.history_json_lines`` prints it as JSON
lines, one ``history`` document a window, so a long history streams into ``jq`` or ``tail``
without being held whole.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from dedupsink.cli.display import table
from dedupsink.units import human_bytes

__all__ = ["render"]


def _or_dash(value: object) -> object:
    """A value of a column older rows lack (null), as a dash."""
    return "-" if value is None else value


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


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
        "awaiting fold",
        "wall s",
        "commit s",
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
                _or_dash(row["keys_expired_unfolded"]),
                _seconds(row["wall_seconds"]),
                _seconds(row["commit_seconds"]),
                human_bytes(row["store_bytes"]),
                row["latest_point_text"] or "-",
                row["query_id"],
            )
        )
    windows = "window" if rows.num_rows == 1 else "windows"
    return "\n".join([f"store {store_url}: {rows.num_rows} {windows}", *table(headers, lines)])
