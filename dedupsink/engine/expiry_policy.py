"""The expiry rule in one place: a mode's latest point, its expiry point, what is still alive.

docs/SEMANTICS.md, rule 2: the *latest point* ``L`` is the largest expiry value committed, the
*expiry point* is ``E = L - expiryPeriod``, and a row or a remembered key whose value is at or
below ``E`` is expired (a row) or forgotten (a key). The classifier, the key sets, compaction,
the store's next version and the CLI all ask this module, so the rule is written once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal, TypeVar

import numpy as np

Mode = Literal["basic", "tupleTime", "systemTime", "ordered", "categorical", "sequence"]

Values = TypeVar("Values", float, np.ndarray)


def is_expired(values: Values, expiry_point: float) -> Values:
    """Whether each value is at or below the expiry point: an expired row, a forgotten key."""
    return values <= expiry_point  # type: ignore[return-value]


def is_alive(stamps: Values, expiry_point: float) -> Values:
    """Whether each remembered stamp is above the expiry point: a key still remembered."""
    return stamps > expiry_point  # type: ignore[return-value]


@dataclass(frozen=True)
class ExpiryPolicy:
    """One mode's expiry: how its latest point advances and where its expiry point lies."""

    mode: Mode
    period: float | None = None
    expiry_type: str | None = None  # the expiry column's Arrow type, as the store records it

    def expiry_point(self, latest: float | None) -> float | None:
        """``latest - period``; for a decimal column computed in decimal and rounded to the
        float its values are compared as, so a value exactly at the point compares equal to it
        (in floats ``0.30 - 0.1`` is ``0.19999999999999998``, below the row ``0.20``)."""
        if latest is None or self.period is None:
            return None
        scale = _decimal_scale(self.expiry_type)
        if scale is None:
            return latest - self.period
        return float(round(Decimal(repr(latest)), scale) - Decimal(repr(self.period)))

    def next_latest_point(
        self,
        previous: float | None,
        window_stamps: Iterable[float],
        categories: int,
        now_us: int,
    ) -> float | None:
        """The latest point once a window is committed: the largest stamp committed so far
        (tupleTime, ordered), the newest category's ordinal (categorical), the commit's time,
        strictly increasing (systemTime), or none (basic, sequence)."""
        if self.mode in ("basic", "sequence"):
            return None
        if self.mode == "categorical":
            return categories - 1 if categories else None
        if self.mode == "systemTime":
            return now_us if previous is None else max(now_us, int(previous) + 1)
        stamps = [*window_stamps, *([] if previous is None else [previous])]
        return max(stamps) if stamps else None


@functools.cache  # one type a store: parsed once, not at every window's expiry point
def _decimal_scale(expiry_type: str | None) -> int | None:
    """The scale of a decimal column's type as recorded (``decimal128(10, 2)`` -> 2)."""
    found = _DECIMAL_TYPE.fullmatch(expiry_type or "")
    return int(found.group(1)) if found else None


_DECIMAL_TYPE = re.compile(r"decimal(?:32|64|128|256)?\(\d+, (-?\d+)\)")
