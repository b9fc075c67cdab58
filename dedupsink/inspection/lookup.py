"""Whether a store's latest version remembers a key, since when, until when: ``lookup``
answers ``dedupsink lookup`` with a ``LookupResult``.

The key's values are parsed by the store's recorded key types and fingerprinted as
``WindowClassifier`` does, so they land in the same bucket, whose segments are read through
``BucketManager.read_segments``. In the time-bucket modes without the expiry value every
bucket is searched. After a compaction folded older segments into a later window's file, the
window reported is an upper bound (``window_is_upper_bound``).
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dedupsink.engine.classify import stamp_dtype
from dedupsink.engine.expiry import expiry_values
from dedupsink.engine.expiry_policy import is_alive, is_expired
from dedupsink.engine.fingerprint import Fingerprints
from dedupsink.engine.placement import bucket_of, key_fingerprints
from dedupsink.engine.settings import Settings, column
from dedupsink.errors import ConfigError
from dedupsink.inspection.jsonout import document, moment_text
from dedupsink.inspection.location import Location
from dedupsink.inspection.points import PointDomain, point_text
from dedupsink.store.cache import BucketCache, BucketManager
from dedupsink.store.format import Manifest, Segment
from dedupsink.store.history import read_history

__all__ = ["LookupResult", "lookup"]

_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]")
# A key column's value as the JSON writes it: typed by the column's recorded type (integers,
# floats, booleans, strings), times and dates as ISO-8601 text.
KeyValue = int | float | bool | str


@dataclass(frozen=True)
class LookupResult:
    """The answer for one key; ``to_dict()`` is what ``--json`` prints: the ``lookup`` JSON
    document (``jsonout``, ``schemas/lookup.schema.json``), each point and stamp as one object
    ``{"value", "text"}`` with its time in ISO-8601 UTC, where the fields here keep the value
    and the text for people apart."""

    store: str
    version: int | None  # the store's latest version, the one asked
    key: dict[str, KeyValue]  # column -> value, typed (``KeyValue``)
    remembered: bool
    fingerprint: str  # the key's 128-bit fingerprint, h1 then h2, in hex
    bucket: int | None  # None: every bucket was searched (time buckets, expiry value unknown)
    mode: str
    window: int | None = None  # the version of the window file that holds the key
    window_is_upper_bound: bool = False
    query_id: str | None = None
    batch_id: int | None = None
    committed_at: str | None = None  # ISO-8601 UTC
    # The key's stamp: of the copy that remembers it, or of a copy expired and awaiting fold.
    stamp: float | None = None
    stamp_text: str | None = None
    latest_point: float | None = None
    latest_point_text: str | None = None
    expiry_point: float | None = None
    expiry_point_text: str | None = None
    forgotten_at_latest: float | None = None  # the latest point at which it is forgotten
    forgotten_at_latest_text: str | None = None
    forgotten_when: str | None = None  # in words
    reason: str | None = None  # why it is not remembered, in words
    # Sequence dedup, when a sequence id was given: the port a row of the producer with it
    # would go to now, and why.
    sequence_id: int | None = None
    verdict: str | None = None
    # The domain of the store's points, by which the JSON writes them.
    domain: PointDomain | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        domain = self.domain or PointDomain(self.mode)
        return document(
            "lookup",
            {
                "store": self.store,
                "version": self.version,
                "key": dict(self.key),
                "remembered": self.remembered,
                "fingerprint": self.fingerprint,
                "bucket": self.bucket,
                "mode": self.mode,
                "window": self.window,
                "window_is_upper_bound": self.window_is_upper_bound,
                "query_id": self.query_id,
                "batch_id": self.batch_id,
                "committed_at": self.committed_at,
                "stamp": domain.to_json(self.stamp),
                "latest_point": domain.to_json(self.latest_point),
                "expiry_point": domain.to_json(self.expiry_point),
                "forgotten_at_latest": domain.to_json(self.forgotten_at_latest),
                "forgotten_when": self.forgotten_when,
                "reason": self.reason,
                "sequence_id": self.sequence_id,
                "verdict": self.verdict,
            },
        )


def lookup(location: Location, values: Mapping[str, Any], expiry: Any = None) -> LookupResult:
    """Whether the located store's latest version remembers the key ``values`` (column ->
    value: text parsed by the column's recorded type, or a Python value of it)."""
    store = location.store()
    manifest = store.read()
    if manifest is None:
        raise ConfigError("PATH", f"store {store.url} has no committed version yet")
    recorded = manifest.settings
    settings = recorded.engine_settings()
    values, sequence_id = _sequence_id(settings, values)
    row = _key_table(settings, values)
    keys = [column(row, name) for name in settings.keys]  # as WindowClassifier.classify
    fps = key_fingerprints(settings, keys)
    h1, h2 = int(fps.h1[0]), int(fps.h2[0])
    categories = list(manifest.categories)
    expiry_point = settings.expiry_point(manifest.latest)
    known_stamp = _expiry_of(settings, row, expiry, manifest)
    manager = store_manager(location, manifest, settings)
    bucket, found = _entries_of(manager, manifest, settings, fps, known_stamp)

    def text(value: float | None) -> str | None:
        return None if value is None else point_text(value, recorded, categories)

    base: dict[str, Any] = {
        "store": store.url,
        "version": manifest.version,
        "key": {name: _key_value(column(row, name)) for name in settings.keys},
        "fingerprint": f"{h1:016x}{h2:016x}",
        "bucket": bucket,
        "mode": settings.mode,
        "latest_point": manifest.latest,
        "latest_point_text": text(manifest.latest),
        "expiry_point": expiry_point,
        "expiry_point_text": text(expiry_point),
        "domain": PointDomain.of(recorded, categories),
    }
    alive = [
        (file, stamp)
        for file, stamp in found
        if stamp is None or expiry_point is None or is_alive(stamp, expiry_point)
    ]
    if not alive:
        awaiting = _highest_stamp(found)  # the key expired, awaiting fold: its stamp
        return LookupResult(
            remembered=False,
            stamp=awaiting,
            stamp_text=text(awaiting),
            reason=_why_not(settings, awaiting, known_stamp, expiry_point, text),
            **_verdict(sequence_id, None),
            **base,
        )
    stamp = _highest_stamp(alive)
    base.update(_verdict(sequence_id, None if stamp is None else int(stamp)))
    window = min(manifest.files[file].version for file, _ in alive)
    result: dict[str, Any] = {"window": window, "stamp": stamp, "stamp_text": text(stamp)}
    result.update(_history_of(location, manifest, window))
    result.update(_forgotten_when(settings, stamp, text))
    return LookupResult(remembered=True, **base, **result)


