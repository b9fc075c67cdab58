"""What ``dedupsink report`` draws, as typed values: the history's totals (``ReportSummary``)
and its windows as at most ``MAX_COLUMNS`` columns of consecutive windows (``Column``): rows
summed over a group, the other series as of its last window."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dedupsink.engine.classify import PORTS
from dedupsink.inspection.history import history
from dedupsink.inspection.location import Location
from dedupsink.inspection.state import holder_of, period_seconds
from dedupsink.inspection.verdict import Verdict, judge
from dedupsink.store.records import StoreSettings
from dedupsink.units import micros_since_epoch

__all__ = ["MAX_COLUMNS", "Column", "ReportData", "ReportSummary", "columns_of", "report_data"]

MAX_COLUMNS = 500  # 2 px a column on the 1,000 px plots: more would not be seen, only weigh
RECENT_WINDOWS = 100  # the windows the page lists one by one, under its charts
TOP_REASONS = 10
_TIME_MODES = ("systemTime", "tupleTime")  # whose points are times (µs since the epoch)


@dataclass(frozen=True)
class Column:
    """One x position: a window, or a group of consecutive windows (``MAX_COLUMNS``)."""

    first_version: int
    last_version: int
    committed_at: datetime  # the last window's
    counts: dict[str, int]  # rows per port, summed over the group
    keys_remembered: int
    keys_expired_unfolded: int | None  # None in rows recorded before they were counted apart
    store_bytes: int
    latest_point: float | None
    expiry_point: float | None
    latest_text: str | None
    expiry_text: str | None
    query_id: str  # the last window's
    batch_id: int  # the last window's
    task_seconds: float  # summed over the group's windows and their tasks
    keys_added: int
    keys_forgotten: int
    lag_seconds: float | None  # commit time minus the latest point (time modes), last window's
    query_starts: tuple[str, ...]  # queries whose first window of the history drawn is here
    error_reasons: dict[str, int]  # error rows by reason, summed
    store_retries: int = 0  # requests to the storage retried, summed over the group
    store_wait_seconds: float = 0.0  # seconds lost to them, summed
    # Wall time from each window's first task's start to its commit point, and of its commit,
    # summed over the group's windows; None where no window of the group recorded them.
    wall_seconds: float | None = None
    commit_seconds: float | None = None

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    @property
    def rows_per_second(self) -> float | None:
        """Rows per second of task time (None when no time was recorded)."""
        return self.rows / self.task_seconds if self.task_seconds > 0 else None

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
    keys_expired_unfolded: int | None  # expired keys awaiting a fold (None: not counted)
    store_bytes: int
    latest_text: str | None
    expiry_text: str | None
    error_reasons: tuple[tuple[str, int], ...]  # the most frequent, most first
    error_rows_without_reason: int  # in windows committed before reasons were recorded

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
    recent: tuple[Column, ...] = ()  # the last ``RECENT_WINDOWS`` windows, one a column
    verdict: Verdict | None = None  # healthy or not (None: not judged, no store read)

    @property
    def time_points(self) -> bool:
        """Whether the latest and expiry points are times."""
        return self.settings is not None and self.settings.mode in _TIME_MODES

    @property
    def windows(self) -> int:
        return 0 if self.summary is None else self.summary.windows

    @property
    def group_size(self) -> int:
        """Windows a column (the last column may hold fewer)."""
        return math.ceil(self.windows / len(self.columns)) if self.columns else 1


def report_data(
    location: Location, last: int | None = None, now: datetime | None = None
) -> ReportData:
    """What the report of the located store's history draws (its last ``last`` windows when
    given), and the verdict on it at ``now`` (by default the clock's time)."""
    now = now or datetime.now(UTC)
    rows = history(location, last)
    manifest = location.store().read()
    if manifest is None:
        return digest(rows, location.store_url, None)
    data = digest(rows, location.store_url, manifest.settings)
    verdict = judge(rows.to_pylist(), holder_of(manifest), now, period_seconds(manifest))
    return replace(data, verdict=verdict)


def digest(
    rows: pa.Table,
    store_url: str,
    settings: StoreSettings | None,
    max_columns: int = MAX_COLUMNS,
) -> ReportData:
    """The report's answer from history rows (``dedupsink.store.history.SCHEMA``)."""
    summary = _summary(rows) if rows.num_rows else None
    times = settings is not None and settings.mode in _TIME_MODES
    recent = rows.slice(max(rows.num_rows - RECENT_WINDOWS, 0))
    return ReportData(
        store_url,
        settings,
        summary,
        tuple(columns_of(rows, max_columns, times)),
        tuple(columns_of(recent, RECENT_WINDOWS, times)),
    )


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
        keys_expired_unfolded=last["keys_expired_unfolded"],
        store_bytes=last["store_bytes"],
        latest_text=last["latest_point_text"],
        expiry_text=last["expiry_point_text"],
        **_reasons(rows),
    )


