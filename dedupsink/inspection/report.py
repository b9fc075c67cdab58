"""What ``dedupsink report`` draws, as typed values: the history's totals (``ReportSummary``)
and its windows as at most ``MAX_COLUMNS`` columns of consecutive windows (``Column``): rows
summed over a group, the other series as of its last window."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dedupsink.engine.classify import PORTS
from dedupsink.inspection.history import history
from dedupsink.inspection.location import Location
from dedupsink.store.records import StoreSettings

__all__ = ["MAX_COLUMNS", "Column", "ReportData", "ReportSummary", "columns_of", "report_data"]

MAX_COLUMNS = 500  # 2 px a column on the 1,000 px plots: more would not be seen, only weigh


@dataclass(frozen=True)
class Column:
    """One x position: a window, or a group of consecutive windows (``MAX_COLUMNS``)."""

    first_version: int
    last_version: int
    committed_at: datetime  # the last window's
    counts: dict[str, int]  # rows per port, summed over the group
    keys_remembered: int
    store_bytes: int
    latest_point: float | None
    expiry_point: float | None
    latest_text: str | None
    expiry_text: str | None

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    def share(self, port: str) -> float | None:
        """The port's percent of the column's rows; None for a column without rows."""
        return 100.0 * self.counts[port] / self.rows if self.rows else None

    @property
    def label(self) -> str:
        if self.first_version == self.last_version:
            return f"window {self.last_version}"
        return f"windows {self.first_version}-{self.last_version}"


@dataclass(frozen=True)
class ReportSummary:
    """The history's totals over every window, and its last window's state."""

    windows: int
    first_version: int
    last_version: int
    queries: int
    first_commit: datetime
    last_commit: datetime
    totals: dict[str, int]  # rows per port
    keys_remembered: int
    store_bytes: int
    latest_text: str | None
    expiry_text: str | None

    @property
    def rows(self) -> int:
        return sum(self.totals.values())


@dataclass(frozen=True)
class ReportData:
    """A report's answer: the store, its settings (None: nothing committed), the totals (None:
    an empty history) and the columns the charts draw."""

    store_url: str
    settings: StoreSettings | None
    summary: ReportSummary | None
    columns: tuple[Column, ...]

    @property
    def windows(self) -> int:
        return 0 if self.summary is None else self.summary.windows

    @property
    def group_size(self) -> int:
        """Windows a column (the last column may hold fewer)."""
        return math.ceil(self.windows / len(self.columns)) if self.columns else 1


def report_data(location: Location, last: int | None = None) -> ReportData:
    """What the report of the located store's history draws (its last ``last`` windows when
    given)."""
    rows = history(location, last)
    manifest = location.store().read()
    return digest(rows, location.store_url, None if manifest is None else manifest.settings)


def digest(
    rows: pa.Table,
    store_url: str,
    settings: StoreSettings | None,
    max_columns: int = MAX_COLUMNS,
) -> ReportData:
    """The report's answer from history rows (``dedupsink.store.history.SCHEMA``)."""
    summary = _summary(rows) if rows.num_rows else None
    return ReportData(store_url, settings, summary, tuple(columns_of(rows, max_columns)))


def _summary(rows: pa.Table) -> ReportSummary:
    first, last = (rows.slice(index, 1).to_pylist()[0] for index in (0, rows.num_rows - 1))
    return ReportSummary(
        windows=rows.num_rows,
        first_version=first["version"],
        last_version=last["version"],
        queries=pc.count_distinct(rows.column("query_id")).as_py(),
        first_commit=first["committed_at"],
        last_commit=last["committed_at"],
        totals={port: int(pc.sum(rows.column(port)).as_py() or 0) for port in PORTS},
        keys_remembered=last["keys_remembered"],
        store_bytes=last["store_bytes"],
        latest_text=last["latest_point_text"],
        expiry_text=last["expiry_point_text"],
    )


def columns_of(rows: pa.Table, max_columns: int = MAX_COLUMNS) -> list[Column]:
    """The history's windows as at most ``max_columns`` columns of consecutive windows."""
    count = rows.num_rows
    if count == 0:
        return []
    size = math.ceil(count / max_columns)
    values = {name: rows.column(name).to_pylist() for name in _COLUMN_NAMES}
    return [_column(values, start, min(start + size, count)) for start in range(0, count, size)]


_COLUMN_NAMES = (
    "version",
    "committed_at",
    *PORTS,
    "keys_remembered",
    "store_bytes",
    "latest_point",
    "expiry_point",
    "latest_point_text",
    "expiry_point_text",
)


def _column(values: Mapping[str, list[Any]], start: int, stop: int) -> Column:
    end = stop - 1
    return Column(
        first_version=values["version"][start],
        last_version=values["version"][end],
        committed_at=values["committed_at"][end],
        counts={port: sum(values[port][start:stop]) for port in PORTS},
        keys_remembered=values["keys_remembered"][end],
        store_bytes=values["store_bytes"][end],
        latest_point=values["latest_point"][end],
        expiry_point=values["expiry_point"][end],
        latest_text=values["latest_point_text"][end],
        expiry_text=values["expiry_point_text"][end],
    )
