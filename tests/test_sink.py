"""The dedup sink on real streams, mode by mode, against the reference model of docs/SEMANTICS.md.

Every test drives a file stream through ``format("dedup")`` with ``availableNow``, compares the
four ports row for row with ``tests/reference.py`` over the same windows, and checks what must
hold of the ports after any scenario (``streams.check_ports``): Spark and pyarrow read the same
rows, every port has its schema even when empty, Spark's sink log has one entry per window.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from streams import (
    Output,
    assert_matches_reference,
    check_ports,
    later_resends,
    output_listing,
    port_values,
    read_port,
    reference_outputs,
    run_stream,
    spark_log_names,
    start_stream,
    windows_of,
    write_batches,
)

pytestmark = pytest.mark.spark

DAY_MICROS = 86_400_000_000
MINUTE_MICROS = 60_000_000


def table(**columns: list[Any]) -> pa.Table:
    return pa.table(columns)


def ts(text: str) -> datetime:
    return datetime.strptime(text, "%d-%m-%Y %H:%M").replace(tzinfo=UTC)


def timestamps(*texts: str | None) -> pa.Array:
    return pa.array([None if t is None else ts(t) for t in texts], pa.timestamp("us", tz="UTC"))


def run_and_compare(
    spark: Any,
    workdir: Path,
    batches: list[pa.Table],
    options: dict[str, str],
    mode: str,
    keys: list[str],
    period: float | None = None,
    files_per_batch: int = 1,
    repartition: int | None = None,
    max_jump: float | None = None,
    output: Output | None = None,
) -> Output:
    """Stream ``batches`` through the sink; assert ports equal the reference; return the output."""
    write_batches(workdir / "in", batches)
    output = workdir / "out" if output is None else output
    run_stream(
        spark,
        workdir / "in",
        output,
        options,
        workdir / "chk",
        files_per_batch=files_per_batch,
        repartition=repartition,
    )
    windows = windows_of(batches, files_per_batch)
    expected = reference_outputs(windows, mode, keys, options.get("expiryKey"), period, max_jump)
    columns = batches[0].schema.names
    assert_matches_reference(output, expected, columns)
    check_ports(spark, output, columns, len(windows))
    return output


def test_basic_mode_finds_duplicates_across_windows_and_sends_null_keys_to_error(
    spark: Any, workdir: Path, place: Output
) -> None:
    batches = [
        table(id=[1, 2, 2, 3, None], name=["a", "b", "b", "c", "x"]),
        table(id=[1, 4, 4, None], name=["a again", "d", "d", "y"]),
        table(id=[4, 5, 2], name=["d", "e", "b"]),
    ]
    output = run_and_compare(spark, workdir, batches, {"keys": "id"}, "basic", ["id"], output=place)
    assert port_values(output, "unique", "id") == [1, 2, 3, 4, 5]
    assert port_values(output, "expired", "id") == []
    errors = read_port(output, "error")
    assert errors.column("_dedup_error").to_pylist() == ["null key column 'id'"] * 2
    assert errors.column("name").to_pylist() in (["x", "y"], ["y", "x"])


def test_multi_column_key_is_duplicate_only_when_every_column_matches(
    spark: Any, workdir: Path
) -> None:
    batches = [
        table(region=["eu", "eu", "us"], order=[1, 2, 1], qty=[5, 6, 7]),
        table(region=["eu", "us", None], order=[1, 2, 3], qty=[5, 8, 9]),
        table(region=["us", "eu", "eu"], order=[1, None, 3], qty=[7, 1, 2]),
        table(region=["us", "eu"], order=[2, 3], qty=[8, 2]),
    ]
    output = run_and_compare(
        spark, workdir, batches, {"keys": "region,order"}, "basic", ["region", "order"],
        files_per_batch=2,
    )  # fmt: skip
    unique = read_port(output, "unique").select(["region", "order"]).to_pylist()
    assert sorted((r["region"], r["order"]) for r in unique) == [
        ("eu", 1), ("eu", 2), ("eu", 3), ("us", 1), ("us", 2),
    ]  # fmt: skip
    reasons = sorted(read_port(output, "error").column("_dedup_error").to_pylist())
    assert reasons == ["null key column 'order'", "null key column 'region'"]


def test_without_keys_option_the_key_is_every_column(spark: Any, workdir: Path) -> None:
    batches = [
        table(id=[1, 1, 2], name=["a", "b", "c"]),
        table(id=[1, 1, 2], name=["a", "z", "c"]),
    ]
    output = run_and_compare(spark, workdir, batches, {}, "basic", ["id", "name"])
    unique = read_port(output, "unique").to_pylist()
    assert sorted((r["id"], r["name"]) for r in unique) == [(1, "a"), (1, "b"), (1, "z"), (2, "c")]


def test_nested_key_column_is_addressed_by_dotted_name(spark: Any, workdir: Path) -> None:
    order = pa.struct([("id", pa.int64()), ("line", pa.int64())])
    batches = [
        pa.table({"order": pa.array([{"id": 1, "line": 1}, {"id": 2, "line": 1}], order)}),
        pa.table({"order": pa.array([{"id": 1, "line": 2}, None, {"id": None, "line": 3}], order)}),
    ]
    output = run_and_compare(spark, workdir, batches, {"keys": "order.id"}, "basic", ["order.id"])
    assert [r["order"]["line"] for r in read_port(output, "duplicate").to_pylist()] == [2]
    assert read_port(output, "error").num_rows == 2


def test_tuple_time_expires_at_the_seed_boundary_one_row_per_window(
    spark: Any, workdir: Path, place: Output
) -> None:
    """Latest 31-12-2014 00:00, period 1 day: 30-12 00:00 is expired, 30-12 00:11 is checked."""
    rows = [
        ("a", "31-12-2014 00:00"),
        ("b", "30-12-2014 00:00"),
        ("c", "30-12-2014 00:11"),
        ("a", "31-12-2014 00:00"),
        ("d", None),
        ("c", "30-12-2014 00:11"),
    ]
    batches = [table(id=[key], at=timestamps(at)) for key, at in rows]
    options = {"keys": "id", "expiryKey": "at", "expiryPeriod": "1 day"}
    output = run_and_compare(
        spark, workdir, batches, options, "tupleTime", ["id"], DAY_MICROS, output=place
    )
    assert port_values(output, "expired", "id") == ["b"]
    assert port_values(output, "unique", "id") == ["a", "c"]
    assert port_values(output, "duplicate", "id") == ["a", "c"]
    assert read_port(output, "error").column("_dedup_error").to_pylist() == [
        "null expiry value in 'at'"
    ]


def test_tuple_time_over_text_column_sends_unreadable_times_to_error(
    spark: Any, workdir: Path
) -> None:
    batches = [
        table(id=[1, 2, 3], at=["2014-12-31 00:00:00", "2014-12-31T10:00:00", "yesterday"]),
        table(id=[1, 4, 5], at=["2014-12-31 00:00:00", "2014-12-29", None]),
    ]
    options = {"keys": "id", "expiryKey": "at", "expiryMode": "tupleTime", "expiryPeriod": "1 day"}
    output = run_and_compare(spark, workdir, batches, options, "tupleTime", ["id"], DAY_MICROS)
    assert port_values(output, "expired", "id") == [4]
    reasons = dict(
        zip(
            read_port(output, "error").column("id").to_pylist(),
            read_port(output, "error").column("_dedup_error").to_pylist(),
            strict=True,
        )
    )
    assert reasons == {
        3: "expiry value in 'at' is not a valid tupleTime value",
        5: "null expiry value in 'at'",
    }


def test_ordered_mode_reproduces_the_operator_guide_table(
    spark: Any, workdir: Path, place: Output
) -> None:
    """Period 10, one row per window, expiry keys 10 20 25 40 21 35 45 57: only 21 expires."""
    values = [10, 20, 25, 40, 21, 35, 45, 57]
    batches = [table(tuple_id=[f"T{i + 1}"], key=[v]) for i, v in enumerate(values)]
    options = {"keys": "tuple_id", "expiryKey": "key", "expiryPeriod": "10"}
    output = run_and_compare(
        spark, workdir, batches, options, "ordered", ["tuple_id"], 10, output=place
    )
    assert port_values(output, "expired", "key") == [21]
    assert port_values(output, "unique", "key") == [10, 20, 25, 35, 40, 45, 57]


def test_ordered_mode_with_resent_copies_and_null_expiry_matches_reference(
    spark: Any, workdir: Path
) -> None:
    batches = [
        table(id=[1, 2, 2, 3], seq=[100, 101, 101, 102], note=["a", "b", "b", "c"]),
        table(id=[4, 1, 5, 6], seq=[110, 100, 111, None], note=["d", "a", "e", "f"]),
        table(id=[2, 7, 7], seq=[101, 120, 120], note=["b", "g", "g"]),
        table(id=[5, 9, None, 2, 8], seq=[111, 125, 126, 101, 99], note=["e", "i", "j", "b", "h"]),
    ]
    options = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "15"}
    output = run_and_compare(spark, workdir, batches, options, "ordered", ["id"], 15)
    assert port_values(output, "expired", "id") == [2, 8]
    assert sorted(read_port(output, "error").column("_dedup_error").to_pylist()) == [
        "null expiry value in 'seq'",
        "null key column 'id'",
    ]


def test_categorical_mode_expires_categories_older_than_the_period(
    spark: Any, workdir: Path, place: Output
) -> None:
    batches = [
        table(id=[1, 2], city=["Austin", "Austin"]),
        table(id=[3, 1], city=["Boston", "Austin"]),
        table(id=[4, 5, 6], city=["Chicago", "Austin", None]),
        table(id=[3, 7, 4], city=["Boston", "Denver", "Chicago"]),
    ]
    options = {"keys": "id", "expiryKey": "city", "expiryPeriod": "1"}
    output = run_and_compare(
        spark, workdir, batches, options, "categorical", ["id"], 1, output=place
    )
    assert port_values(output, "expired", "id") == [3, 5]
    assert port_values(output, "duplicate", "id") == [1, 4]


def test_system_time_mode_with_a_long_period_finds_duplicates_across_windows(
    spark: Any, workdir: Path, place: Output
) -> None:
    batches = [
        table(id=[1, 2, 2], body=["a", "b", "b"]),
        table(id=[3, 1, None], body=["c", "a", "x"]),
        table(id=[2, 3, 4], body=["b", "c", "d"]),
    ]
    options = {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 day"}
    # Windows are milliseconds apart: with a day's period nothing can expire.
    output = run_and_compare(
        spark, workdir, batches, options, "systemTime", ["id"], 1e18, output=place
    )
    assert port_values(output, "unique", "id") == [1, 2, 3, 4]
    assert port_values(output, "duplicate", "id") == [1, 2, 2, 3]


def test_system_time_mode_forgets_keys_stored_more_than_a_period_ago(
    spark: Any, workdir: Path
) -> None:
    """Period 1 ms: a key stored in window 0 is still known in window 1, forgotten in window 2.

    A window takes far more than a millisecond, so the windows' commit times are more than the
    period apart, which is all the reference model (windows a second apart) assumes.
    """
    batches = [
        table(id=[1, 2], body=["a", "b"]),
        table(id=[1, 3], body=["a", "c"]),
        table(id=[1, 3, 2], body=["a", "c", "b"]),
    ]
    options = {"keys": "id", "expiryMode": "systemTime", "expiryPeriod": "1 ms"}
    output = run_and_compare(spark, workdir, batches, options, "systemTime", ["id"], 1)
    assert port_values(output, "unique", "id") == [1, 1, 2, 2, 3]
    assert port_values(output, "duplicate", "id") == [1, 3]
    assert port_values(output, "expired", "id") == []


OWN_TIME = {"keys": "id", "expiryKey": "at", "expiryPeriod": "30 minutes", "numBuckets": "4"}


def later_resend_tables(seed: int, windows: int) -> list[pa.Table]:
    """``streams.later_resends`` with its values as minutes after 2024-01-01 00:00 UTC."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    tables = []
    for window in later_resends(seed, windows):
        at = [None if v is None else start + timedelta(minutes=v) for _, v in window]
        tables.append(
            pa.table(
                {
                    "id": pa.array([key for key, _ in window], pa.int64()),
                    "at": pa.array(at, pa.timestamp("us", tz="UTC")),
                }
            )
        )
    return tables


