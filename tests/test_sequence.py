"""Sequence dedup (``sequenceKey``): each producer's highest sequence id, checked against the
row-by-row model ``reference.ReferenceSequence``.

Without Spark (``LocalSink``: the tasks and the commit of each window in this process): random
windows of a few producers dealt over 1 to 40 partitions (above 32 the commit settles the
copies) and in chunks of a few rows; the store holding one entry per producer, with its highest
id, however many rows and windows; float, decimal and unsigned sequence columns with values
that are no id; refused options and stores of the other kind. With Spark: a stream of ten
producers over three input files a window, restarted from its checkpoint, with a batch re-run
after its sink commit, continued by a new query with a fresh checkpoint and by a batch write run
twice; and a query refused before it writes anything.

Which copy of a (producer, id) repeated in a window is kept depends on partitioning, so ports
are compared as multisets of the rows without their ``row_id``; every ``row_id`` must still be
in exactly one port, and each error row must carry its reason.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from reference import BAD, ERROR, ReferenceSequence, whole_number
from streams import (
    PORT_NAMES,
    check_ports,
    output_listing,
    read_port,
    run_stream,
    sink_target,
    start_stream,
    write_batches,
)

import dedupsink
from dedupsink.engine.placement import key_fingerprints
from dedupsink.engine.settings import Settings
from dedupsink.errors import DedupOptionError, StoreSettingsError
from dedupsink.sink.local import LocalSink, deal
from dedupsink.store.format import Manifest, decode_segment
from dedupsink.store.history import read_history
from dedupsink.store.store import BucketStore

SCHEMA = pa.schema(
    [
        ("row_id", pa.int64()),
        ("win", pa.int64()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("seq", pa.int64()),
    ]
)
COLUMNS = tuple(SCHEMA.names)
COMPARED = ("win", "host", "pid", "seq")  # a row without its row_id
OPTIONS = {"keys": "host,pid", "sequenceKey": "seq"}
# Ten producers: a host and a process id, neither alone naming one.
PRODUCERS = [(f"h{i % 5}", i // 5 + 1) for i in range(10)]

Row = dict[str, Any]

# A store created now places keys by Spark's hash: fingerprints as the store keeps them.
SPARK_PLACED = Settings(
    "basic", ("id",), ("int64",), None, None, "int", None, None, 64, key_hash="spark"
)


# -- windows and the reference model -------------------------------------------------------------


def sequence_windows(
    seed: int, count: int, producers: Sequence[tuple[str, int]]
) -> list[list[Row]]:
    """``count`` windows of rows of ``producers``, shuffled within each window.

    A producer is silent in about one window in five; otherwise it sends 1 to 4 new ids, each
    1 to 3 times, with gaps between them. Some gap ids are sent later: in the same window (out
    of order, still above the earlier windows' highest) or in a later one (by then at or below
    it). It re-sends a few of its earlier ids. About every other window has a row with a null
    host, one with a null pid and one with a null id."""
    rng = random.Random(seed)
    next_id = {p: rng.choice([-20, 0, 1, 1000]) for p in producers}
    sent: dict[tuple[str, int], list[int]] = {p: [] for p in producers}
    gaps: dict[tuple[str, int], list[int]] = {p: [] for p in producers}
    windows: list[list[Row]] = []
    row_id = 0
    for win in range(count):
        rows: list[tuple[str | None, int | None, int | None]] = []
        for p in producers:
            if rng.random() < 0.2:
                continue
            for _ in range(rng.randint(1, 4)):
                s = next_id[p]
                rows.extend([(*p, s)] * rng.choice([1, 1, 2, 3]))
                sent[p].append(s)
                step = rng.choice([1, 1, 2, 3, 7])
                gaps[p].extend(range(s + 1, s + step))
                next_id[p] = s + step
            for s in rng.sample(sent[p], min(len(sent[p]), rng.randint(0, 2))):
                rows.append((*p, s))
            if gaps[p] and rng.random() < 0.3:
                rows.append((*p, gaps[p].pop(rng.randrange(len(gaps[p])))))
        if rng.random() < 0.5:
            rows.append((None, 1, next_id[producers[0]]))
            rows.append((producers[1][0], None, 1))
            rows.append((*producers[2], None))
        rng.shuffle(rows)
        window = []
        for host, pid, seq in rows:
            window.append({"row_id": row_id, "win": win, "host": host, "pid": pid, "seq": seq})
            row_id += 1
        windows.append(window)
    return windows


def table_of(rows: Sequence[Row], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema)


def compared(row: Row) -> tuple[Any, ...]:
    """A row over ``COMPARED``, NaN made equal to itself."""
    return tuple("NaN" if row[c] != row[c] else row[c] for c in COMPARED)


def producer_of(row: Row) -> tuple[Any, ...] | None:
    parts = (row["host"], row["pid"])
    return None if any(part is None for part in parts) else parts


def error_reason(row: Row, sequence_key: str = "seq") -> str | None:
    """The ``_dedup_error`` of a row: its first null producer column, else its id's fault."""
    for name in ("host", "pid"):
        if row[name] is None:
            return f"null key column {name!r}"
    value = whole_number(row[sequence_key])
    if value is None:
        return f"null sequence id in {sequence_key!r}"
    if value is BAD:
        return f"sequence id in {sequence_key!r} is not a whole number within int64"
    return None


