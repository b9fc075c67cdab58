"""A deliberately simple, row-by-row model of docs/SEMANTICS.md, to check the real thing against.

It holds every remembered key in a dict and walks rows one at a time: slow and obvious. Rows
are dicts; ``key`` returns the key tuple (None if any part is null), ``value`` the expiry
value (None if null, ``BAD`` if it cannot be interpreted). ``ReferenceSequence`` models
sequence dedup (``sequenceKey``) the same way, with each producer's highest id in a dict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

BAD = object()
UNIQUE, DUPLICATE, EXPIRED, ERROR = "unique", "duplicate", "expired", "error"


@dataclass
class ReferenceDedup:
    """mode: basic, tupleTime, ordered, categorical or systemTime; period in the value's units."""

    mode: str
    period: float | None = None
    max_jump: float | None = None
    remembered: dict[Hashable, float | None] = field(default_factory=dict)
    latest: float | None = None
    categories: list[Any] = field(default_factory=list)

    def expiry_point(self) -> float | None:
        if self.latest is None or self.period is None:
            return None
        return self.latest - self.period

    def window(
        self,
        rows: Sequence[dict[str, Any]],
        key: Callable[[dict[str, Any]], Hashable | None],
        value: Callable[[dict[str, Any]], Any] = lambda row: None,
        window_time: float | None = None,
    ) -> list[str]:
        """Classify one window's rows in order; returns the port of each row."""
        expiry_point = self.expiry_point()
        if expiry_point is not None and self.mode != "basic":
            self.remembered = {
                k: s for k, s in self.remembered.items() if s is None or s > expiry_point
            }
        seen_now: set[Hashable] = set()
        ports: list[str] = []
        window_max: float | None = None
        new_categories: list[Any] = []
        for row in rows:
            k = key(row)
            v = value(row) if self.mode in ("tupleTime", "ordered", "categorical") else None
            if k is None:
                ports.append(ERROR)
                continue
            unreadable = v is None or v is BAD or (isinstance(v, float) and not math.isfinite(v))
            if self.mode in ("tupleTime", "ordered", "categorical") and unreadable:
                ports.append(ERROR)
                continue
            stamp: float | None = None
            if self.mode == "categorical":
                if v in self.categories:
                    stamp = self.categories.index(v)
                else:
                    if v not in new_categories:
                        new_categories.append(v)
                    stamp = len(self.categories) + new_categories.index(v)
            elif self.mode in ("tupleTime", "ordered"):
                stamp = v
            elif self.mode == "systemTime":
                stamp = window_time
            is_new_category = self.mode == "categorical" and v not in self.categories
            if (
                self.max_jump is not None
                and self.latest is not None
                and stamp is not None
                and not is_new_category
                and self.mode != "systemTime"
                and stamp > self.latest + self.max_jump
            ):
                ports.append(ERROR)
                continue
            if stamp is not None and self.mode != "systemTime":
                window_max = stamp if window_max is None else max(window_max, stamp)
            if (
                expiry_point is not None
                and stamp is not None
                and not is_new_category
                and stamp <= expiry_point
            ):
                ports.append(EXPIRED)
                continue
            if k in seen_now or k in self.remembered:
                ports.append(DUPLICATE)
                continue
            seen_now.add(k)
            self.remembered[k] = stamp
            ports.append(UNIQUE)
        self.categories.extend(new_categories)
        if self.mode == "systemTime":
            window_max = window_time
        if window_max is not None and self.mode != "basic":
            self.latest = window_max if self.latest is None else max(self.latest, window_max)
        if self.mode == "categorical" and self.categories:
            self.latest = len(self.categories) - 1
        return ports


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def whole_number(value: Any) -> Any:
    """A sequence id as sequence dedup reads it: an int, None (null) or ``BAD`` (a fraction,
    NaN, an infinity, a value beyond int64), for int, float and Decimal values alike."""
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return BAD
    if isinstance(value, Decimal) and not value.is_finite():
        return BAD
    number = int(value)
    if number != value or not INT64_MIN <= number <= INT64_MAX:
        return BAD
    return number


@dataclass
class ReferenceSequence:
    """Sequence dedup (``sequenceKey``), row by row: ``highest`` holds each producer's highest
    sequence id among the unique rows of the windows classified so far.

    In a window a row is an error if its producer or its id is null or unreadable; a duplicate
    if its id is at or below its producer's highest id of the earlier windows, or if an earlier
    row of this window has the same (producer, id); unique otherwise. Only after the window do
    the producers' highest ids move: ids of one window are compared with the earlier windows'
    highest, never with each other's."""

    highest: dict[Hashable, int] = field(default_factory=dict)

    def window(
        self,
        rows: Sequence[dict[str, Any]],
        producer: Callable[[dict[str, Any]], Hashable | None],
        sequence: Callable[[dict[str, Any]], Any],
    ) -> list[str]:
        """Classify one window's rows in order; returns the port of each row. ``producer``
        gives None if any producer column is null, ``sequence`` an int, None or ``BAD``."""
        before = dict(self.highest)
        kept: set[tuple[Hashable, int]] = set()
        ports: list[str] = []
        for row in rows:
            p, s = producer(row), sequence(row)
            if p is None or s is None or s is BAD:
                ports.append(ERROR)
            elif (p in before and s <= before[p]) or (p, s) in kept:
                ports.append(DUPLICATE)
            else:
                kept.add((p, s))
                self.highest[p] = max(s, self.highest.get(p, s))
                ports.append(UNIQUE)
        return ports
