"""A latest or expiry point (or a key's stamp) as a person reads it, and as the JSON outputs
write it: ``PointDomain`` knows the expiry key's domain (times, dates, categories, numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dedupsink.store.history import point_text as history_point_text
from dedupsink.store.records import StoreSettings
from dedupsink.units import MICROS_PER_DAY, MICROS_PER_UNIT, number_text

__all__ = ["PointDomain", "iso_micros", "json_number", "point_text"]

_TIME_MODES = ("systemTime", "tupleTime")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def point_text(value: float | None, settings: StoreSettings, categories: Sequence[str]) -> str:
    """A latest or expiry point in the domain of the expiry key (timestamps made readable), as
    the history writes it, but for a category, shown with its ordinal."""
    if value is None:
        return "none yet"
    if settings.mode == "categorical" and value >= 0:
        ordinal = int(value)
        name = categories[ordinal] if ordinal < len(categories) else "?"
        return f"{ordinal} ({name!r})"
    return history_point_text(value, settings, categories) or "none yet"


def iso_micros(micros: float) -> str | None:
    """A time in microseconds since the epoch as the JSON outputs write every time: ISO-8601
    in UTC with a ``Z``, the fraction of a second only as long as needed (none, 3 or 6 digits:
    ``2014-12-31T07:55:00Z``, ``2026-11-29T00:43:39.325Z``); None outside the years 1 to 9999."""
    try:
        moment = _EPOCH + timedelta(microseconds=int(micros))
    except OverflowError:
        return None
    if moment.microsecond == 0:
        spec = "seconds"
    elif moment.microsecond % 1000 == 0:
        spec = "milliseconds"
    else:
        spec = "microseconds"
    return moment.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def json_number(value: float) -> int | float:
    """A number as the JSON writes it: whole numbers as integers (``86400``, not ``86400.0``)."""
    return int(value) if float(value).is_integer() else float(value)


@dataclass(frozen=True)
class PointDomain:
    """The domain a store's points and stamps live in: its mode, the expiry key's Arrow type
    and, in categorical mode, the categories in order."""

    mode: str
    expiry_type: str = ""
    categories: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: StoreSettings, categories: Sequence[str]) -> PointDomain:
        return cls(settings.mode, str(settings.expiry_type or ""), tuple(categories))

    @property
    def is_time(self) -> bool:
        """Whether the points are times: microseconds since the epoch."""
        return self.mode in _TIME_MODES

    def seconds(self, span: float | None) -> int | float | None:
        """A period or span of the expiry key in seconds, where its values are times (counted
        in microseconds); None in the other modes, whose periods are no durations."""
        if span is None or not self.is_time:
            return None
        return json_number(span / MICROS_PER_UNIT["second"])

    def text(self, value: float | None) -> str | None:
        """As a person reads it (``2014-12-31 07:55:00 UTC``, a category's name); None: none."""
        settings = {"mode": self.mode, "expiry_type": self.expiry_type}
        return history_point_text(value, settings, self.categories)

    def json_text(self, value: float) -> str | None:
        """As the JSON outputs write it: a time ISO-8601 UTC, a date ``YYYY-MM-DD``, a category
        its name (None: no category), a number its shortest text."""
        if self.is_time:
            is_date = self.expiry_type.startswith("date") and value % MICROS_PER_DAY == 0
            iso = iso_micros(value)
            return iso[:10] if is_date and iso is not None else iso
        if self.mode == "categorical":
            ordinal = int(value)
            return self.categories[ordinal] if 0 <= ordinal < len(self.categories) else None
        return number_text(value)

    def to_json(self, value: float | None) -> dict[str, Any] | None:
        """A point as one labelled object, ``{"value": ..., "text": ...}``; None where there is
        none (Basic Dedup, an empty store)."""
        if value is None:
            return None
        return {"value": json_number(value), "text": self.json_text(value)}