def expected_outputs(
    windows: Sequence[Sequence[Row]], sequence_key: str = "seq"
) -> tuple[dict[str, Counter[tuple[Any, ...]]], ReferenceSequence]:
    """Each port's rows (over ``COMPARED``) that the model gives, and the model after them."""
    model = ReferenceSequence()
    expected: dict[str, Counter[tuple[Any, ...]]] = {port: Counter() for port in PORT_NAMES}
    for window in windows:
        ports = model.window(window, producer_of, lambda row: whole_number(row[sequence_key]))
        for row, port in zip(window, ports, strict=True):
            expected[port][compared(row)] += 1
    return expected, model


def assert_matches_model(
    output: Any, windows: Sequence[Sequence[Row]], sequence_key: str = "seq"
) -> ReferenceSequence:
    """The ports equal the model's as multisets of rows without their row_id; every input row
    is in exactly one port; each error row carries its reason. Returns the model."""
    expected, model = expected_outputs(windows, sequence_key)
    tables = {port: read_port(output, port) for port in PORT_NAMES}
    actual = {
        port: Counter(compared(row) for row in table.to_pylist()) for port, table in tables.items()
    }
    assert actual == expected
    landed = Counter(rid for t in tables.values() for rid in t.column("row_id").to_pylist())
    assert landed == Counter(row["row_id"] for window in windows for row in window)
    by_id = {row["row_id"]: row for window in windows for row in window}
    errors = tables[ERROR].select(["row_id", "_dedup_error"]).to_pylist()
    assert {e["row_id"]: e["_dedup_error"] for e in errors} == {
        e["row_id"]: error_reason(by_id[e["row_id"]], sequence_key) for e in errors
    }
    assert tables["expired"].num_rows == 0
    return model


# -- the store -----------------------------------------------------------------------------------


def manifest_of(output: Path) -> Manifest:
    manifest = BucketStore(str(output / "_store")).read()
    assert manifest is not None
    return manifest


def live_entries(manifest: Manifest) -> int:
    """The keys of the segments the index lists (a window file's own count is that of when it
    was written: a fold leaves the file listed for the buckets it did not fold)."""
    return sum(s.count for segments in manifest.buckets.values() for s in segments)


def stored_ids(output: Path) -> dict[tuple[int, int], int]:
    """Every entry of the store's live segments: producer fingerprint -> stored id."""
    store = BucketStore(str(output / "_store"))
    manifest = manifest_of(output)
    segments = [s for listed in manifest.buckets.values() for s in listed]
    entries: dict[tuple[int, int], int] = {}
    for raw, segment in zip(store.fetch(segments), segments, strict=True):
        keys = decode_segment(raw, segment, np.dtype(np.int64), store.data_url(segment.file))
        assert keys.stamps is not None
        for h1, h2, stamp in zip(keys.h1, keys.h2, keys.stamps, strict=True):
            assert (int(h1), int(h2)) not in entries, "a producer stored twice"
            entries[(int(h1), int(h2))] = int(stamp)
    return entries


def fingerprints_of(highest: Mapping[Any, int]) -> dict[tuple[int, int], int]:
    """The model's highest ids keyed as the store keys its producers."""
    producers = list(highest)
    fps = key_fingerprints(
        SPARK_PLACED,
        [
            pa.array([p[0] for p in producers], pa.string()),
            pa.array([p[1] for p in producers], pa.int64()),
        ],
    )
    return {
        (int(h1), int(h2)): highest[p] for p, h1, h2 in zip(producers, fps.h1, fps.h2, strict=True)
    }