def _entries_of(
    manager: BucketManager,
    manifest: Manifest,
    settings: Settings,
    fps: Fingerprints,
    known_stamp: float | None,
) -> tuple[int | None, list[tuple[str, float | None]]]:
    """The key's bucket (None: every bucket was searched) and its entries there (file, stamp)."""
    h1, h2 = int(fps.h1[0]), int(fps.h2[0])
    if settings.buckets_by_time and known_stamp is None:
        # Every bucket, one at a time: at most one bucket's keys in memory.
        found = [
            hit
            for _, segments in sorted(manifest.buckets.items())
            for hit in _find(manager, list(segments), h1, h2)
        ]
        return None, found
    stamps = None if known_stamp is None else np.array([known_stamp])
    bucket = int(bucket_of(settings, fps, stamps)[0])
    return bucket, _find(manager, list(manifest.buckets.get(bucket, [])), h1, h2)


def _forgotten_when(
    settings: Settings, stamp: float | None, text: Callable[[float | None], str | None]
) -> dict[str, Any]:
    """When a remembered key will be forgotten, as the expiry rule says."""
    if settings.by_sequence:
        return {"forgotten_when": "never: sequence dedup keeps each producer's highest id for good"}
    if stamp is None or settings.period is None:
        return {"forgotten_when": "never: Basic Dedup remembers every key for good"}
    forget = stamp + settings.period
    return {
        "forgotten_at_latest": forget,
        "forgotten_at_latest_text": text(forget),
        "forgotten_when": (
            f"once the latest point reaches {text(forget)} (its stamp plus the expiry period): "
            f"the expiry point then reaches its stamp {text(stamp)}"
        ),
    }


def _sequence_id(
    settings: Settings, values: Mapping[str, Any]
) -> tuple[Mapping[str, Any], int | None]:
    """The key columns' values, and the sequence id given beside them (sequence dedup only)."""
    name = settings.sequence_key
    if name is None or name not in values:
        return values, None
    given = values[name]
    try:
        sequence_id = int(given.strip()) if isinstance(given, str) else int(given)
    except (TypeError, ValueError):
        raise ConfigError(name, f"{name}={given}: not a whole-number sequence id") from None
    return {k: v for k, v in values.items() if k != name}, sequence_id


