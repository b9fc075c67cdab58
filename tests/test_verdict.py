"""The health verdict's rules (``dedupsink.inspection.verdict``), each on a history made to fire
it and on one that must not: the exact findings, figures and words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dedupsink.inspection.verdict import Holder, judge
from dedupsink.units import micros_since_epoch

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
DAY = 86400.0
QUERY = "5bc37e6f-7fca-48ec-b0be-959a763d2f7f"


def rows_of(count: int, **columns: Any) -> list[dict[str, Any]]:
    """``count`` windows a minute apart, 100 rows each, their event time one minute behind the
    commit; a column given as a function of the window's index overrides the default."""
    rows = []
    for index in range(count):
        committed = T0 + timedelta(minutes=index)
        row: dict[str, Any] = {
            "version": index + 1,
            "query_id": QUERY,
            "committed_at": committed,
            "unique": 98,
            "duplicate": 1,
            "expired": 0,
            "error": 1,
            "latest_point": float(micros_since_epoch(committed - timedelta(minutes=1))),
            "latest_point_text": "-",
            "store_retries": 0,
            "store_wait_seconds": 0.0,
            "state_loaded_bytes": 5_000_000,
            "state_fetched_bytes": 0,
        }
        for name, value in columns.items():
            row[name] = value(index) if callable(value) else value
        rows.append(row)
    return rows


def at_end(rows: list[dict[str, Any]], seconds: float = 30) -> datetime:
    return rows[-1]["committed_at"] + timedelta(seconds=seconds)


def test_a_steady_stream_is_healthy() -> None:
    rows = rows_of(20)
    verdict = judge(rows, Holder(QUERY, at_end(rows, 60)), at_end(rows), DAY)
    assert verdict.healthy and verdict.findings == ()
    assert verdict.headline() == "healthy: none of the 6 rules raised an alarm"
    assert verdict.to_dict() == {
        "healthy": True,
        "summary": "healthy: none of the 6 rules raised an alarm",
        "judged_at": "2026-11-29T09:19:30Z",
        "windows_judged": 20,
        "reasons": [],
    }


def test_no_commit_for_ten_usual_intervals_while_held_is_a_stall() -> None:
    rows = rows_of(20)
    late = at_end(rows, 11 * 60)
    verdict = judge(rows, Holder(QUERY, late + timedelta(minutes=1)), late, DAY)
    assert not verdict.healthy
    (finding,) = verdict.alarms
    assert finding.to_dict() == {
        "rule": "commit-stalled",
        "kind": "alarm",
        "message": f"no commit for 11.0 minutes while query {QUERY} holds the store; its "
        "commits came every 60.0 s (median), the limit is 10.0 minutes",
        "figures": {
            "last_commit_at": "2026-11-29T09:19:00Z",
            "seconds_since_last_commit": 660.0,
            "usual_interval_seconds": 60.0,
            "limit_seconds": 600.0,
        },
    }
    # Released: a stopped query is no stall.
    assert judge(rows, Holder(), late, DAY).healthy


def test_a_lag_growing_window_after_window_is_an_alarm() -> None:
    # The event time stands still while the clock runs: each window 60 s further behind.
    rows = rows_of(10, latest_point=float(micros_since_epoch(T0)))
    verdict = judge(rows, Holder(), at_end(rows), DAY)
    (finding,) = verdict.alarms
    assert finding.rule == "lag-growing"
    assert finding.message == (
        "the data falls behind: the lag grew in each of the last 5 windows, by 5.0 minutes in "
        "5.0 minutes of clock time, to 9.0 minutes"
    )
    assert finding.figures == {
        "first_window": 5,
        "last_window": 10,
        "lag_seconds_first": 240.0,
        "lag_seconds_last": 540.0,
        "clock_seconds": 300.0,
    }


