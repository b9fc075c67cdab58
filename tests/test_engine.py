"""The engine: ``WindowClassifier`` against the reference model, fixed cases, fingerprints.

The classifier is driven directly, window by window, over a ``CommittedIndex``: a small real
implementation of the engine's ``KeyIndex`` that keeps each committed window's new keys in a
dict of bucket -> ``KeySet`` and rebuilds the ``CommittedState`` the way the driver's commit
(``dedupsink/sink/commit.py``) does. Randomised streams in every mode are compared row by row
with ``tests/reference.py``; fixed cases pin the operator guide's examples and the error rules;
the last part checks the properties fingerprints must have whatever the Arrow layout.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from reference import ReferenceDedup
from streams import later_resends

from dedupsink.engine.classify import (
    DUPLICATE,
    ERROR,
    EXPIRED,
    PORTS,
    UNIQUE,
    BatchResult,
    CommittedState,
    WindowClassifier,
    split,
)
from dedupsink.engine.fingerprint import Fingerprints, fingerprint, first_occurrences
from dedupsink.engine.keyset import KeyFilter, KeySet
from dedupsink.engine.placement import bucket_of
from dedupsink.engine.sequence import NO_SEQUENCE, sequence_ids, with_sequence
from dedupsink.engine.settings import ERROR_COLUMN, Settings, resolve
from dedupsink.options import DedupOptions

MINUTE_US = 60_000_000
T0_US = 1_420_000_000 * 1_000_000  # early January 2015


class CommittedIndex:
    """Committed remembered keys without I/O, and the state a commit leaves behind."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.buckets: dict[int, KeySet] = {}
        self.latest: float | None = None
        self.categories: list[str] = []

    def remembered(
        self, buckets: np.ndarray, fps: Fingerprints, forget_at_or_below: float | None
    ) -> np.ndarray:
        found = np.zeros(len(fps), dtype=bool)
        for bucket in np.unique(buckets).tolist():
            keys = self.buckets.get(bucket)
            if keys is not None:
                rows = np.flatnonzero(buckets == bucket)
                found[rows] = keys.contains(fps.take(rows), forget_at_or_below)
        return found

    def state(self) -> CommittedState:
        return CommittedState(self.latest, {name: i for i, name in enumerate(self.categories)})

    def classifier(self) -> WindowClassifier:
        return WindowClassifier(self.settings, self.state(), self)

    def commit(self, classifier: WindowClassifier, window_time: int | None = None) -> None:
        """Fold one window into the index as ``commit.next_manifest`` folds it into a manifest."""
        mode = self.settings.mode
        for name in classifier.new_categories:
            if name not in self.categories:
                self.categories.append(name)
        new = classifier.new_keys()
        stamps = new.stamps
        if mode == "categorical" and stamps is not None and len(stamps):
            ordinals = {name: i for i, name in enumerate(self.categories)}
            table = np.array([ordinals[name] for name in classifier.new_categories] + [0])
            provisional = stamps < 0
            stamps = np.where(provisional, table[np.where(provisional, -1 - stamps, -1)], stamps)
        if mode == "systemTime":
            assert window_time is not None
            self.latest = window_time
            stamps = np.full(len(new.h1), window_time, dtype=np.int64)
        elif mode == "categorical":
            self.latest = len(self.categories) - 1 if self.categories else None
        elif mode in ("tupleTime", "ordered") and classifier.max_stamp is not None:
            top = classifier.max_stamp
            self.latest = top if self.latest is None else max(self.latest, top)
        for bucket in np.unique(new.buckets).tolist():
            rows = new.buckets == bucket
            part = KeySet.build(
                new.h1[rows], new.h2[rows], None if stamps is None else stamps[rows]
            )
            self.buckets[bucket] = self.buckets.get(bucket, part).merge(part)