def test_later_resends_over_partitions_and_a_restart_match_the_reference(
    spark: Any, workdir: Path
) -> None:
    """Copies re-sent 1 to 5 windows later with later times, over three partitions, the query
    restarted from its checkpoint half-way: with assumeSameExpiry=false every port equals the
    reference (rule 5). The store then refuses to be reopened with the default setting."""
    batches = later_resend_tables(11, 12)
    output, source = workdir / "out", workdir / "in"
    options = {**OWN_TIME, "assumeSameExpiry": "false"}
    write_batches(source, batches[:6])
    run_stream(spark, source, output, options, workdir / "chk", repartition=3)
    write_batches(source, batches[6:], start=6)
    run_stream(spark, source, output, options, workdir / "chk", repartition=3)
    windows = windows_of(batches)
    expected = reference_outputs(windows, "tupleTime", ["id"], "at", 30 * MINUTE_MICROS)
    assert_matches_reference(output, expected, ["id", "at"])
    check_ports(spark, output, ["id", "at"], len(windows))
    unique_ids = read_port(output, "unique").column("id").to_pylist()
    assert len(unique_ids) > len(set(unique_ids)), "no key was forgotten and sent again"

    before = output_listing(output)
    # numBuckets goes too: with the default setting keys are bucketed by time, which refuses it.
    reopened = {"path": str(output), **{k: v for k, v in OWN_TIME.items() if k != "numBuckets"}}
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(spark, source, reopened, workdir / "chk-default").awaitTermination()
    message = str(caught.value)
    assert "option assumeSameExpiry='true' is invalid: expected false" in message
    assert "the value the store at" in message
    assert output_listing(output) == before