def test_old_event_times_are_named_historical_data_not_an_alarm() -> None:
    """The demo's 2014 logs: years behind the clock, steadily, and no alarm for it."""
    old = datetime(2014, 12, 31, 7, 55, tzinfo=UTC)
    rows = rows_of(
        8,
        latest_point=lambda i: float(micros_since_epoch(old + timedelta(minutes=i))),
        latest_point_text="2014-12-31 07:55:00 UTC",
    )
    verdict = judge(rows, Holder(), at_end(rows), DAY)
    assert verdict.healthy
    (note,) = verdict.notes
    assert note.to_dict() == {
        "rule": "historical-data",
        "kind": "note",
        "message": "replayed or historical data: event times are 4,351.0 days behind the "
        "clock (latest point 2014-12-31 07:55:00 UTC), in each of the last 5 windows; the lag "
        "chart shows how old the data is, not a stream falling behind",
        "figures": {
            "lag_seconds": 375_930_300.0,
            "latest_point_at": "2014-12-31T08:02:00Z",
            "windows": 5,
        },
    }


def test_error_rows_rising_is_an_alarm_a_steady_share_is_not() -> None:
    rows = rows_of(20, error=lambda i: 1 if i < 15 else 8)
    (finding,) = judge(rows, Holder(), at_end(rows), DAY).alarms
    assert finding.rule == "errors-rising"
    assert finding.message == (
        "error rows rise: 7.5% of the last 5 windows' rows (40), against 1.0% in the 15 "
        "windows before"
    )
    assert finding.figures == {
        "recent_error_rows": 40,
        "recent_rows": 535,
        "recent_share": 0.0748,
        "earlier_share": 0.01,
    }
    assert judge(rows_of(20, error=8), Holder(), at_end(rows), DAY).healthy


def test_store_retries_are_an_alarm() -> None:
    rows = rows_of(
        10,
        store_retries=lambda i: 3 if i == 8 else 0,
        store_wait_seconds=lambda i: 1.25 if i == 8 else 0.0,
    )
    (finding,) = judge(rows, Holder(), at_end(rows), DAY).alarms
    assert finding.to_dict() == {
        "rule": "store-retries",
        "kind": "alarm",
        "message": "the storage made 1 of the last 5 windows retry: 3 requests, 1.2 s lost (a "
        "brownout: README, When the store stops answering)",
        "figures": {"retries": 3, "wait_seconds": 1.25, "windows": 1},
    }


def test_a_cache_that_fetches_its_state_every_window_is_an_alarm() -> None:
    rows = rows_of(6, state_fetched_bytes=5_000_000)
    (finding,) = judge(rows, Holder(), at_end(rows), DAY).alarms
    assert finding.rule == "state-rereading"
    assert finding.figures == {
        "loaded_bytes": 15_000_000,
        "fetched_bytes": 15_000_000,
        "windows": 3,
    }
    # Only the query's first window fetched (a cold start): healthy.
    cold = rows_of(6, state_fetched_bytes=lambda i: 5_000_000 if i == 0 else 0)
    assert judge(cold, Holder(), at_end(cold), DAY).healthy


def test_a_takeover_or_a_lapsed_lease_is_an_ownership_alarm() -> None:
    rows = rows_of(10)
    other = "0f1c2a0e-5b1d-4c3e-9a57-1d2f0c9e8b41"
    taken = Holder(other, at_end(rows, 60), ((QUERY, other, 8),))
    (finding,) = judge(rows, taken, at_end(rows), DAY).alarms
    assert finding.rule == "ownership"
    assert finding.message == f"query {QUERY} lost the store to query {other} at version 8"
    lapsed = Holder(QUERY, at_end(rows, 10))
    (finding,) = judge(rows, lapsed, at_end(rows, 20), DAY).alarms
    assert finding.message == (
        f"the lease of query {QUERY} lapsed at 2026-11-29T09:09:10Z without a commit: it "
        "may have died (the next query takes the store over)"
    )
    # A takeover long before the windows judged is history, not a problem now.
    old = Holder(other, at_end(rows, 60), ((QUERY, other, 2),))
    assert judge(rows, old, at_end(rows), DAY).healthy


def test_an_empty_history_is_not_judged() -> None:
    verdict = judge([], Holder(), T0, DAY)
    assert verdict.healthy and verdict.headline() == "not judged: no window committed yet"