def micros(moment: datetime) -> int:
    """Microseconds since the epoch of a naive (UTC) datetime: tupleTime's expiry value."""
    return (moment - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def settings_for(schema: pa.Schema, **raw: str) -> Settings:
    return resolve(DedupOptions.parse({"path": "/unused", **raw}), schema)


def names_of(ports: np.ndarray) -> list[str]:
    return [PORTS[port] for port in ports.tolist()]


def classify_window(
    index: CommittedIndex,
    batches: Sequence[pa.RecordBatch],
    window_time: int | None = None,
) -> tuple[list[str], list[str]]:
    """Classify one window's batches and commit it; the port names and error reasons."""
    classifier = index.classifier()
    results: list[BatchResult] = [classifier.classify(batch) for batch in batches]
    index.commit(classifier, window_time)
    ports = [name for result in results for name in names_of(result.ports)]
    reasons = [text for result in results for text in result.error_reasons.to_pylist()]
    return ports, reasons


def one_batch(schema: pa.Schema, **columns: Sequence[Any]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def sliced(batch: pa.RecordBatch, rng: random.Random) -> list[pa.RecordBatch]:
    """Cut a batch into 1-4 record batches: zero-copy slices (non-zero offsets) or copies."""
    n = batch.num_rows
    cuts = sorted(rng.sample(range(1, n), min(rng.randint(0, 3), n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    parts = [batch.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    if rng.random() < 0.5:
        parts = [pa.RecordBatch.from_pylist(p.to_pylist(), schema=batch.schema) for p in parts]
    return parts


# -- randomised streams against the reference model ---------------------------------------


@dataclass
class Stream:
    """A mode's generated stream: windows of row dicts and how the reference reads a row."""

    schema: pa.Schema
    options: dict[str, str]
    mode: str
    period: float | None
    key: Callable[[dict[str, Any]], Hashable | None]
    value: Callable[[dict[str, Any]], Any] = lambda row: None
    windows: list[list[dict[str, Any]]] = field(default_factory=list)
    times: list[int | None] = field(default_factory=list)


def key_numbers(rng: random.Random, windows: int, step: int = 10) -> list[list[int]]:
    """Key numbers per window: current keys, re-sent earlier ones and late (old) ones."""
    used: list[int] = []
    out = []
    for w in range(windows):
        picks = []
        for _ in range(rng.randint(30, 70)):
            draw = rng.random()
            if draw < 0.6 or not used:
                n = rng.randrange(w * step, w * step + 2 * step)
            elif draw < 0.85:
                n = rng.choice(used)
            else:
                n = rng.randrange(0, max(1, w * step))
            picks.append(n)
        used.extend(picks)
        out.append(picks)
    return out


def maybe(rng: random.Random, value: Any, p_null: float = 0.04) -> Any:
    return None if rng.random() < p_null else value


def make_stream(mode: str, seed: int, windows: int = 8) -> Stream:
    rng = random.Random(seed)
    numbers = key_numbers(rng, windows)
    if mode == "basic":
        schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
        stream = Stream(schema, {"keys": "id"}, "basic", None, key=lambda r: r["id"])
        for picks in numbers:
            stream.windows.append(
                [{"id": maybe(rng, n), "payload": f"p{rng.random()}"} for n in picks]
            )
    elif mode == "tupleTime":
        schema = pa.schema([("id", pa.string()), ("ts", pa.timestamp("us"))])
        options = {"keys": "id", "expiryKey": "ts", "expiryPeriod": "30 minutes"}
        stream = Stream(
            schema, options, mode, 30 * MINUTE_US, key=lambda r: r["id"], value=lambda r: r["ts"]
        )
        for picks in numbers:
            stream.windows.append(
                [
                    {"id": maybe(rng, f"key-{n}"), "ts": maybe(rng, T0_US + n * MINUTE_US)}
                    for n in picks
                ]
            )
    elif mode == "ordered-int":
        schema = pa.schema([("id", pa.int32()), ("region", pa.string()), ("seq", pa.int64())])
        options = {"keys": "id,region", "expiryKey": "seq", "expiryPeriod": "250"}
        stream = Stream(
            schema,
            options,
            "ordered",
            250,
            key=lambda r: None if None in (r["id"], r["region"]) else (r["id"], r["region"]),
            value=lambda r: r["seq"],
        )
        for picks in numbers:
            stream.windows.append(
                [
                    {"id": maybe(rng, n // 3), "region": f"r{n % 3}", "seq": maybe(rng, n * 10)}
                    for n in picks
                ]
            )
    elif mode == "ordered-float":
        schema = pa.schema([("id", pa.string()), ("x", pa.float64())])
        options = {"keys": "id", "expiryKey": "x", "expiryPeriod": "7.5", "bucketSpan": "1.25"}
        stream = Stream(
            schema, options, "ordered", 7.5, key=lambda r: r["id"], value=lambda r: r["x"]
        )
        for picks in numbers:
            rows = []
            for n in picks:
                x = n * 0.25
                if rng.random() < 0.03:
                    x = rng.choice([math.nan, math.inf, -math.inf])
                rows.append({"id": maybe(rng, f"k{n}"), "x": maybe(rng, x)})
            stream.windows.append(rows)
    elif mode == "categorical":
        schema = pa.schema([("id", pa.string()), ("batch", pa.string())])
        options = {"keys": "id", "expiryKey": "batch", "expiryPeriod": "3"}
        stream = Stream(schema, options, mode, 3, key=lambda r: r["id"], value=lambda r: r["batch"])
        for picks in numbers:
            stream.windows.append(
                [{"id": maybe(rng, f"k{n}"), "batch": maybe(rng, f"b{n // 6}")} for n in picks]
            )
    elif mode == "systemTime":
        schema = pa.schema([("id", pa.int64())])
        options = {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "10 s"}
        stream = Stream(schema, options, mode, 10_000_000, key=lambda r: r["id"])
        for picks in numbers:
            stream.windows.append([{"id": maybe(rng, n % 40)} for n in picks])
        stream.times = [T0_US + w * 4_000_000 for w in range(windows)]
    else:
        raise AssertionError(mode)
    if not stream.times:
        stream.times = [None] * windows
    return stream


STREAM_MODES = ["basic", "tupleTime", "ordered-int", "ordered-float", "categorical", "systemTime"]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode", STREAM_MODES)
def test_random_stream_matches_the_reference_row_by_row(mode: str, seed: int) -> None:
    stream = make_stream(mode, seed)
    settings = settings_for(stream.schema, **stream.options)
    assert settings.mode == stream.mode
    index = CommittedIndex(settings)
    reference = ReferenceDedup(stream.mode, stream.period)
    rng = random.Random(seed * 7919)
    seen_ports: set[str] = set()
    for number, (rows, window_time) in enumerate(zip(stream.windows, stream.times, strict=True)):
        batch = pa.RecordBatch.from_pylist(rows, schema=stream.schema)
        got, _ = classify_window(index, sliced(batch, rng), window_time)
        expected = reference.window(rows, stream.key, stream.value, window_time)
        assert got == expected, f"window {number}"
        assert index.latest == reference.latest, f"latest point after window {number}"
        seen_ports.update(got)
    # The stream really exercised the rules: duplicates and errors always, expiry where it can.
    assert {"unique", "duplicate", "error"} <= seen_ports
    if stream.mode in ("tupleTime", "ordered", "categorical"):
        assert "expired" in seen_ports


def test_random_stream_with_max_expiry_jump_matches_the_reference() -> None:
    rng = random.Random(11)
    schema = pa.schema([("id", pa.int64()), ("seq", pa.int64())])
    settings = settings_for(
        schema, keys="id", expiryKey="seq", expiryPeriod="40", maxExpiryJump="25"
    )
    index = CommittedIndex(settings)
    reference = ReferenceDedup("ordered", 40, max_jump=25)
    ports: list[str] = []
    for picks in key_numbers(rng, 8):
        rows = [{"id": n, "seq": n * 2 + (500 if n % 17 == 0 else 0)} for n in picks]
        got, _ = classify_window(index, sliced(pa.RecordBatch.from_pylist(rows, schema), rng))
        assert got == reference.window(rows, lambda r: r["id"], lambda r: r["seq"])
        ports.extend(got)
    assert ports.count("error") > 0


# -- re-sent copies that carry their own, later expiry value (assumeSameExpiry=false) ------

OWN_TIME_PERIOD = 30  # three windows of later_resends' default step


def own_time_stream(kind: str, seed: int) -> tuple[pa.Schema, dict[str, str], list[list[dict]]]:
    """``later_resends`` as ordered integers, or as minutes of tupleTime."""
    windows = later_resends(seed, 24)
    if kind == "ordered":
        schema = pa.schema([("id", pa.int64()), ("v", pa.int64())])
        period, convert = str(OWN_TIME_PERIOD), lambda v: v
    else:
        schema = pa.schema([("id", pa.int64()), ("v", pa.timestamp("us"))])
        period, convert = f"{OWN_TIME_PERIOD} minutes", lambda v: T0_US + v * MINUTE_US
    options = {"keys": "id", "expiryKey": "v", "expiryPeriod": period}
    rows = [
        [{"id": key, "v": None if value is None else convert(value)} for key, value in window]
        for window in windows
    ]
    return schema, options, rows


def run_own_time_stream(
    kind: str, seed: int, **raw: str
) -> tuple[list[str], list[str], list[int | None]]:
    """The classifier's ports over a later-resends stream, the reference's (docs/SEMANTICS.md,
    rule 5), and each row's key."""
    schema, options, windows = own_time_stream(kind, seed)
    index = CommittedIndex(settings_for(schema, **options, **raw))
    period = OWN_TIME_PERIOD * (1 if kind == "ordered" else MINUTE_US)
    reference = ReferenceDedup("ordered", period)
    rng = random.Random(seed)
    got: list[str] = []
    expected: list[str] = []
    for rows in windows:
        batch = pa.RecordBatch.from_pylist(rows, schema=schema)
        got += classify_window(index, sliced(batch, rng))[0]
        expected += reference.window(rows, lambda r: r["id"], lambda r: r["v"])
    return got, expected, [row["id"] for rows in windows for row in rows]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kind", ["ordered", "tupleTime"])
def test_later_resends_match_the_reference_with_assume_same_expiry_false(
    kind: str, seed: int
) -> None:
    got, expected, keys = run_own_time_stream(kind, seed, assumeSameExpiry="false")
    assert got == expected
    # Copies met every case of rule 5: remembered (duplicate), too late (expired), and
    # forgotten before they came (unique a second time).
    assert {"unique", "duplicate", "expired", "error"} <= set(expected)
    unique_keys = [key for key, port in zip(keys, expected, strict=True) if port == "unique"]
    assert len(unique_keys) > len(set(unique_keys))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_default_setting_counts_copies_with_later_values_as_unique(seed: int) -> None:
    """Assumption 1 does not hold on this stream: under it, a copy is looked up in the time
    bucket of its own value, misses its first copy there, and comes out unique."""
    got, expected, _ = run_own_time_stream("tupleTime", seed)
    pairs = zip(got, expected, strict=True)
    assert sum(g == "unique" and e == "duplicate" for g, e in pairs) > 10
    fixed, _, _ = run_own_time_stream("tupleTime", seed, assumeSameExpiry="false")
    assert fixed == expected


def own_time_index(**raw: str) -> tuple[pa.Schema, CommittedIndex]:
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    settings = settings_for(
        schema, keys="id", expiryKey="n", expiryPeriod="10", assumeSameExpiry="false", **raw
    )
    return schema, CommittedIndex(settings)


def test_a_copy_is_unique_once_its_first_value_reaches_the_expiry_point() -> None:
    schema, index = own_time_index()
    classify_window(index, [one_batch(schema, id=["a", "b"], n=[0, 1])])
    classify_window(index, [one_batch(schema, id=["c"], n=[10])])
    # L = 10, E = 0: a (remembered with 0) is forgotten, b (with 1) is not; a row at 0 expires.
    got, _ = classify_window(index, [one_batch(schema, id=["a", "b", "d"], n=[11, 11, 0])])
    assert got == ["unique", "duplicate", "expired"]
    # L = 11, E = 1: a is remembered again, with 11 this time; b still with 1, so forgotten.
    got, _ = classify_window(index, [one_batch(schema, id=["a", "b"], n=[20, 20])])
    assert got == ["duplicate", "unique"]


def test_a_duplicate_does_not_extend_how_long_its_key_is_remembered() -> None:
    schema, index = own_time_index()
    classify_window(index, [one_batch(schema, id=["a"], n=[0])])
    assert classify_window(index, [one_batch(schema, id=["a", "x"], n=[9, 10])])[0] == [
        "duplicate",
        "unique",
    ]
    # E = 0: a was remembered with 0, its unique row's value; the copy stamped 9 changed nothing.
    assert classify_window(index, [one_batch(schema, id=["a"], n=[15])])[0] == ["unique"]


def test_a_copy_with_an_earlier_value_above_the_expiry_point_is_a_duplicate() -> None:
    schema, index = own_time_index()
    classify_window(index, [one_batch(schema, id=["a"], n=[8])])
    classify_window(index, [one_batch(schema, id=["x"], n=[12])])
    assert classify_window(index, [one_batch(schema, id=["a"], n=[3])])[0] == ["duplicate"]


def test_keys_are_bucketed_by_hash_with_their_own_stamps() -> None:
    schema, index = own_time_index(numBuckets="4")
    classifier = index.classifier()
    classifier.classify(one_batch(schema, id=[f"k{i}" for i in range(40)], n=list(range(40))))
    new = classifier.new_keys()
    assert new.stamps is not None and new.stamps.tolist() == list(range(40))
    # The shard is Spark's hash of the key, kept in the fingerprint's high word.
    spark = (new.h1 >> np.uint64(32)).astype(np.uint32).view(np.int32).astype(np.int64)
    assert (new.buckets == np.mod(spark, 4)).all()


# -- fixed cases --------------------------------------------------------------------------


def test_operator_guide_table_only_21_expires() -> None:
    schema = pa.schema([("k", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="k", expiryKey="k", expiryPeriod="10"))
    ports = []
    for k in [10, 20, 25, 40, 21, 35, 45, 57]:
        got, _ = classify_window(index, [one_batch(schema, k=[k])])
        ports.extend(got)
    assert ports == ["unique"] * 4 + ["expired"] + ["unique"] * 3
    assert index.latest == 57


def test_seed_boundary_expires_at_exactly_one_period() -> None:
    schema = pa.schema([("id", pa.string()), ("ts", pa.timestamp("us"))])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="ts", expiryPeriod="1 day"))
    classify_window(index, [one_batch(schema, id=["a"], ts=[datetime(2014, 12, 31)])])
    got, _ = classify_window(
        index,
        [
            one_batch(
                schema, id=["b", "c"], ts=[datetime(2014, 12, 30), datetime(2014, 12, 30, 0, 11)]
            )
        ],
    )
    assert got == ["expired", "unique"]


def test_latest_point_advances_only_at_window_boundaries() -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="n", expiryPeriod="10"))
    got, _ = classify_window(index, [one_batch(schema, id=[1, 2], n=[100, 5])])
    assert got == ["unique", "unique"]  # 5 is far behind 100, but 100 is not committed yet
    got, _ = classify_window(index, [one_batch(schema, id=[3, 4], n=[90, 91])])
    assert got == ["expired", "unique"]


def test_expired_rows_do_not_change_state() -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="n", expiryPeriod="10"))
    classify_window(index, [one_batch(schema, id=[1], n=[100])])
    assert classify_window(index, [one_batch(schema, id=[2], n=[50])])[0] == ["expired"]
    assert classify_window(index, [one_batch(schema, id=[2], n=[95])])[0] == ["unique"]


def test_keys_at_or_below_the_expiry_point_are_forgotten() -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    # One bucket (span = period), so a re-sent key is looked up whatever value it carries.
    settings = settings_for(schema, keys="id", expiryKey="n", expiryPeriod="10", bucketSpan="10")
    index = CommittedIndex(settings)
    classify_window(index, [one_batch(schema, id=[1, 2], n=[10, 11])])
    classify_window(index, [one_batch(schema, id=[3], n=[20])])
    # E = 20 - 10 = 10: key 1 (stamp 10) is forgotten, key 2 (stamp 11) is remembered.
    got, _ = classify_window(index, [one_batch(schema, id=[1, 2], n=[20, 20])])
    assert got == ["unique", "duplicate"]


def test_far_future_row_with_max_expiry_jump_is_an_error_naming_the_column() -> None:
    schema = pa.schema([("id", pa.string()), ("event_time", pa.timestamp("us"))])
    settings = settings_for(
        schema, keys="id", expiryKey="event_time", expiryPeriod="1 day", maxExpiryJump="1 day"
    )
    index = CommittedIndex(settings)
    start = datetime(2015, 3, 1)
    first, _ = classify_window(index, [one_batch(schema, id=["a"], event_time=[start])])
    assert first == ["unique"]
    batch = one_batch(
        schema,
        id=["future", "soon"],
        event_time=[start + timedelta(days=30), start + timedelta(hours=12)],
    )
    classifier = index.classifier()
    result = classifier.classify(batch)
    assert names_of(result.ports) == ["error", "unique"]
    (reason,) = result.error_reasons.to_pylist()
    assert "'event_time'" in reason and "maxExpiryJump" in reason
    # The error row does not move the latest point.
    assert classifier.max_stamp == micros(start + timedelta(hours=12))
    out = split(batch, result)
    assert out["error"].column(ERROR_COLUMN).to_pylist() == [reason]
    assert out["error"].column("id").to_pylist() == ["future"]


def test_max_expiry_jump_does_not_apply_before_any_window_is_committed() -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    settings = settings_for(schema, keys="id", expiryKey="n", expiryPeriod="5", maxExpiryJump="1")
    index = CommittedIndex(settings)
    assert classify_window(index, [one_batch(schema, id=[1, 2], n=[0, 1000])])[0] == [
        "unique",
        "unique",
    ]


def test_null_key_and_null_expiry_value_are_errors_with_reasons() -> None:
    schema = pa.schema([("id", pa.string()), ("ts", pa.timestamp("us"))])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="ts", expiryPeriod="1 h"))
    batch = one_batch(schema, id=[None, "a", "b", None], ts=[1, None, 2, None])
    got, reasons = classify_window(index, [batch])
    assert got == ["error", "error", "unique", "error"]
    assert reasons == ["null key column 'id'", "null expiry value in 'ts'", "null key column 'id'"]


def test_error_rows_never_change_state() -> None:
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="n", expiryPeriod="5"))
    classify_window(index, [one_batch(schema, id=["a"], n=[None])])
    assert index.latest is None and not index.buckets
    assert classify_window(index, [one_batch(schema, id=["a"], n=[1])])[0] == ["unique"]


