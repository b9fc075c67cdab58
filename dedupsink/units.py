"""Quantities as text: the one table of time units, durations and sizes read, values written.

Options give durations ('24 hours'), spans (a duration or a plain number) and sizes ('64 MB');
Arrow's timestamp units, the expiry domain and the store's history count in microseconds. This
module reads that text into ``Span`` and ``Size`` values, naming the option on failure, and
writes durations, numbers and times back as text. It imports nothing of the package but its
errors, so options, engine, store and CLI all use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dedupsink.errors import DedupOptionError

# Microseconds per time unit: the one table of units, for durations in options, Arrow's
# timestamp units and the CLI's display.
MICROS_PER_UNIT = {
    "week": 604_800_000_000,
    "day": 86_400_000_000,
    "hour": 3_600_000_000,
    "minute": 60_000_000,
    "second": 1_000_000,
    "millisecond": 1_000,
    "microsecond": 1,
}
MICROS_PER_DAY = MICROS_PER_UNIT["day"]
UNIT_ALIASES = {
    "w": "week",
    "d": "day",
    "h": "hour",
    "hr": "hour",
    "m": "minute",
    "min": "minute",
    "s": "second",
    "sec": "second",
    "ms": "millisecond",
    "us": "microsecond",
}


def micros_per(unit: str) -> int | None:
    """Microseconds in one ``unit`` (a name or an abbreviation such as Arrow's 's', 'ms'), or
    None for a unit not known."""
    return MICROS_PER_UNIT.get(UNIT_ALIASES.get(unit, unit))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_NUMBER = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$")
DURATION_ACCEPTED = "a duration such as '24 hours', '90 minutes', '30 s' or '500 ms'"
_UNIT_BYTES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$")
SIZE_ACCEPTED = "a size such as '128 MB', '2 GB', '512m' or a number of bytes"


@dataclass(frozen=True)
class Span:
    """A length as the user wrote it: a duration (held in microseconds) or a plain number."""

    text: str
    amount: float
    is_duration: bool

    @property
    def micros(self) -> int:
        return round(self.amount)


def parse_duration(option: str, text: str) -> Span:
    """Parse ``'24 hours'``-style text into microseconds, naming ``option`` on failure."""
    match = _DURATION.match(text.lower())
    unit = match.group(2) if match else ""
    if micros_per(unit) is None and unit.endswith("s"):
        unit = unit[:-1]  # a plural ("hours"); "ms" and "us" are units themselves
    factor = micros_per(unit)
    if match is None or factor is None:
        raise DedupOptionError(option, text, DURATION_ACCEPTED)
    micros = float(match.group(1)) * factor
    if micros <= 0:
        raise DedupOptionError(option, text, "a positive " + DURATION_ACCEPTED)
    return Span(text, micros, is_duration=True)


def parse_span(option: str, text: str) -> Span:
    """A positive number, or a duration; which one a mode needs is checked on resolution."""
    if _NUMBER.match(text):
        value = float(text)
        if not value > 0 or value == float("inf"):
            raise DedupOptionError(option, text, "a positive number or " + DURATION_ACCEPTED)
        return Span(text, value, is_duration=False)
    try:
        return parse_duration(option, text)
    except DedupOptionError as exc:
        raise DedupOptionError(option, text, "a positive number or " + DURATION_ACCEPTED) from exc


@dataclass(frozen=True)
class Size:
    """A number of bytes as the user wrote it (binary units: '1 MB' is 2**20 bytes)."""

    text: str
    nbytes: int


def parse_size(option: str, text: str) -> Size:
    match = _SIZE.match(text.lower())
    if match is None:
        raise DedupOptionError(option, text, SIZE_ACCEPTED)
    nbytes = int(float(match.group(1)) * _UNIT_BYTES[match.group(2)])
    if nbytes <= 0:
        raise DedupOptionError(option, text, "a positive " + SIZE_ACCEPTED)
    return Size(text, nbytes)


def human_duration(micros: float) -> str:
    """``86400000000`` -> ``'24 hours'``: a duration as an option value, the largest unit that
    divides it exactly (what ``inspect`` and a refused settings change show)."""
    whole = round(micros)
    hour = MICROS_PER_UNIT["hour"]
    if 0 < whole <= 2 * MICROS_PER_DAY and whole % hour == 0:
        hours = whole // hour
        return f"{hours} hour{'s' if hours != 1 else ''}"
    for name, size in MICROS_PER_UNIT.items():
        if whole and whole % size == 0:
            amount = whole // size
            return f"{amount} {name}{'s' if amount != 1 else ''}"
    return f"{whole} microseconds"


def number_text(value: float) -> str:
    """``3.0`` -> ``'3'``, ``0.5`` -> ``'0.5'``: a number as an option value."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def utc_text(micros: float, zone: bool = True) -> str:
    """A time in microseconds since the epoch as UTC text (``2014-12-31 07:55:00 UTC``); one
    outside the years 1 to 9999 as its number, not an error."""
    try:
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(micros))
    except OverflowError:
        return f"{int(micros)} µs since 1970-01-01"
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + (" UTC" if zone else "")


def micros_since_epoch(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def utc_moment(millis: int) -> datetime:
    """Milliseconds since the epoch as an aware UTC datetime."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)


def human_bytes(count: int) -> str:
    """A byte count in decimal units: ``512 B``, ``7.0 kB``, ``1.2 GB``."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{count} B"