def assert_one_entry_per_producer(output: Path, model: ReferenceSequence) -> None:
    """The store holds each producer once, with the model's highest id, one segment a bucket."""
    manifest = manifest_of(output)
    assert manifest.remembered_keys == len(model.highest)
    assert live_entries(manifest) == len(model.highest)
    assert all(len(segments) == 1 for segments in manifest.buckets.values()), manifest.buckets
    assert stored_ids(output) == fingerprints_of(model.highest)


# -- without Spark ---------------------------------------------------------------------------------


def local_sink(output: Path, schema: pa.Schema = SCHEMA, **options: str) -> LocalSink:
    return LocalSink({"path": str(output), **OPTIONS, **options}, schema)


def run_window(
    sink: LocalSink, batch_id: int, table: pa.Table, partitions: int, chunk: int | None = None
) -> int:
    """One window: its rows dealt round-robin over ``partitions`` tasks, each task's rows in
    record batches of at most ``chunk`` rows, then the commit. Returns the number of copies
    that were unique in their own task but not in the window."""
    summaries = [
        sink.task(batch_id, part, deal(table, part, partitions).to_batches(max_chunksize=chunk))
        for part in range(partitions)
    ]
    report = sink.commit(batch_id, summaries)
    assert report is not None
    return report.cross_partition_duplicates


@pytest.mark.parametrize(
    ("partitions", "chunk"),
    [(1, None), (2, None), (3, 2), (5, None), (7, 3), (40, None)],
)
def test_random_windows_over_partitions_match_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int, chunk: int | None
) -> None:
    """With ``chunk``, a task classifies its rows a few at a time (its unique rows of earlier
    chunks are already written when it settles with the lower partitions); with 40 partitions
    the tasks above 32 leave their copies to the commit."""
    if chunk is not None:
        monkeypatch.setattr("dedupsink.sink.task.COALESCE_ROWS", chunk)
    producers = PRODUCERS[:6]
    windows = sequence_windows(seed=partitions * 31 + (chunk or 0), count=12, producers=producers)
    output = tmp_path / "out"
    sink = local_sink(output)
    crossed = sum(
        run_window(sink, batch_id, table_of(window), partitions, chunk)
        for batch_id, window in enumerate(windows)
    )
    assert (crossed > 0) == (partitions > 1)
    model = assert_matches_model(output, windows)
    assert_one_entry_per_producer(output, model)


def test_copies_and_several_ids_of_a_producer_across_partitions_and_windows(
    tmp_path: Path,
) -> None:
    """Each rule once, by hand, dealt over three partitions."""

    def row(rid: int, win: int, host: str | None, seq: int | None) -> Row:
        return {"row_id": rid, "win": win, "host": host, "pid": 1, "seq": seq}

    windows = [
        # a: 5, 3 and 9 in one window, out of order, 5 three times over three partitions.
        [row(0, 0, "a", 5), row(1, 0, "a", 5), row(2, 0, "a", 5), row(3, 0, "a", 3),
         row(4, 0, "a", 9), row(5, 0, "b", 100)],
        # a: 9 again, 7 (a gap, now below 9), 10 and 12 (a gap) twice; b: 99, 101.
        [row(6, 1, "a", 9), row(7, 1, "a", 7), row(8, 1, "a", 12), row(9, 1, "a", 10),
         row(10, 1, "a", 12), row(11, 1, "b", 99), row(12, 1, "b", 101), row(13, 1, None, 1)],
        # a: 11 (the gap, now below 12); c's first id is negative.
        [row(14, 2, "a", 11), row(15, 2, "c", -4), row(16, 2, "b", None), row(17, 2, "a", 13)],
    ]  # fmt: skip
    output = tmp_path / "out"
    sink = local_sink(output)
    for batch_id, window in enumerate(windows):
        run_window(sink, batch_id, table_of(window), 3)
    model = assert_matches_model(output, windows)
    assert model.highest == {("a", 1): 13, ("b", 1): 101, ("c", 1): -4}
    unique = read_port(output, "unique").select(["host", "seq"]).to_pylist()
    assert sorted((r["host"], r["seq"]) for r in unique) == [
        ("a", 3), ("a", 5), ("a", 9), ("a", 10), ("a", 12), ("a", 13),
        ("b", 100), ("b", 101), ("c", -4),
    ]  # fmt: skip
    assert_one_entry_per_producer(output, model)