def test_multi_column_keys_compare_every_column() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
    index = CommittedIndex(settings_for(schema, keys="a,b"))
    first = one_batch(schema, a=[1, 1, 2, 1], b=["x", "y", "x", "x"], c=[0.0, 1.0, 2.0, 3.0])
    assert classify_window(index, [first])[0] == ["unique", "unique", "unique", "duplicate"]
    second = one_batch(schema, a=[2, 2, 1], b=["x", "z", None], c=[9.0, 9.0, 9.0])
    got, reasons = classify_window(index, [second])
    assert got == ["duplicate", "unique", "error"]
    assert reasons == ["null key column 'b'"]


def test_multi_column_key_does_not_confuse_shifted_values() -> None:
    schema = pa.schema([("a", pa.string()), ("b", pa.string())])
    index = CommittedIndex(settings_for(schema, keys="a,b"))
    batch = one_batch(schema, a=["ab", "a", "", "abc"], b=["c", "bc", "abc", ""])
    assert classify_window(index, [batch])[0] == ["unique"] * 4


CUSTOMER = pa.struct([("id", pa.int64()), ("name", pa.string())])


def test_nested_struct_field_key() -> None:
    schema = pa.schema([("customer", CUSTOMER), ("v", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="customer.id"))
    customers = [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}, None, {"id": None, "name": "c"}]
    got, reasons = classify_window(index, [one_batch(schema, customer=customers, v=[1, 2, 3, 4])])
    assert got == ["unique", "duplicate", "error", "error"]
    assert reasons == ["null key column 'customer.id'"] * 2
    later = one_batch(schema, customer=[{"id": 2, "name": "a"}, {"id": 1, "name": "z"}], v=[5, 6])
    assert classify_window(index, [later])[0] == ["unique", "duplicate"]