def _reasons(rows: pa.Table) -> dict[str, Any]:
    totals = _summed_reasons(rows.column("error_reasons").to_pylist())
    ranked = sorted(totals.items(), key=lambda entry: (-entry[1], entry[0]))
    errors = int(pc.sum(rows.column("error")).as_py() or 0)
    return {
        "error_reasons": tuple(ranked[:TOP_REASONS]),
        "error_rows_without_reason": max(errors - sum(totals.values()), 0),
    }


def columns_of(
    rows: pa.Table, max_columns: int = MAX_COLUMNS, time_points: bool = False
) -> list[Column]:
    """The history's windows as at most ``max_columns`` columns of consecutive windows;
    ``time_points``: the points are times, so a column has a lag."""
    count = rows.num_rows
    if count == 0:
        return []
    size = math.ceil(count / max_columns)
    values = {name: rows.column(name).to_pylist() for name in _COLUMN_NAMES}
    firsts = _first_windows(values["query_id"])
    return [
        _column(values, start, min(start + size, count), firsts, time_points)
        for start in range(0, count, size)
    ]


def _first_windows(queries: list[str]) -> dict[int, str]:
    """Index of each query's first window among ``queries`` -> the query."""
    firsts: dict[int, str] = {}
    seen: set[str] = set()
    for index, query in enumerate(queries):
        if query not in seen:
            seen.add(query)
            firsts[index] = query
    return firsts


_COLUMN_NAMES = (
    "version",
    "committed_at",
    *PORTS,
    "keys_remembered",
    "keys_expired_unfolded",
    "store_bytes",
    "latest_point",
    "expiry_point",
    "latest_point_text",
    "expiry_point_text",
    "query_id",
    "batch_id",
    "task_seconds",
    "wall_seconds",
    "commit_seconds",
    "keys_added",
    "keys_forgotten",
    "error_reasons",
    "store_retries",
    "store_wait_seconds",
)


def _column(
    values: Mapping[str, list[Any]],
    start: int,
    stop: int,
    firsts: Mapping[int, str],
    time_points: bool,
) -> Column:
    end = stop - 1
    reasons = _summed_reasons(values["error_reasons"][start:stop])
    latest, committed = values["latest_point"][end], values["committed_at"][end]
    lag = None
    if time_points and latest is not None:
        lag = (micros_since_epoch(committed) - latest) / 1_000_000
    return Column(
        first_version=values["version"][start],
        last_version=values["version"][end],
        committed_at=values["committed_at"][end],
        counts={port: sum(values[port][start:stop]) for port in PORTS},
        keys_remembered=values["keys_remembered"][end],
        keys_expired_unfolded=values["keys_expired_unfolded"][end],
        store_bytes=values["store_bytes"][end],
        latest_point=values["latest_point"][end],
        expiry_point=values["expiry_point"][end],
        latest_text=values["latest_point_text"][end],
        expiry_text=values["expiry_point_text"][end],
        query_id=values["query_id"][end],
        batch_id=values["batch_id"][end],
        task_seconds=float(_total(values["task_seconds"][start:stop])),
        keys_added=int(_total(values["keys_added"][start:stop])),
        keys_forgotten=int(_total(values["keys_forgotten"][start:stop])),
        lag_seconds=lag,
        query_starts=tuple(firsts[i] for i in range(start, stop) if i in firsts),
        error_reasons=reasons,
        store_retries=int(_total(values["store_retries"][start:stop])),
        store_wait_seconds=float(_total(values["store_wait_seconds"][start:stop])),
        wall_seconds=_total_or_none(values["wall_seconds"][start:stop]),
        commit_seconds=_total_or_none(values["commit_seconds"][start:stop]),
    )


def _total(values: list[Any]) -> float:
    """A sum over the windows that recorded the value (a null counts nothing)."""
    return sum(value for value in values if value is not None)


def _total_or_none(values: list[Any]) -> float | None:
    """A sum over the windows that recorded the value; None if none did."""
    recorded = [value for value in values if value is not None]
    return float(sum(recorded)) if recorded else None


def _summed_reasons(windows: list[Any]) -> dict[str, int]:
    """Windows' error rows by reason (the history's ``error_reasons`` lists), summed."""
    totals: dict[str, int] = {}
    for entries in windows:
        for entry in entries or ():
            totals[entry["reason"]] = totals.get(entry["reason"], 0) + entry["rows"]
    return totals