def test_a_copy_sent_when_its_first_time_reaches_the_expiry_point_is_unique(
    spark: Any, workdir: Path
) -> None:
    """Window 2 has L = 01:00, E = 00:00: a (remembered at 00:00) is forgotten, so its copy is
    unique; b (remembered at 00:01) is not, so its copy is a duplicate; d at 00:00 expires."""
    batches = [
        table(id=["a", "b"], at=timestamps("01-01-2024 00:00", "01-01-2024 00:01")),
        table(id=["c"], at=timestamps("01-01-2024 01:00")),
        table(
            id=["a", "b", "d"],
            at=timestamps("01-01-2024 01:01", "01-01-2024 01:01", "01-01-2024 00:00"),
        ),
    ]
    options = {"keys": "id", "expiryKey": "at", "expiryPeriod": "1 hour"}
    options["assumeSameExpiry"] = "false"
    output = run_and_compare(
        spark, workdir, batches, options, "tupleTime", ["id"], 60 * MINUTE_MICROS
    )
    assert port_values(output, "unique", "id") == ["a", "a", "b", "c"]
    assert port_values(output, "duplicate", "id") == ["b"]
    assert port_values(output, "expired", "id") == ["d"]


def test_max_expiry_jump_sends_far_future_rows_to_error_without_moving_the_latest_point(
    spark: Any, workdir: Path
) -> None:
    batches = [
        table(id=[1], seq=[10]),
        table(id=[2, 3], seq=[1000, 50]),
        table(id=[4, 2], seq=[15, 60]),
    ]
    options = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10", "maxExpiryJump": "100"}
    output = run_and_compare(spark, workdir, batches, options, "ordered", ["id"], 10, max_jump=100)
    errors = read_port(output, "error")
    assert errors.column("seq").to_pylist() == [1000]
    assert "maxExpiryJump" in errors.column("_dedup_error")[0].as_py()
    assert port_values(output, "expired", "id") == [4]
    assert port_values(output, "unique", "id") == [1, 2, 3]