def test_whole_struct_key_compares_every_field() -> None:
    schema = pa.schema([("customer", CUSTOMER)])
    index = CommittedIndex(settings_for(schema, keys="customer"))
    customers = [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}, {"id": 1, "name": "a"}]
    got, _ = classify_window(index, [one_batch(schema, customer=customers)])
    assert got == ["unique", "unique", "duplicate"]


def test_default_key_is_every_column() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("when", pa.date32())])
    settings = settings_for(schema)
    assert settings.keys == ("a", "b", "when")
    index = CommittedIndex(settings)
    day = datetime(2020, 1, 1).date()
    batch = one_batch(schema, a=[1, 1, 1, 1], b=["x", "x", "y", "x"], when=[day, day, day, None])
    got, reasons = classify_window(index, [batch])
    assert got == ["unique", "duplicate", "unique", "error"]
    assert reasons == ["null key column 'when'"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_float_expiry_value_is_an_error(bad: float) -> None:
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="x", expiryPeriod="1.5"))
    got, reasons = classify_window(index, [one_batch(schema, id=[1, 2], x=[bad, 1.0])])
    assert got == ["error", "unique"]
    assert reasons == ["expiry value in 'x' is not a valid ordered value"]
    assert index.latest == 1.0


def test_unreadable_text_expiry_value_is_an_error() -> None:
    schema = pa.schema([("id", pa.int64()), ("ts", pa.string())])
    settings = settings_for(
        schema, keys="id", expiryKey="ts", expiryMode="tupleTime", expiryPeriod="1 day"
    )
    index = CommittedIndex(settings)
    batch = one_batch(schema, id=[1, 2, 3], ts=["2015-01-02 03:04:05", "soon", "2015-01-02"])
    got, reasons = classify_window(index, [batch])
    assert got == ["unique", "error", "unique"]
    assert reasons == ["expiry value in 'ts' is not a valid tupleTime value"]


@pytest.mark.parametrize(
    "text",
    [
        "2015-01-02T03:04:05.250Z",
        "2015-01-02T05:04:05.25+02:00",
        "2015-01-02 01:04:05.250000000-0200",
        "2015-01-02T03:04:05.250",
    ],
)
def test_iso_8601_text_with_a_fraction_or_an_offset_is_read_as_its_utc_time(text: str) -> None:
    """As producers write it (Spark's to_json: ``.SSSXXX``); without an offset, UTC. The
    first copy sets the latest point exactly; a copy one microsecond older is not expired."""
    schema = pa.schema([("id", pa.int64()), ("ts", pa.string())])
    settings = settings_for(
        schema, keys="id", expiryKey="ts", expiryMode="tupleTime", expiryPeriod="1 s"
    )
    index = CommittedIndex(settings)
    assert classify_window(index, [one_batch(schema, id=[1], ts=[text])])[0] == ["unique"]
    assert index.latest == micros(datetime(2015, 1, 2, 3, 4, 5, 250_000))
    # E = latest - 1 s: 03:04:04.250 is at it (expired), 03:04:04.250001 above it.
    later = one_batch(
        schema, id=[2, 3], ts=["2015-01-02T03:04:04.25Z", "2015-01-02T03:04:04.250001"]
    )
    assert classify_window(index, [later])[0] == ["expired", "unique"]


def test_a_decimal_value_exactly_at_the_expiry_point_is_expired() -> None:
    """Values are compared as floats, the expiry point computed in decimal and rounded as they
    are: in floats 0.30 - 0.1 is 0.19999999999999998, below the row 0.20 it must expire."""
    schema = pa.schema([("id", pa.int64()), ("x", pa.decimal128(10, 2))])
    index = CommittedIndex(settings_for(schema, keys="id", expiryKey="x", expiryPeriod="0.1"))
    first = one_batch(schema, id=[1], x=[Decimal("0.30")])
    assert classify_window(index, [first])[0] == ["unique"]
    later = one_batch(schema, id=[2, 3], x=[Decimal("0.20"), Decimal("0.21")])
    assert classify_window(index, [later])[0] == ["expired", "unique"]