def _verdict(sequence_id: int | None, highest: int | None) -> dict[str, Any]:
    """Where a row of the producer with ``sequence_id`` would go now (rules of sequence
    dedup; a copy inside the row's own window aside)."""
    if sequence_id is None:
        return {}
    if highest is None:
        verdict = "unique: the producer has no committed unique row yet"
    elif sequence_id <= highest:
        verdict = f"duplicate: at or below the producer's highest id {highest}"
    else:
        verdict = f"unique: above the producer's highest id {highest}"
    return {"sequence_id": sequence_id, "verdict": verdict}


def store_manager(location: Location, manifest: Manifest, settings: Settings) -> BucketManager:
    """A manager of its own (no process cache shared with a sink), for reading segments."""
    return BucketManager(location.store(), BucketCache(1), stamp_dtype(settings)).use(manifest)


def _arrow_type(name: str, recorded: str) -> pa.DataType:
    """A recorded key type this command can parse a value for; refused otherwise."""
    found = _TIMESTAMP.fullmatch(recorded)
    if found:
        return pa.timestamp(found.group(1), tz=found.group(2))
    if recorded in ("date32[day]", "date64[ms]"):
        return pa.date32() if recorded.startswith("date32") else pa.date64()
    simple = {
        "string": pa.string(),
        "large_string": pa.large_string(),
        "bool": pa.bool_(),
        "float": pa.float32(),
        "double": pa.float64(),
        **{
            f"{sign}int{bits}": getattr(pa, f"{sign}int{bits}")()
            for sign in ("", "u")
            for bits in (8, 16, 32, 64)
        },
    }
    if recorded in simple:
        return simple[recorded]
    raise ConfigError(
        name,
        f"key column {name!r} has type {recorded}, which lookup cannot parse a value for "
        "(integers, floats, booleans, strings, timestamps and dates in ISO text)",
    )


def _parse(name: str, kind: pa.DataType, value: Any) -> pa.Array:
    """One value of ``kind`` as a one-element array; text parsed, one-line errors."""
    try:
        if isinstance(value, str):
            value = _from_text(kind, value)
        return pa.array([value], type=kind)
    except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(
            name, f"{name}={value!s}: not a value of the column's type {kind} ({detail})"
        ) from None


def _from_text(kind: pa.DataType, text: str) -> Any:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return text
    if pa.types.is_integer(kind):
        return int(text.strip())
    if pa.types.is_floating(kind):
        return float(text.strip())
    if pa.types.is_boolean(kind):
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise ValueError("true or false")
        return lowered == "true"
    if pa.types.is_date(kind):
        return dt.date.fromisoformat(text.strip())
    if pa.types.is_timestamp(kind):
        moment = dt.datetime.fromisoformat(text.strip())
        zone = getattr(kind, "tz", None)
        if zone is not None and moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)  # naive text in a zoned column: UTC
        if zone is None and moment.tzinfo is not None:
            moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
        return moment
    raise ValueError(f"no text form for {kind}")  # _arrow_type refused it before


def _key_table(settings: Settings, values: Mapping[str, Any]) -> pa.Table:
    """The key as a one-row table with the store's recorded column types."""
    missing = [name for name in settings.keys if name not in values]
    unknown = [name for name in values if name not in settings.keys]
    wanted = ", ".join(settings.keys)
    strangers = "; ".join(_not_a_key(name, missing or list(settings.keys)) for name in unknown)
    if missing:
        plural = "s" if len(missing) > 1 else ""
        also = f"; {strangers}" if strangers else ""
        raise ConfigError(
            "COLUMN=VALUE",
            f"missing key column{plural} {', '.join(missing)}{also} (the store's keys: {wanted})",
        )
    if unknown:
        raise ConfigError("COLUMN=VALUE", f"{strangers} (the store's keys: {wanted})")
    arrays = [
        _parse(name, _arrow_type(name, kind), values[name])
        for name, kind in zip(settings.keys, settings.key_types, strict=True)
    ]
    return pa.Table.from_arrays(arrays, names=list(settings.keys))