def test_a_copy_in_a_partition_above_32_is_settled_by_the_commit(tmp_path: Path) -> None:
    """Partitions above ``SETTLE_WITH_AT_MOST`` (32) leave their copies to the commit, which
    moves the copy of (a, 5) in partition 33 to duplicate; a's highest id is 7 either way."""
    output = tmp_path / "out"
    sink = local_sink(output)
    ids = {0: 5, 1: 7, 33: 5}  # partition -> a's id; the others send b's ids
    window = [
        {"row_id": part, "win": 0, "host": "a" if part in ids else "b", "pid": 1,
         "seq": ids.get(part, part)}
        for part in range(34)
    ]  # fmt: skip
    crossed = run_window(sink, 0, table_of(window), 34)
    later = [{"row_id": 100, "win": 1, "host": "a", "pid": 1, "seq": 6}]
    run_window(sink, 1, table_of(later), 1)
    assert crossed == 1
    assert sorted(read_port(output, "duplicate").column("row_id").to_pylist()) == [33, 100]
    model = assert_matches_model(output, [window, later])
    assert model.highest == {("a", 1): 7, ("b", 1): 32}
    assert_one_entry_per_producer(output, model)


@pytest.mark.parametrize(("buckets", "cached"), [("2", "64"), ("64", "64"), ("64", "2")])
def test_the_store_keeps_one_entry_per_producer_however_many_rows_and_windows(
    tmp_path: Path, buckets: str, cached: str
) -> None:
    """Forty windows of 60 rows of eight producers, over two partitions: after every window
    the live segments hold each producer seen once, with its highest id, in one segment a
    bucket (two buckets: several producers share one; two cached buckets: lookups and the
    commit's fold take the buckets a few at a time)."""
    producers = PRODUCERS[:8]
    rng = random.Random(int(buckets) + int(cached))
    output = tmp_path / "out"
    sink = local_sink(output, numBuckets=buckets, maxCachedBuckets=cached)
    model_windows: list[list[Row]] = []
    next_id = dict.fromkeys(producers, 0)
    row_id = 0
    for win in range(40):
        window: list[Row] = []
        for _ in range(60):
            p = rng.choice(producers[: 2 + win // 5])  # producers join as windows pass
            seq = next_id[p] if rng.random() < 0.7 else max(0, next_id[p] - rng.randint(1, 5))
            next_id[p] = max(next_id[p], seq + 1)
            window.append({"row_id": row_id, "win": win, "host": p[0], "pid": p[1], "seq": seq})
            row_id += 1
        model_windows.append(window)
        run_window(sink, win, table_of(window), 2)
        _, model = expected_outputs(model_windows)
        manifest = manifest_of(output)
        assert manifest.remembered_keys == len(model.highest), f"window {win}"
        assert live_entries(manifest) == len(model.highest)
        assert all(len(segments) == 1 for segments in manifest.buckets.values())
    model = assert_matches_model(output, model_windows)
    assert len(model.highest) == 8
    assert_one_entry_per_producer(output, model)
    assert len(manifest_of(output).files) <= int(buckets)


SEQUENCE_TYPES = {
    "float64": (
        pa.float64(),
        [3.0, 1.5, float("nan"), None, float("inf"), -float("inf"), 2.0**63, 4.0, -0.0, 1e300],
    ),
    "float32": (pa.float32(), [3.0, 1.5, float("nan"), None, 4.0, 2.0**70, 5.0, 0.0, 2.5, 6.0]),
    "decimal": (
        pa.decimal128(38, 2),
        [Decimal(v) for v in ("3", "1.50", "0.01", "4.00", "100000000000000000000", "-7", "5")]
        + [None, Decimal("9223372036854775807"), Decimal("9223372036854775808")],
    ),
    "uint64": (pa.uint64(), [3, 2**64 - 1, 2**63, None, 4, 2**63 - 1, 5, 0, 1, 6]),
    "int32": (pa.int32(), [3, -(2**31), None, 2**31 - 1, 4, 0, 5, 1, 2, 6]),
}


@pytest.mark.parametrize("kind", list(SEQUENCE_TYPES))
def test_sequence_columns_of_other_types_send_what_is_no_id_to_error(
    tmp_path: Path, kind: str
) -> None:
    """Fractions, NaN, infinities, nulls and values beyond int64 are errors with reasons; whole
    values are ids like any other (two windows: the second re-sends the first's rows in
    reverse order, its whole values all duplicates)."""
    arrow_type, values = SEQUENCE_TYPES[kind]
    schema = SCHEMA.set(SCHEMA.get_field_index("seq"), pa.field("seq", arrow_type))
    windows = [
        [
            {"row_id": i, "win": 0, "host": f"h{i % 2}", "pid": 1, "seq": v}
            for i, v in enumerate(values)
        ],
        [
            {"row_id": 100 + i, "win": 1, "host": f"h{i % 2}", "pid": 1, "seq": v}
            for i, v in reversed(list(enumerate(values)))
        ],
    ]
    output = tmp_path / "out"
    sink = local_sink(output, schema)
    for batch_id, window in enumerate(windows):
        run_window(sink, batch_id, table_of(window, schema), 2)
    model = assert_matches_model(output, windows)
    errors = read_port(output, "error").column("_dedup_error").to_pylist()
    reasons = set(errors)
    assert "null sequence id in 'seq'" in reasons
    if kind != "int32":
        assert "sequence id in 'seq' is not a whole number within int64" in reasons
    assert len(errors) == 2 * sum(whole_number(v) in (None, BAD) for v in values)
    assert set(read_port(output, "unique").column("win").to_pylist()) == {0}
    assert_one_entry_per_producer(output, model)


def test_the_lowest_int64_is_unique_as_a_producers_first_id(tmp_path: Path) -> None:
    """-2**63 is a whole number within int64, so it is an id like any other: the first row of
    a producer not seen yet is unique, whatever its id; its copy in a later window is not."""
    windows = [
        [{"row_id": 0, "win": 0, "host": "a", "pid": 1, "seq": -(2**63)}],
        [
            {"row_id": 1, "win": 1, "host": "a", "pid": 1, "seq": -(2**63)},
            {"row_id": 2, "win": 1, "host": "a", "pid": 1, "seq": -(2**63) + 1},
        ],
    ]
    output = tmp_path / "out"
    sink = local_sink(output)
    for batch_id, window in enumerate(windows):
        run_window(sink, batch_id, table_of(window), 1)
    assert read_port(output, "unique").column("row_id").to_pylist() == [0, 2]
    assert_matches_model(output, windows)


# -- refused options and stores ------------------------------------------------------------------

WITH_TEXT = SCHEMA.append(pa.field("body", pa.string()))
NO_EXPIRY = "(sequence dedup keeps each producer's highest sequence id, which never expires)"


@pytest.mark.parametrize(
    ("options", "option", "value", "accepted"),
    [
        (
            {**OPTIONS, "sequenceKey": "body"},
            "sequenceKey",
            "body",
            "an integer column (a whole-valued float or decimal column also serves: rows whose "
            "value is not a whole number go to error); 'body' has type string",
        ),
        (
            {**OPTIONS, "sequenceKey": "missing"},
            "sequenceKey",
            "missing",
            f"a column of the stream: one of {WITH_TEXT.names}",
        ),
        (
            {"keys": "host,seq", "sequenceKey": "seq"},
            "sequenceKey",
            "seq",
            "a column that is not one of the producer columns (keys=host,seq)",
        ),
        (
            {"sequenceKey": "seq"},
            "keys",
            None,
            "the producer columns: sequenceKey=seq keeps the highest sequence id of each "
            "producer, so keys must name what identifies one",
        ),
        *(
            (
                {**OPTIONS, option: value},
                option,
                value,
                f"no value with sequenceKey=seq {NO_EXPIRY}",
            )
            for option, value in (
                ("expiryKey", "win"),
                ("expiryMode", "systemTime"),
                ("expiryPeriod", "10"),
                ("bucketSpan", "5"),
                ("maxExpiryJump", "100"),
                ("assumeSameExpiry", "false"),
            )
        ),
    ],
)
def test_bad_options_are_refused_at_start_naming_option_and_value(
    tmp_path: Path, options: dict[str, str], option: str, value: str | None, accepted: str
) -> None:
    output = tmp_path / "out"
    with pytest.raises(DedupOptionError) as caught:
        LocalSink({"path": str(output), **options}, WITH_TEXT).start()
    assert caught.value.option == option
    assert caught.value.value == value
    given = " is missing" if value is None else f"={value!r} is invalid"
    assert str(caught.value) == f"option {option}{given}: expected {accepted}"
    assert output_listing(output) == {}


def written(output: Path) -> dict[str, int]:
    return {p.relative_to(output).as_posix(): p.stat().st_size for p in output.rglob("*")}


@pytest.mark.parametrize(
    ("created_with", "then", "value", "accepted"),
    [
        ({"keys": "host,pid"}, OPTIONS, "seq", "none (dedup by key, not by sequence)"),
        (OPTIONS, {"keys": "host,pid"}, "none (dedup by key, not by sequence)", "seq"),
        (OPTIONS, {**OPTIONS, "sequenceKey": "win"}, "win", "seq"),
    ],
)
def test_a_store_of_the_other_kind_is_refused_naming_sequence_key(
    tmp_path: Path, created_with: dict[str, str], then: dict[str, str], value: str, accepted: str
) -> None:
    output = tmp_path / "out"
    window = [{"row_id": 0, "win": 0, "host": "a", "pid": 1, "seq": 1}]
    LocalSink({"path": str(output), **created_with}, SCHEMA).window(0, table_of(window))
    before = written(output)
    with pytest.raises(StoreSettingsError) as caught:
        LocalSink({"path": str(output), **then}, SCHEMA).start()
    assert caught.value.option == "sequenceKey"
    assert caught.value.value == value
    assert str(caught.value).startswith(
        f"option sequenceKey={value!r} is invalid: expected {accepted}, the value the store at "
    )
    assert written(output) == before


def test_a_sequence_column_of_another_type_is_refused_naming_sequence_key(tmp_path: Path) -> None:
    output = tmp_path / "out"
    window = [{"row_id": 0, "win": 0, "host": "a", "pid": 1, "seq": 1}]
    local_sink(output).window(0, table_of(window))
    before = written(output)
    narrower = SCHEMA.set(SCHEMA.get_field_index("seq"), pa.field("seq", pa.int32()))
    with pytest.raises(StoreSettingsError) as caught:
        local_sink(output, narrower).start()
    assert caught.value.option == "sequenceKey"
    assert written(output) == before


# -- with Spark -------------------------------------------------------------------------------


def write_window_files(
    folder: Path, windows: Sequence[Sequence[Row]], files: int, seed: int, start: int = 0
) -> int:
    """Each window as ``files`` Parquet files, its rows dealt at random; returns the next file
    number. Read with ``maxFilesPerTrigger=files`` each window is one micro-batch whose rows,
    copies of one (producer, id) among them, arrive in ``files`` partitions."""
    rng = random.Random(seed)
    tables = []
    for window in windows:
        parts: list[list[Row]] = [[] for _ in range(files)]
        for row in window:
            parts[rng.randrange(files)].append(row)
        tables.extend(table_of(part) for part in parts)
    write_batches(folder, tables, start=start)
    return start + len(tables)


def batch_write(spark: Any, rows: Sequence[Row], output: Path, folder: Path) -> None:
    """``df.write.format("dedup").mode("append")`` of these rows, over three partitions."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"batch-{len(list(folder.iterdir()))}.parquet"
    pq.write_table(table_of(rows), path)
    frame = spark.read.parquet(str(path)).repartition(3)
    frame.write.format("dedup").mode("append").options(**OPTIONS).save(str(output))


def port_listing(output: Path) -> dict[str, int]:
    return {p: n for p, n in output_listing(output).items() if p.split("/")[0] in PORT_NAMES}


@pytest.mark.spark
def test_a_stream_of_ten_producers_restarted_continued_and_batch_written_matches_the_model(
    spark: Any, workdir: Path
) -> None:
    """Ten windows of ten producers (re-sends in the same and later windows, gaps, several ids
    of a producer in a window over three partitions, rows out of order, null producers and
    ids): windows 0-3 a stream, 4-5 the same query restarted from its checkpoint, window 5
    re-run after its sink commit (Spark forgets it finished), 6-7 a new query with a fresh
    checkpoint on the same output, 8 a batch write, 9 the same batch write again."""
    windows = sequence_windows(seed=2024, count=9, producers=PRODUCERS)
    windows.append(windows[8])  # the batch write run twice: the same rows
    output, source, checkpoint = workdir / "out", workdir / "in", workdir / "chk"

    after = write_window_files(source, windows[:4], 3, seed=1)
    run_stream(spark, source, output, OPTIONS, checkpoint, files_per_batch=3)
    assert_matches_model(output, windows[:4])

    write_window_files(source, windows[4:6], 3, seed=2, start=after)
    run_stream(spark, source, output, OPTIONS, checkpoint, files_per_batch=3)
    assert_matches_model(output, windows[:6])

    before = port_listing(output)
    (checkpoint / "commits" / "5").unlink()
    (checkpoint / "commits" / ".5.crc").unlink(missing_ok=True)
    query = start_stream(
        spark, source, {**sink_target(output), **OPTIONS}, checkpoint, files_per_batch=3
    )
    query.awaitTermination()
    assert query.lastProgress["batchId"] == 5, "Spark should have run batch 5 again"
    assert port_listing(output) == before

    dedupsink.release(str(output))
    write_window_files(workdir / "in-2", windows[6:8], 3, seed=3)
    run_stream(spark, workdir / "in-2", output, OPTIONS, workdir / "chk-2", files_per_batch=3)
    assert_matches_model(output, windows[:8])

    dedupsink.release(str(output))
    batch_write(spark, windows[8], output, workdir / "batch")
    batch_write(spark, windows[9], output, workdir / "batch")
    model = assert_matches_model(output, windows)
    assert len(model.highest) == len(PRODUCERS)
    check_ports(spark, output, COLUMNS, len(windows))
    manifest = manifest_of(output)
    assert manifest.remembered_keys == len(PRODUCERS)
    assert all(len(segments) == 1 for segments in manifest.buckets.values())
    assert live_entries(manifest) == len(PRODUCERS)
    assert stored_ids(output) == fingerprints_of(model.highest)


@pytest.mark.spark
def test_a_query_naming_a_text_sequence_column_fails_before_writing_anything(
    spark: Any, workdir: Path
) -> None:
    rows = [{"row_id": 0, "win": 0, "host": "a", "pid": 1, "seq": 1}]
    write_batches(workdir / "in", [table_of(rows)])
    output = workdir / "out"
    options = {**sink_target(output), "keys": "pid", "sequenceKey": "host"}
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(spark, workdir / "in", options, workdir / "chk").awaitTermination()
    assert "DedupOptionError" in str(caught.value)
    assert "option sequenceKey='host' is invalid: expected an integer column" in str(caught.value)
    assert output_listing(output) == {}


def test_a_windows_keys_added_are_the_producers_it_stored_first(tmp_path: Path) -> None:
    """The history's ``keys_added`` (the window record's new keys) counts the producers a window
    added to the store, as the keys remembered count them: 2 (a and b, each in both
    partitions), then none (both known, with new ids), then 1 (c)."""

    def window(win: int, *hosts: str) -> pa.Table:
        rows = [
            {"row_id": 10 * win + i, "win": win, "host": host, "pid": 1, "seq": 10 * win + i}
            for i, host in enumerate(hosts)
        ]
        return table_of(rows)

    output = tmp_path / "out"
    sink = local_sink(output)
    for batch_id, table in enumerate(
        [window(0, "a", "a", "b", "b"), window(1, "a", "a", "b", "b"), window(2, "a", "c")]
    ):
        run_window(sink, batch_id, table, 2)
    rows = read_history(BucketStore(str(output / "_store"))).to_pylist()
    assert [r["keys_remembered"] for r in rows] == [2, 2, 3]
    assert [r["keys_added"] for r in rows] == [2, 0, 1]


def test_lookup_tells_a_producers_highest_id_and_where_a_row_with_an_id_goes(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out"
    rows = [
        {"row_id": n, "win": 0, "host": "h1", "pid": 1, "seq": seq}
        for n, seq in enumerate([4, 9, 7])
    ]
    run_window(local_sink(output), 0, table_of(rows), partitions=2)
    below = dedupsink.lookup(str(output), {"host": "h1", "pid": "1", "seq": "9"})
    assert below.remembered and below.stamp == 9
    assert below.verdict == "duplicate: at or below the producer's highest id 9"
    above = dedupsink.lookup(str(output), {"host": "h1", "pid": 1, "seq": 10})
    assert above.verdict == "unique: above the producer's highest id 9"
    unknown = dedupsink.lookup(str(output), {"host": "h2", "pid": 1, "seq": 1})
    assert not unknown.remembered
    assert unknown.verdict == "unique: the producer has no committed unique row yet"
    assert "highest id" not in (unknown.reason or "")
    with pytest.raises(dedupsink.DedupError, match="seq=x: not a whole-number sequence id"):
        dedupsink.lookup(str(output), {"host": "h1", "pid": 1, "seq": "x"})