def test_categorical_new_categories_are_numbered_in_order_of_first_appearance() -> None:
    schema = pa.schema([("id", pa.int64()), ("release", pa.string())])
    settings = settings_for(schema, keys="id", expiryKey="release", expiryPeriod="1")
    index = CommittedIndex(settings)
    batches = [
        one_batch(schema, id=[1, 2], release=["v2", "v1"]),
        one_batch(schema, id=[3], release=["v3"]),
    ]
    assert classify_window(index, batches)[0] == ["unique"] * 3
    assert (index.categories, index.latest) == (["v2", "v1", "v3"], 2)
    # E = 2 - 1 = 1: v2 (0) and v1 (1) are expired, v3 (2) is checked, v4 is new.
    batch = one_batch(schema, id=[4, 5, 3, 6], release=["v2", "v1", "v3", "v4"])
    assert classify_window(index, [batch])[0] == ["expired", "expired", "duplicate", "unique"]


def test_system_time_forgets_keys_a_period_after_their_window() -> None:
    schema = pa.schema([("id", pa.int64())])
    index = CommittedIndex(
        settings_for(schema, keys="id", expiryMode="systemTime", expiryPeriod="10 s")
    )
    second = 1_000_000
    assert classify_window(index, [one_batch(schema, id=[1, 1])], 0)[0] == ["unique", "duplicate"]
    assert classify_window(index, [one_batch(schema, id=[1])], 5 * second)[0] == ["duplicate"]
    assert classify_window(index, [one_batch(schema, id=[2])], 10 * second)[0] == ["unique"]
    # Latest 10 s, E = 0: the key stored at 0 s is forgotten, never expired.
    assert classify_window(index, [one_batch(schema, id=[1, 2])], 11 * second)[0] == [
        "unique",
        "duplicate",
    ]


def test_duplicates_within_a_window_across_record_batches() -> None:
    schema = pa.schema([("id", pa.string())])
    index = CommittedIndex(settings_for(schema, keys="id"))
    batches = [one_batch(schema, id=["a", "b"]), one_batch(schema, id=["b", "c", "a"])]
    got, _ = classify_window(index, batches)
    assert got == ["unique", "unique", "duplicate", "unique", "duplicate"]
    assert classify_window(index, [one_batch(schema, id=["c"])])[0] == ["duplicate"]


def test_new_keys_hold_each_key_once_with_its_bucket_and_stamp() -> None:
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    settings = settings_for(schema, keys="id", expiryKey="n", expiryPeriod="16", bucketSpan="4")
    classifier = WindowClassifier(settings, CommittedState(), CommittedIndex(settings))
    classifier.classify(one_batch(schema, id=[1, 2, 1], n=[5, 9, 5]))
    classifier.classify(one_batch(schema, id=[3, 2], n=[17, 9]))
    new = classifier.new_keys()
    assert new.stamps is not None
    assert new.stamps.tolist() == [5, 9, 17]
    # floor(n / 4) mod 4, times the 16 key shards of a time bucket, plus the key's shard
    assert (new.buckets // 16).tolist() == [1, 2, 0]
    assert (
        new.buckets.tolist()
        == bucket_of(settings, Fingerprints(new.h1, new.h2), new.stamps).tolist()
    )
    assert classifier.max_stamp == 17


def test_split_routes_rows_to_ports_and_adds_the_reason_column() -> None:
    schema = pa.schema([("id", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="id"))
    batch = one_batch(schema, id=[1, None, 1])
    out = split(batch, index.classifier().classify(batch))
    assert sorted(out) == ["duplicate", "error", "unique"]
    assert out["error"].schema.names == ["id", ERROR_COLUMN]
    assert out["unique"].schema == schema
    assert [out[p].num_rows for p in ("unique", "duplicate", "error")] == [1, 1, 1]


def test_port_constants_match_their_names() -> None:
    assert [PORTS[p] for p in (UNIQUE, DUPLICATE, EXPIRED, ERROR)] == list(PORTS)


# -- fingerprints -------------------------------------------------------------------------


def fp_pairs(fps: Fingerprints) -> list[tuple[int, int]]:
    return list(zip(fps.h1.tolist(), fps.h2.tolist(), strict=True))


def fps_of(*columns: pa.Array) -> list[tuple[int, int]]:
    return fp_pairs(fingerprint(list(columns)))


SAMPLE_COLUMNS = {
    "int64": pa.array([1, -2, None, 4, 1, 2**62, 0, 7], pa.int64()),
    "uint8": pa.array([1, 2, None, 4, 1, 255, 0, 7], pa.uint8()),
    "string": pa.array(["a", "bb", None, "", "a", "x" * 70, "ab\0", "ab"]),
    "binary": pa.array([b"a", b"bb", None, b"", b"a", b"x" * 70, b"\0", b"ab"]),
    "float64": pa.array([0.5, -0.0, None, 1e300, 0.5, math.nan, 0.0, -1.5]),
    "bool": pa.array([True, False, None, True, True, False, False, True]),
    "timestamp": pa.array([1, 2, None, 4, 1, 2**40, 0, 7], pa.timestamp("us")),
    "date32": pa.array([1, 2, None, 4, 1, 20000, 0, 7], pa.date32()),
    "decimal": pa.array([1, 2, None, 4, 1, 10**20, 0, 7], pa.decimal128(38, 2)),
    "fixed": pa.array(
        [b"abcd", b"efgh", None, b"abcd", b"abcd", b"zzzz", b"\0\0\0\0", b"a\0\0\0"], pa.binary(4)
    ),
    "struct": pa.array(
        [
            {"a": 1, "b": "x"},
            {"a": 2, "b": "y"},
            None,
            {"a": 1, "b": None},
            {"a": 1, "b": "x"},
            {"a": 3, "b": "z" * 90},
            {"a": 0, "b": ""},
            {"a": 1, "b": "xy"},
        ],
        pa.struct([("a", pa.int64()), ("b", pa.string())]),
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLE_COLUMNS))
def test_fingerprints_do_not_depend_on_slicing(name: str) -> None:
    array = SAMPLE_COLUMNS[name]
    whole = fps_of(array)
    valid = [i for i in range(len(array)) if array[i].is_valid]
    for start in range(len(array)):
        for length in (1, 2, len(array) - start):
            part = fps_of(array.slice(start, length))
            for offset, row in enumerate(range(start, start + length)):
                if row in valid:
                    assert part[offset] == whole[row], (start, length, row)


@pytest.mark.parametrize("name", sorted(SAMPLE_COLUMNS))
def test_fingerprints_do_not_depend_on_batch_layout(name: str) -> None:
    array = SAMPLE_COLUMNS[name]
    rebuilt = pa.array(array.to_pylist()[::-1], array.type)  # fresh buffers, other order
    assert fps_of(rebuilt)[::-1][0] == fps_of(array)[0]
    assert fps_of(rebuilt)[::-1][1] == fps_of(array)[1]
    # Equal values inside one array (rows 0 and 4) share a fingerprint.
    assert fps_of(array)[0] == fps_of(array)[4]


def test_equal_values_in_different_chunks_and_batches_match() -> None:
    values = [f"id-{i % 13}" for i in range(100)]
    chunked = pa.chunked_array([values[:37], values[37:]])
    per_chunk = [fp for chunk in chunked.chunks for fp in fps_of(chunk)]
    assert per_chunk == fps_of(pa.array(values))
    assert per_chunk[0] == per_chunk[13] == per_chunk[99 - 99 % 13]


def test_string_and_large_string_fingerprint_alike() -> None:
    values = ["a", "bb", "", "x" * 100, "ünïcödé"]
    assert fps_of(pa.array(values, pa.string())) == fps_of(pa.array(values, pa.large_string()))
    assert fps_of(pa.array(values, pa.string())) == fps_of(pa.array(values, pa.string_view()))


def test_string_and_binary_of_the_same_bytes_fingerprint_alike() -> None:
    values = ["k1", "key-22", "z" * 65]
    binary = pa.array([v.encode() for v in values], pa.binary())
    assert fps_of(pa.array(values)) == fps_of(binary)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 16, 63, 64, 65, 100, 127, 128, 129, 1000])