def _not_a_key(name: str, candidates: Sequence[str]) -> str:
    """An unknown column named, with the key column it most likely meant."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{name} is not a key column{hint}"


def _expiry_of(settings: Settings, row: pa.Table, given: Any, manifest: Manifest) -> float | None:
    """The key's expiry value in the store's encoding, when it is known: from ``given`` or from
    a key column that is the expiry key (only the time-bucket modes need it)."""
    name = settings.expiry_key
    if name is None or settings.mode not in ("tupleTime", "ordered"):
        return None
    if given is not None:
        kind = _arrow_type(f"expiry {name}", settings.expiry_type or "")
        array = _parse(f"--expiry ({name})", kind, given)
    elif name in settings.keys:
        array = column(row, name)
    else:
        return None
    values = expiry_values(array, settings, manifest.category_ordinals())
    if values.unreadable.any():
        raise ConfigError("--expiry", f"{name}: not a valid {settings.mode} expiry value")
    return float(values.values[0])


def _find(
    manager: BucketManager, segments: list[Segment], h1: int, h2: int
) -> list[tuple[str, float | None]]:
    """(window file, stamp) of every stored copy of the key in these segments."""
    if not segments:
        return []
    keys = manager.read_segments(segments)
    ends = np.cumsum([segment.count for segment in segments])
    if len(segments) > 1 and int(ends[-1]) != len(keys.h1):  # counts disagree: one at a time
        return [hit for segment in segments for hit in _find(manager, [segment], h1, h2)]
    hits = np.flatnonzero((keys.h1 == np.uint64(h1)) & (keys.h2 == np.uint64(h2)))
    owners = np.minimum(np.searchsorted(ends, hits, side="right"), len(segments) - 1)
    return [
        (
            segments[int(owner)].file,
            None if keys.stamps is None else float(keys.stamps[int(hit)]),
        )
        for hit, owner in zip(hits, owners, strict=True)
    ]


def _highest_stamp(entries: list[tuple[str, float | None]]) -> float | None:
    """The latest stamp among the key's stored copies; None: none (no copy, or no stamps)."""
    stamps = [stamp for _, stamp in entries if stamp is not None]
    return max(stamps) if stamps else None


def _why_not(
    settings: Settings,
    awaiting: float | None,
    known_stamp: float | None,
    expiry_point: float | None,
    text: Any,
) -> str:
    """Why the key is not remembered; ``awaiting``: the stamp of its copy expired and awaiting
    fold (None: no copy is stored)."""
    if awaiting is not None:
        return (
            f"expired, awaiting fold: its stamp {text(awaiting)} is at or below the expiry point "
            f"{text(expiry_point)}, so a re-send is no duplicate; the key waits in its window "
            "file until a fold or the file's expiry removes it"
        )
    if settings.mode == "basic":
        return "never seen: no committed window stored this key (Basic Dedup forgets nothing)"
    if settings.by_sequence:
        return "never seen: no committed window has a unique row of this producer"
    if expiry_point is None:
        return "never seen: no committed window stored this key (nothing has expired yet)"
    if known_stamp is not None and is_expired(known_stamp, expiry_point):
        return (
            f"expired or forgotten: its expiry value {text(known_stamp)} is at or below the "
            f"expiry point {text(expiry_point)}, so a row with it is expired and such keys are "
            "forgotten"
        )
    return (
        "never seen, or forgotten: keys whose expiry value is at or below the expiry point "
        f"{text(expiry_point)} are forgotten"
    )


def _history_of(location: Location, manifest: Manifest, window: int) -> dict[str, Any]:
    """Query, batch and commit time of the window ``window``, from the history when it has it;
    whether the window's files hold more keys than it added (a compaction folded older ones)."""
    rows = read_history(location.store())
    matching = rows.filter(pc.equal(rows.column("version"), window)).slice(0, 1).to_pylist()
    if not matching:
        return {}
    row = matching[0]
    committed: dt.datetime = row["committed_at"]
    held = sum(f.keys for f in manifest.files.values() if f.version == window)
    return {
        "query_id": row["query_id"],
        "batch_id": row["batch_id"],
        "committed_at": moment_text(committed),
        "window_is_upper_bound": held > int(row["keys_added"] or 0),
    }


def _key_value(array: pa.Array) -> KeyValue:
    """A key column's parsed value, typed as its column (``_arrow_type`` admits only those):
    a time as every time in the JSON, ISO-8601 UTC (a naive one as the store counts it, UTC);
    a date ``YYYY-MM-DD``."""
    value = array[0].as_py()
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return moment_text(aware)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"no JSON value for a key of {array.type}")  # _arrow_type refused it