def test_window_of_an_empty_file_still_gets_its_log_entry_in_every_port(
    spark: Any, workdir: Path
) -> None:
    schema = pa.schema([("id", pa.int64()), ("body", pa.string())])
    batches = [
        pa.table({"id": [1, 2], "body": ["a", "b"]}, schema),
        schema.empty_table(),
        pa.table({"id": [2, 3], "body": ["b", "c"]}, schema),
    ]
    output = run_and_compare(spark, workdir, batches, {"keys": "id"}, "basic", ["id"])
    assert port_values(output, "unique", "id") == [1, 2, 3]


@pytest.mark.parametrize(
    ("mode", "options", "period"),
    [
        ("basic", {"keys": "id"}, None),
        ("ordered", {"keys": "id", "expiryKey": "seq", "expiryPeriod": "5"}, 5),
        ("categorical", {"keys": "id", "expiryKey": "city", "expiryPeriod": "1"}, 1),
    ],
)
def test_copies_of_one_window_over_three_partitions_leave_one_unique_per_key(
    spark: Any,
    workdir: Path,
    place: Output,
    mode: str,
    options: dict[str, str],
    period: float | None,
) -> None:
    """Each key comes 2 to 4 times per window, round-robin over three partitions.

    A key's copies are identical rows (Assumption 1), and each window brings one new category.
    """

    def window(ids: list[int], copies: int, city: str) -> pa.Table:
        seqs = [10 + k if k < 20 else 40 for k in ids]
        return table(id=ids * copies, seq=seqs * copies, city=[city] * len(ids) * copies)

    batches = [
        window(list(range(12)), 4, "A"),
        window(list(range(6, 18)), 3, "B"),
        pa.concat_tables([window(list(range(6)), 2, "A"), window([20, 21, 22, 23], 2, "C")]),
    ]
    output = run_and_compare(
        spark, workdir, batches, options, mode, ["id"], period, repartition=3, output=place
    )
    unique = Counter(read_port(output, "unique").column("id").to_pylist())
    assert set(unique.values()) == {1}
    assert set(unique) == {*range(18), 20, 21, 22, 23}
    # ordered: window 1 has L=21, E=16, so id 6 (seq 16) is already expired there.
    expired = {"basic": set(), "ordered": set(range(7)), "categorical": set(range(6))}[mode]
    assert set(port_values(output, "expired", "id")) == expired