def test_equal_length_fast_path_agrees_with_the_gather_path(length: int) -> None:
    rng = random.Random(length)
    values = ["".join(rng.choice("abc\0") for _ in range(length)) for _ in range(5)]
    fast = fps_of(pa.array(values))  # all one length: reshaped, no gather
    gathered = fps_of(pa.array([*values, "odd"]))[:5]  # mixed lengths: gathered by word class
    with_null = fps_of(pa.array([None, *values]))[1:]  # nulls force the gather path too
    assert fast == gathered == with_null


@pytest.mark.parametrize("length", [65, 100, 128, 129, 500, 4096])
def test_long_strings_differing_in_any_byte_differ(length: int) -> None:
    base = bytearray(b"q" * length)
    variants = [bytes(base)]
    for position in {0, 7, 8, 63, 64, length // 2, length - 9, length - 1}:
        changed = bytearray(base)
        changed[position] = ord("r")
        variants.append(bytes(changed))
    variants.append(bytes(base) + b"\0")
    variants.append(bytes(base[:-1]))
    assert len(set(fps_of(pa.array(variants, pa.binary())))) == len(variants)


def test_long_strings_in_one_word_class_are_told_apart_by_length() -> None:
    # 100 and 120 bytes both take 16 words after rounding up: the length must separate them.
    short, long = "a" * 100, "a" * 100 + "\0" * 20
    assert len(set(fps_of(pa.array([short, long, short])))) == 2


def test_one_megabyte_strings() -> None:
    big = "m" * (1 << 20)
    other = big[:-1] + "n"
    fast = fps_of(pa.array([big, other]))
    gathered = fps_of(pa.array([big, "short", other]))
    assert fast[0] == gathered[0] and fast[1] == gathered[2]
    assert fast[0] != fast[1]


def test_a_trailing_zero_byte_changes_the_fingerprint() -> None:
    assert len(set(fps_of(pa.array(["ab", "ab\0", "ab\0\0", "a", ""])))) == 5
    assert len(set(fps_of(pa.array([b"ab", b"ab\0"], pa.binary())))) == 2


def test_negative_zero_equals_zero() -> None:
    doubles = fps_of(pa.array([0.0, -0.0], pa.float64()))
    floats = fps_of(pa.array([0.0, -0.0], pa.float32()))
    assert doubles[0] == doubles[1]
    assert floats[0] == floats[1] == doubles[0]


def test_column_order_and_boundaries_matter() -> None:
    a, b = pa.array(["x", "xy"]), pa.array(["yz", "z"])
    assert len(set(fps_of(a, b))) == 2
    assert fps_of(a, b) != fps_of(b, a)


def test_null_slot_holding_bytes_beside_empty_strings() -> None:
    """A null slot may span bytes in the data buffer (e.g. a flattened struct child); with every
    other value empty, the rows are no longer back to back and must not be reshaped as such."""
    offsets = pa.py_buffer(np.array([0, 0, 3, 3], dtype=np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 0, 1, 0, 0, 0, 0, 0], bitorder="little").tobytes())
    values = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(b"abc")])
    fps = fingerprint([values])
    empty = fingerprint([pa.array([""])])
    assert fps.h1[0] == fps.h1[2] == empty.h1[0] and fps.h2[0] == fps.h2[2] == empty.h2[0]


def test_empty_input_gives_empty_fingerprints() -> None:
    assert len(fingerprint([pa.array([], pa.string())])) == 0
    assert first_occurrences(fingerprint([pa.array([], pa.int64())])).tolist() == []


def test_fingerprints_as_arrow_are_sixteen_bytes_each() -> None:
    fps = fingerprint([pa.array([1, 2, 3])])
    packed = fps.as_arrow()
    assert packed.type == pa.binary(16) and len(packed) == 3
    assert np.frombuffer(packed.buffers()[1], dtype=np.uint64)[::2].tolist() == fps.h1.tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_first_occurrences_marks_the_first_copy_of_each_value(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.randrange(40) for _ in range(300)]
    got = first_occurrences(fingerprint([pa.array(values)])).tolist()
    seen: set[int] = set()
    expected = []
    for value in values:
        expected.append(value not in seen)
        seen.add(value)
    assert got == expected


def test_first_occurrences_of_distinct_values_are_all_first() -> None:
    assert first_occurrences(fingerprint([pa.array(range(50))])).all()


@pytest.mark.parametrize(
    ("copies", "lane_sharers"), [(0, 0), (12, 0), (12, 30), (800, 30), (3_000, 0)]
)
def test_first_occurrences_compares_both_lanes_whatever_the_share_of_repeats(
    copies: int, lane_sharers: int
) -> None:
    """Exact copies at the end of 5,000 random fingerprints, and rows that share only the h1
    lane with an earlier row (a different key): few repeats, many, and mostly repeats."""
    rows = 5_000
    rng = np.random.default_rng(copies + lane_sharers)
    h1 = rng.integers(0, 2**63, rows, dtype=np.int64).astype(np.uint64)
    h2 = rng.integers(0, 2**63, rows, dtype=np.int64).astype(np.uint64)
    h1[rows - copies :], h2[rows - copies :] = h1[:copies], h2[:copies]
    sharers = rng.choice(rows - copies, lane_sharers, replace=False)
    h1[sharers] = h1[(sharers + 1) % (rows - copies)]
    seen: set[tuple[int, int]] = set()
    expected = []
    for pair in zip(h1.tolist(), h2.tolist(), strict=True):
        expected.append(pair not in seen)
        seen.add(pair)
    assert first_occurrences(Fingerprints(h1, h2)).tolist() == expected


# -- key sets -----------------------------------------------------------------------------


