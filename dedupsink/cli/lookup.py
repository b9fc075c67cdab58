"""``dedupsink lookup``: the command's arguments as a key, and the answer
(``dedupsink.inspection.lookup``) as text for people or one JSON object."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from dedupsink.errors import ConfigError
from dedupsink.inspection.jsonout import dumps
from dedupsink.inspection.lookup import LookupResult
from dedupsink.units import utc_text

__all__ = ["parse_pairs", "render", "to_json"]


def parse_pairs(items: Sequence[str]) -> dict[str, str]:
    """``COLUMN=VALUE`` arguments as a dict (a value may itself hold ``=``)."""
    pairs: dict[str, str] = {}
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name.strip():
            raise ConfigError("COLUMN=VALUE", f"{item!r} is not COLUMN=VALUE, e.g. id=42")
        pairs[name.strip()] = value
    return pairs


def to_json(result: LookupResult) -> str:
    return dumps(result.to_dict())


def render(result: LookupResult) -> str:
    """The answer for people."""
    key = ", ".join(f"{name}={value}" for name, value in result.key.items())
    lines = [f"store       {result.store} (version {result.version})", f"key         {key}"]
    if not result.remembered:
        lines.append(f"remembered  no: {result.reason}")
        lines += _verdict_lines(result)
        return "\n".join(lines)
    since = f"window {result.window}"
    if result.window_is_upper_bound:
        since += " or earlier (its file holds keys a compaction folded from older windows)"
    if result.batch_id is not None and result.committed_at is not None:
        moment = dt.datetime.fromisoformat(result.committed_at)
        when = utc_text((moment - _EPOCH) // dt.timedelta(microseconds=1))
        since += f" (query {result.query_id}, batch {result.batch_id}, committed {when})"
    if result.mode == "sequence":  # one entry a producer, rewritten by each window's fold
        lines.append(f"remembered  yes, its entry in the file of window {result.window}")
        lines.append(
            f"highest id  {result.stamp_text}: a row of this producer is unique only with a "
            "higher sequence id"
        )
        lines.append(f"forgotten   {result.forgotten_when}")
        return "\n".join(lines + _verdict_lines(result))
    lines.append(f"remembered  yes, since {since}")
    if result.stamp_text is not None:
        lines.append(f"stamp       {result.stamp_text}")
        lines.append(f"expiry      {result.expiry_point_text} now")
    lines.append(f"forgotten   {result.forgotten_when}")
    return "\n".join(lines)


def _verdict_lines(result: LookupResult) -> list[str]:
    if result.verdict is None:
        return []
    return [f"id {result.sequence_id:<8} a row with it now: {result.verdict}"]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