def test_ports_under_a_path_with_space_percent_and_hash_are_readable_by_spark(
    spark: Any, workdir: Path
) -> None:
    """Spark reads its sink log's paths as URIs, so they must be percent-encoded."""
    batches = [table(id=[1, 2, 2], body=["a", "b", "b"]), table(id=[2, 3], body=["b", "c"])]
    write_batches(workdir / "in", batches)
    output = workdir / "dedup out 100% #1"
    run_stream(spark, workdir / "in", output, {"keys": "id"}, workdir / "chk")
    expected = reference_outputs(windows_of(batches), "basic", ["id"])
    assert_matches_reference(output, expected, ["id", "body"])
    check_ports(spark, output, ["id", "body"], len(batches))


def test_spark_log_compacts_every_ten_windows_and_readers_still_see_every_row(
    spark: Any, workdir: Path
) -> None:
    batches = [table(id=[i, i + 1], body=[f"r{i}", f"s{i}"]) for i in range(21)]
    output = run_and_compare(spark, workdir, batches, {"keys": "id"}, "basic", ["id"])
    for port in ("unique", "duplicate", "expired", "error"):
        assert {"9.compact", "19.compact", "20"} <= set(spark_log_names(output, port))
    assert spark.read.parquet(str(output / "unique")).count() == 22
    assert spark.read.parquet(str(output / "duplicate")).count() == 20
    # A streaming reader of a port goes through the same log.
    unique = output / "unique"
    query = (
        spark.readStream.schema(spark.read.parquet(str(unique)).schema)
        .parquet(str(unique))
        .writeStream.format("memory")
        .queryName("unique_port_reader")
        .option("checkpointLocation", str(workdir / "reader-chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert spark.table("unique_port_reader").count() == 22
