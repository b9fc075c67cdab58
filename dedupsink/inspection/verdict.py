"""Is the store healthy? A verdict over its history: one function a rule, each written in the
README ("Is it healthy?"), returning what it found as labelled figures.

Pure: the history's rows (``dedupsink.store.history.SCHEMA`` as dicts, oldest first), who
holds the store and the time of judging in, a ``Verdict`` out. ``inspect`` (text and JSON) and
the top of the report show it. An *alarm* makes the store unhealthy; a *note* says something
an operator would otherwise mistake for one (replayed or historical data).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from typing import Any, Literal

from dedupsink.inspection.jsonout import moment_text
from dedupsink.inspection.points import iso_micros
from dedupsink.units import micros_since_epoch

__all__ = ["Finding", "Holder", "Verdict", "judge"]

Row = dict[str, Any]
Kind = Literal["alarm", "note"]

RECENT = 5  # the windows most rules judge: the last ones
# No commit for STALL_FACTOR times the usual interval between the query's commits (and at least
# STALL_MIN_SECONDS) while a query holds the store.
STALL_FACTOR = 10
STALL_MIN_SECONDS = 60.0
# The lag grows in each of the last RECENT windows, by at least half the clock time they took
# and at least LAG_GROWTH_MIN_SECONDS in all: the data falls behind.
LAG_GROWTH_MIN_SECONDS = 300.0
# Event times at least this far behind the clock in each recent window (and at least the expiry
# period): replayed or historical data, said as a note.
HISTORICAL_LAG_SECONDS = 86400.0
# The error share of the last RECENT windows' rows at least ERROR_RISE times that of the windows
# before (up to ERROR_BASELINE of them), at least ERROR_MIN_SHARE, at least ERROR_MIN_ROWS rows.
ERROR_RISE = 2.0
ERROR_BASELINE = 50
ERROR_MIN_SHARE = 0.01
ERROR_MIN_ROWS = 10
# The state read again from the store: in each of a query's last REREAD_WINDOWS windows (its
# first excluded, which starts cold) at least REREAD_SHARE of the bytes the lookups searched
# were fetched, and at least REREAD_MIN_BYTES were searched.
REREAD_WINDOWS = 3
REREAD_SHARE = 0.9
REREAD_MIN_BYTES = 1_000_000


@dataclass(frozen=True)
class Finding:
    """What one rule found: its id (the README's name for it), whether it is an alarm or a
    note, a sentence, and the figures that decided it."""

    rule: str
    kind: Kind
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "kind": self.kind,
            "message": self.message,
            "figures": dict(self.figures),
        }


@dataclass(frozen=True)
class Holder:
    """Who holds the store, as its latest manifest says: the owner's query and when its lease
    lapses (None: released), and the runs that lost it to another query (fenced, not by a
    release), with the version they lost it at."""

    query: str | None = None
    lease_lapses_at: datetime | None = None
    taken_over: tuple[tuple[str, str, int], ...] = ()  # (query, by query, version)


@dataclass(frozen=True)
class Verdict:
    """Healthy or not, with the findings that decide it (alarms) and those that explain what
    could look like one (notes)."""

    healthy: bool
    findings: tuple[Finding, ...]
    windows: int  # the windows of history judged
    judged_at: datetime

    @property
    def alarms(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.kind == "alarm")

    @property
    def notes(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.kind == "note")

    def headline(self) -> str:
        if not self.windows:
            return "not judged: no window committed yet"
        if self.healthy:
            return f"healthy: none of the {len(ALARM_RULES)} rules raised an alarm"
        rules = ", ".join(f.rule for f in self.alarms)
        return f"NOT healthy: {rules}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "summary": self.headline(),
            "judged_at": moment_text(self.judged_at),
            "windows_judged": self.windows,
            "reasons": [finding.to_dict() for finding in self.findings],
        }


def judge(
    rows: Sequence[Row], holder: Holder, now: datetime, period_seconds: float | None = None
) -> Verdict:
    """The verdict on a store from its history rows (oldest first), who holds it, the time of
    judging and, in the time modes, its expiry period in seconds (None: the points are no
    times)."""
    findings: list[Finding] = []
    for rule in _RULES:
        found = rule(rows, holder, now, period_seconds)
        if found is not None:
            findings.append(found)
    healthy = not any(f.kind == "alarm" for f in findings)
    return Verdict(healthy, tuple(findings), len(rows), now)


# -- the rules ------------------------------------------------------------------------------


def commit_stalled(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """A query holds the store but has not committed for much longer than its usual interval."""
    if holder.query is None or not rows:
        return None
    mine = [row["committed_at"] for row in rows if row["query_id"] == holder.query]
    intervals = [(b - a).total_seconds() for a, b in pairwise(mine[-11:])]
    if len(intervals) < 2:
        return None
    usual = statistics.median(intervals)
    since = (now - rows[-1]["committed_at"]).total_seconds()
    limit = max(STALL_FACTOR * usual, STALL_MIN_SECONDS)
    if since <= limit:
        return None
    return Finding(
        "commit-stalled",
        "alarm",
        f"no commit for {_duration(since)} while query {holder.query} holds the store; its "
        f"commits came every {_duration(usual)} (median), the limit is {_duration(limit)}",
        {
            "last_commit_at": moment_text(rows[-1]["committed_at"]),
            "seconds_since_last_commit": round(since, 3),
            "usual_interval_seconds": round(usual, 3),
            "limit_seconds": round(limit, 3),
        },
    )


def lag_growing(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """The lag (commit time minus the latest point) grows window after window, faster than
    half the clock: the data falls behind."""
    recent = _query_tail(rows, RECENT + 1)
    lags = _lags(recent, period)
    if lags is None or len(lags) < RECENT + 1:
        return None
    steps = [b - a for a, b in pairwise(lags)]
    growth = lags[-1] - lags[0]
    elapsed = (recent[-1]["committed_at"] - recent[0]["committed_at"]).total_seconds()
    if not all(step > 0 for step in steps):
        return None
    if growth < max(0.5 * elapsed, LAG_GROWTH_MIN_SECONDS):
        return None
    return Finding(
        "lag-growing",
        "alarm",
        f"the data falls behind: the lag grew in each of the last {RECENT} windows, by "
        f"{_duration(growth)} in {_duration(elapsed)} of clock time, to {_duration(lags[-1])}",
        {
            "first_window": recent[0]["version"],
            "last_window": recent[-1]["version"],
            "lag_seconds_first": round(lags[0], 3),
            "lag_seconds_last": round(lags[-1], 3),
            "clock_seconds": round(elapsed, 3),
        },
    )


def historical_data(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """Event times far behind the clock in every recent window: replayed or historical data,
    named as such (a note: the lag chart's height is no alarm by itself)."""
    recent = rows[-RECENT:]
    lags = _lags(recent, period)
    if lags is None or not lags or period is None:
        return None
    floor = max(HISTORICAL_LAG_SECONDS, period)
    if min(lags) < floor:
        return None
    latest = recent[-1]["latest_point_text"]
    return Finding(
        "historical-data",
        "note",
        f"replayed or historical data: event times are {_duration(lags[-1])} behind the clock "
        f"(latest point {latest}), in each of the last {len(recent)} windows; the lag chart "
        "shows how old the data is, not a stream falling behind",
        {
            "lag_seconds": round(lags[-1], 3),
            "latest_point_at": iso_micros(recent[-1]["latest_point"]),
            "windows": len(recent),
        },
    )


def errors_rising(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """The share of error rows in the last windows well above the share before them."""
    if len(rows) <= RECENT:
        return None
    recent, before = rows[-RECENT:], rows[-RECENT - ERROR_BASELINE : -RECENT]
    recent_errors, recent_rows = _errors(recent)
    earlier_errors, earlier_rows = _errors(before)
    if not recent_rows or recent_errors < ERROR_MIN_ROWS:
        return None
    share = recent_errors / recent_rows
    earlier = earlier_errors / earlier_rows if earlier_rows else 0.0
    if share < ERROR_MIN_SHARE or share < ERROR_RISE * earlier:
        return None
    return Finding(
        "errors-rising",
        "alarm",
        f"error rows rise: {share:.1%} of the last {len(recent)} windows' rows "
        f"({recent_errors:,}), against {earlier:.1%} in the {len(before)} windows before",
        {
            "recent_error_rows": recent_errors,
            "recent_rows": recent_rows,
            "recent_share": round(share, 4),
            "earlier_share": round(earlier, 4),
        },
    )


def store_retries(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """The storage made the last windows retry requests (throttled, reset, timed out)."""
    recent = rows[-RECENT:]
    retries = sum(row.get("store_retries") or 0 for row in recent)
    waited = sum(row.get("store_wait_seconds") or 0.0 for row in recent)
    if not retries:
        return None
    hit = sum(1 for row in recent if row.get("store_retries"))
    return Finding(
        "store-retries",
        "alarm",
        f"the storage made {hit} of the last {len(recent)} windows retry: {retries:,} "
        f"requests, {waited:.1f} s lost (a brownout: README, When the store stops answering)",
        {"retries": retries, "wait_seconds": round(waited, 3), "windows": hit},
    )


def state_rereading(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """The cache reads the state again from the store every window, instead of keeping it."""
    tail = _query_tail(rows, REREAD_WINDOWS + 1)
    judged = tail[1:] if len(tail) > REREAD_WINDOWS else []  # a query's first window is cold
    if len(judged) < REREAD_WINDOWS:
        return None
    loaded = [row.get("state_loaded_bytes") or 0 for row in judged]
    fetched = [row.get("state_fetched_bytes") or 0 for row in judged]
    every = all(
        f >= REREAD_SHARE * n and n >= REREAD_MIN_BYTES
        for n, f in zip(loaded, fetched, strict=True)
    )
    if not every:
        return None
    return Finding(
        "state-rereading",
        "alarm",
        f"the cache re-reads the state every window: the last {len(judged)} windows fetched "
        f"{sum(fetched) / 1e6:.1f} MB of the {sum(loaded) / 1e6:.1f} MB they searched from the "
        "store (maxCachedBuckets or maxCacheMemory too small for the working set?)",
        {"loaded_bytes": sum(loaded), "fetched_bytes": sum(fetched), "windows": len(judged)},
    )


def ownership(
    rows: Sequence[Row], holder: Holder, now: datetime, period: float | None
) -> Finding | None:
    """A run lost the store to another query, or the owner's lease lapsed without a commit."""
    first = rows[-RECENT]["version"] if len(rows) >= RECENT else 0
    taken = [t for t in holder.taken_over if t[2] >= first]
    lapsed = holder.lease_lapses_at is not None and holder.lease_lapses_at < now
    if not taken and not lapsed:
        return None
    parts = [f"query {query} lost the store to query {by} at version {v}" for query, by, v in taken]
    if lapsed and holder.lease_lapses_at is not None:
        parts.append(
            f"the lease of query {holder.query} lapsed at {moment_text(holder.lease_lapses_at)} "
            "without a commit: it may have died (the next query takes the store over)"
        )
    return Finding(
        "ownership",
        "alarm",
        "; ".join(parts),
        {
            "taken_over": [
                {"query": query, "by": by, "version": version} for query, by, version in taken
            ],
            "owner": holder.query,
            "lease_lapses_at": None
            if holder.lease_lapses_at is None
            else moment_text(holder.lease_lapses_at),
        },
    )


Rule = Callable[[Sequence[Row], Holder, datetime, float | None], Finding | None]
ALARM_RULES: tuple[Rule, ...] = (
    commit_stalled,
    lag_growing,
    errors_rising,
    store_retries,
    state_rereading,
    ownership,
)
_RULES: tuple[Rule, ...] = (*ALARM_RULES, historical_data)


# -- helpers --------------------------------------------------------------------------------


def _query_tail(rows: Sequence[Row], count: int) -> list[Row]:
    """The last ``count`` windows of the last query (a new query's first window starts over)."""
    if not rows:
        return []
    query = rows[-1]["query_id"]
    tail: list[Row] = []
    for row in reversed(rows):
        if row["query_id"] != query or len(tail) == count:
            break
        tail.append(row)
    return tail[::-1]


def _lags(rows: Sequence[Row], period: float | None) -> list[float] | None:
    """Commit time minus the latest point, in seconds, for rows whose points are times (None
    where they are not: ``period`` None)."""
    if period is None:
        return None
    lags = [
        (micros_since_epoch(row["committed_at"]) - row["latest_point"]) / 1e6
        for row in rows
        if row["latest_point"] is not None
    ]
    return lags if len(lags) == len(rows) else None


def _errors(rows: Sequence[Row]) -> tuple[int, int]:
    errors = sum(row["error"] for row in rows)
    total = sum(row["unique"] + row["duplicate"] + row["expired"] + row["error"] for row in rows)
    return errors, total


def _duration(seconds: float) -> str:
    """A span for people, in the unit that suits it: 4,350.9 days, 3.2 hours, 42 s."""
    sign = "-" if seconds < 0 else ""
    size = abs(seconds)
    for unit, length in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if size >= 2 * length:
            return f"{sign}{size / length:,.1f} {unit}"
    return f"{sign}{size:,.1f} s"