def crowded_keys(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fingerprints from a tiny space, so equal keys and shared h1 lanes are frequent."""
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 6, n).astype(np.uint64),
        rng.integers(0, 4, n).astype(np.uint64),
        rng.integers(0, 100, n).astype(np.int64),
    )


def as_model(h1: np.ndarray, h2: np.ndarray, stamps: np.ndarray) -> dict[tuple[int, int], int]:
    model: dict[tuple[int, int], int] = {}
    for key, stamp in zip(zip(h1.tolist(), h2.tolist(), strict=True), stamps.tolist(), strict=True):
        model[key] = max(model.get(key, stamp), stamp)
    return model


def as_dict(keys: KeySet) -> dict[tuple[int, int], int]:
    assert keys.stamps is not None
    pairs = zip(keys.h1.tolist(), keys.h2.tolist(), strict=True)
    return dict(zip(pairs, keys.stamps.tolist(), strict=True))


@pytest.mark.parametrize("seed", range(8))
def test_keyset_keeps_one_entry_per_fingerprint_with_the_largest_stamp(seed: int) -> None:
    h1, h2, stamps = crowded_keys(seed, 40)
    keys = KeySet.build(h1, h2, stamps)
    assert len(keys) == len(as_model(h1, h2, stamps))
    assert as_dict(keys) == as_model(h1, h2, stamps)
    assert (np.diff(keys.h1.astype(np.int64)) >= 0).all()


@pytest.mark.parametrize("seed", range(8))
def test_keyset_lookup_respects_the_expiry_point_and_shared_h1(seed: int) -> None:
    h1, h2, stamps = crowded_keys(seed, 30)
    keys, model = KeySet.build(h1, h2, stamps), as_model(h1, h2, stamps)
    q1, q2, _ = crowded_keys(seed + 100, 50)
    for point in (None, 10, 50, 99):
        found = keys.contains(Fingerprints(q1, q2), point).tolist()
        expected = [
            (a, b) in model and (point is None or model[(a, b)] > point)
            for a, b in zip(q1.tolist(), q2.tolist(), strict=True)
        ]
        assert found == expected, point


@pytest.mark.parametrize("seed", range(8))
def test_keyset_highest_gives_each_keys_largest_stamp_with_shared_h1(seed: int) -> None:
    h1, h2, stamps = crowded_keys(seed, 30)
    keys, model = KeySet.build(h1, h2, stamps), as_model(h1, h2, stamps)
    q1, q2, _ = crowded_keys(seed + 100, 50)
    order = np.argsort(q1, kind="stable")
    q1, q2 = q1[order], q2[order]
    found = keys.highest(Fingerprints(q1, q2)).tolist()
    expected = [
        model.get((a, b), NO_SEQUENCE) for a, b in zip(q1.tolist(), q2.tolist(), strict=True)
    ]
    assert found == expected


def test_sequence_ids_read_whole_numbers_of_any_numeric_type_and_flag_the_rest() -> None:
    cases: list[tuple[pa.Array, list[int | None], list[str]]] = [
        (pa.array([1, None, -3], pa.int8()), [1, None, -3], ["ok", "null", "ok"]),
        (pa.array([7, 2**64 - 1], pa.uint64()), [7, None], ["ok", "bad"]),
        (
            pa.array([2.0, 1.5, math.nan, math.inf, 2.0**63, None]),
            [2, None, None, None, None, None],
            ["ok", "bad", "bad", "bad", "bad", "null"],
        ),
        (
            pa.array([Decimal("12.00"), Decimal("0.50"), Decimal("1e25")], pa.decimal128(30, 2)),
            [12, None, None],
            ["ok", "bad", "bad"],
        ),
    ]
    for array, values, states in cases:
        ids = sequence_ids(array)
        flags = zip(ids.missing, ids.unreadable, strict=True)
        seen = ["null" if missing else "bad" if bad else "ok" for missing, bad in flags]
        assert seen == states, array.type
        kept = [int(v) if s == "ok" else None for v, s in zip(ids.values, states, strict=True)]
        assert kept == values, array.type


def test_a_producers_sequence_keys_differ_by_id_and_from_other_producers() -> None:
    producers = fingerprint([pa.array(["a", "a", "b", "a"])])
    pairs = with_sequence(producers, np.array([1, 2, 1, 1], dtype=np.int64))
    keys = list(zip(pairs.h1.tolist(), pairs.h2.tolist(), strict=True))
    assert keys[0] == keys[3] and len({keys[0], keys[1], keys[2]}) == 3


def test_keyset_lookup_at_its_lowest_stamp_and_past_its_last_key() -> None:
    h1 = np.array([10, 20, 30], dtype=np.uint64)
    keys = KeySet.build(h1, h1 + np.uint64(1), np.array([5, 10, 15], dtype=np.int64))
    queries = Fingerprints(
        np.array([10, 20, 30, 40], np.uint64), np.array([11, 21, 31, 41], np.uint64)
    )
    # Below the lowest stamp no stamp is checked; at it, the key stamped there is forgotten.
    assert keys.contains(queries, 4.0).tolist() == [True, True, True, False]
    assert keys.contains(queries, 5.0).tolist() == [False, True, True, False]
    assert keys.contains(queries, 14.0).tolist() == [False, False, True, False]
    assert keys.contains(queries, 15.0).tolist() == [False, False, False, False]
    assert keys.lowest_stamp == 5.0 and KeySet.build(h1, h1, None).lowest_stamp is None


@pytest.mark.parametrize("seed", range(3))
def test_large_keyset_lookup_matches_the_model_and_its_filter_turns_away_only_absent_keys(
    seed: int,
) -> None:
    """Present, absent and shared-h1 queries all answer right; a filter over the set says
    "maybe" for every key it holds and turns away most absent ones."""
    rng = np.random.default_rng(seed)
    n = 100_000
    h1 = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    h1[:50] = h1[50:100]  # pairs of keys sharing h1 (64-bit collisions)
    h2 = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    stamps = rng.integers(0, 100, n).astype(np.int64)
    keys = KeySet.build(h1, h2, stamps)
    absent_h1 = rng.integers(0, 2**64 - 1, 5_000, dtype=np.uint64)
    absent_h2 = rng.integers(0, 2**64 - 1, 5_000, dtype=np.uint64)
    q1 = np.concatenate([h1[:3_000], absent_h1, h1[:100]])
    q2 = np.concatenate([h2[:3_000], absent_h2, h2[:100] + np.uint64(1)])
    model = as_model(h1, h2, stamps)
    for point in (None, 50):
        found = keys.contains(Fingerprints(q1, q2), point).tolist()
        expected = [
            (a, b) in model and (point is None or model[(a, b)] > point)
            for a, b in zip(q1.tolist(), q2.tolist(), strict=True)
        ]
        assert found == expected, point
    key_filter = KeyFilter(n)
    key_filter.add(keys.h1, keys.h2)
    assert key_filter.may_contain(h1, h2).all()
    assert key_filter.may_contain(absent_h1, absent_h2).mean() < 0.03  # 2**20 bits, 100,000 keys
    # One hash bucket's keys share their low bits (h1 modulo the bucket count): the filter
    # chooses its word by the top bits and its bits by h2, so it turns away as many absent
    # keys of that bucket.
    same_bucket = h1 - h1 % np.uint64(64) + np.uint64(5)
    bucket_filter = KeyFilter(n)
    bucket_filter.add(same_bucket, h2)
    absent_of_bucket = absent_h1 - absent_h1 % np.uint64(64) + np.uint64(5)
    assert bucket_filter.may_contain(same_bucket, h2).all()
    assert bucket_filter.may_contain(absent_of_bucket, absent_h2).mean() < 0.03
    assert keys.nbytes == 3 * 8 * n and key_filter.bits.nbytes == (1 << 20) // 8


def test_a_filter_keeps_every_key_of_an_add_whose_keys_share_words() -> None:
    rng = np.random.default_rng(7)
    h1 = rng.integers(0, 2**64 - 1, 40, dtype=np.uint64)
    h2 = rng.integers(0, 2**64 - 1, 40, dtype=np.uint64)
    crowded = KeyFilter(64)  # eight words for 40 keys: each holds about five keys' bits
    assert len(crowded.bits) == 8
    crowded.add(h1, h2)
    assert crowded.may_contain(h1, h2).all()
    assert (crowded.bits != np.uint64(2**64 - 1)).all()  # no word is all ones: each bit counts


@pytest.mark.parametrize("seed", range(8))
def test_keyset_merge_equals_building_the_union(seed: int) -> None:
    a, b = crowded_keys(seed, 25), crowded_keys(seed + 50, 15)
    merged = KeySet.build(*a).merge(KeySet.build(*b))
    union = [np.concatenate([x, y]) for x, y in zip(a, b, strict=True)]
    assert as_dict(merged) == as_model(*union)
    alive = merged.alive(50)
    assert as_dict(alive) == {k: v for k, v in as_model(*union).items() if v > 50}


@pytest.mark.parametrize("small", [5, 40, 3000])
def test_keyset_merge_places_or_sorts_with_the_same_result(small: int) -> None:
    """A merge places a few keys into a much larger set and sorts two sets of like size: both
    keep every fingerprint once with its largest stamp, keys re-seen and h1 shared included."""
    rng = np.random.default_rng(small)
    wide = [
        rng.integers(0, 2**63, 6000).astype(np.uint64),
        rng.integers(0, 2**63, 6000).astype(np.uint64),
        rng.integers(0, 100, 6000).astype(np.int64),
    ]
    big = [lane[:3000] for lane in wide]
    other = [lane[3000 : 3000 + small] for lane in wide]
    # Re-seen keys with other stamps, and a key sharing h1 with one of the large set's.
    seen = rng.choice(3000, 3, replace=False)
    other = [np.concatenate([own, in_big[seen]]) for own, in_big in zip(other, big, strict=True)]
    other[2][-3:] = rng.integers(0, 100, 3)
    shares_h1 = (big[0][7], np.uint64(1), 5)
    other = [np.append(lane, value) for lane, value in zip(other, shares_h1, strict=True)]
    merged = KeySet.build(*big).merge(KeySet.build(*other))
    union = [np.concatenate([x, y]) for x, y in zip(big, other, strict=True)]
    assert as_dict(merged) == as_model(*union)
    assert merged.shared_h1
    assert (np.diff(merged.h1.astype(np.float64)) >= 0).all()
    queries = Fingerprints(union[0], union[1])
    assert merged.contains(queries).all()


def test_keys_sharing_h1_stay_found_through_merges_that_do_not_touch_them() -> None:
    """A set knows it holds keys sharing h1, and so do the sets merged or cut from it: a
    lookup of either key of the pair keeps looking past the first."""
    pair = KeySet.build(
        np.array([7, 7], np.uint64), np.array([1, 2], np.uint64), np.array([60, 70], np.int64)
    )
    assert pair.shared_h1
    others = np.arange(100, 140, dtype=np.uint64)
    clean = KeySet.build(others, others, np.full(40, 80, np.int64))
    assert not clean.shared_h1
    both = np.array([7, 7], np.uint64), np.array([1, 2], np.uint64)
    for keys in (clean.merge(pair), pair.merge(clean), clean.merge(pair).alive(50)):
        assert keys.shared_h1
        assert keys.contains(Fingerprints(*both)).tolist() == [True, True]
        assert keys.contains(Fingerprints(*both), 65).tolist() == [False, True]


@pytest.mark.parametrize("seed", range(8))
def test_keyset_held_in_is_sound_and_dropping_held_keys_changes_no_merge(seed: int) -> None:
    """A key is claimed held only if the other set has it with at least its stamp (shared h1
    lanes may be answered False), so leaving held keys out of a merge changes nothing."""
    other, part = KeySet.build(*crowded_keys(seed, 25)), KeySet.build(*crowded_keys(seed + 9, 15))
    held = part.held_in(other)
    model = as_dict(other)
    assert part.stamps is not None
    for key, stamp, claimed in zip(
        zip(part.h1.tolist(), part.h2.tolist(), strict=True),
        part.stamps.tolist(),
        held.tolist(),
        strict=True,
    ):
        assert not claimed or model.get(key, -1) >= stamp
    assert as_dict(other.merge(part.without(held))) == as_dict(other.merge(part))


def test_keyset_held_in_finds_every_held_key_of_distinct_lanes() -> None:
    rng = np.random.default_rng(5)
    h1 = rng.permutation(np.arange(1_000, dtype=np.uint64) * np.uint64(7919))
    h2, stamps = h1 + np.uint64(1), rng.integers(0, 100, 1_000).astype(np.int64)
    other = KeySet.build(h1[:800], h2[:800], stamps[:800])
    # Part: 300 held keys (100 of them with a larger stamp now), 200 new ones.
    newer = stamps[500:800].copy()
    newer[:100] += 1
    part = KeySet.build(h1[500:], h2[500:], np.concatenate([newer, stamps[800:]]))
    held = part.held_in(other)
    assert held.sum() == 200
    assert len(part.without(held)) == 300


def test_new_keys_come_with_their_order_by_first_word_chunk_by_chunk() -> None:
    """``NewKeys.by_h1``: positions of the new keys, each chunk's in ascending ``h1`` (the runs
    settlement merges instead of sorting all the task's keys), every key once."""
    schema = pa.schema([("id", pa.int64())])
    index = CommittedIndex(settings_for(schema, keys="id"))
    classifier = index.classifier()
    rng = np.random.default_rng(5)
    sizes = [1000, 1, 0, 2500]
    for size in sizes:
        ids = rng.integers(0, 3000, size)  # repeats within and across chunks
        classifier.classify(pa.record_batch([pa.array(ids, pa.int64())], schema=schema))
    new = classifier.new_keys()
    assert new.by_h1 is not None
    assert sorted(new.by_h1.tolist()) == list(range(len(new.h1)))
    runs = np.split(new.h1[new.by_h1], np.flatnonzero(np.diff(new.h1[new.by_h1]) < 0) + 1)
    assert len(runs) <= len([s for s in sizes if s])
    assert all(np.all(np.diff(run) > 0) for run in runs)
