"""Bad sink options stop the query before any output, naming the option (SEMANTICS.md).

Each case starts a real query; the error must surface from the query (at start or on
``awaitTermination``), name the option and the value on the first line of the exception's
text (after Spark's own words, with no Python traceback), and leave the output path exactly as
it was: no port, no store, no staged file.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from streams import (
    assert_matches_reference,
    check_ports,
    output_listing,
    reference_outputs,
    run_stream,
    start_stream,
    windows_of,
    write_batches,
)

from dedupsink.errors import DedupError
from dedupsink.sink import datasource

pytestmark = pytest.mark.spark

COLUMNS = ("id", "name", "at", "seq", "city")


def events() -> list[pa.Table]:
    at = pa.array(
        [datetime(2024, 1, 1, h, tzinfo=UTC) for h in (0, 1, 2)], pa.timestamp("us", tz="UTC")
    )
    return [
        pa.table(
            {
                "id": [1, 2, 2],
                "name": ["a", "b", "b"],
                "at": at,
                "seq": [10, 11, 11],
                "city": ["x", "y", "y"],
            }
        ),
        pa.table(
            {
                "id": [1, 3, 4],
                "name": ["a", "c", "d"],
                "at": at,
                "seq": [10, 25, 26],
                "city": ["x", "z", "z"],
            }
        ),
    ]


def failure_of(spark: Any, workdir: Path, options: dict[str, str], checkpoint: str) -> str:
    """The message of the exception that ends a query started with ``options``."""
    with pytest.raises(StreamingQueryException) as caught:
        start_stream(spark, workdir / "in", options, workdir / checkpoint).awaitTermination()
    return str(caught.value)


@pytest.fixture
def stream_input(workdir: Path) -> Path:
    write_batches(workdir / "in", events())
    return workdir / "in"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"keys": "id"}, "option path is missing"),
        ({"keys": "id,nope"}, "option keys='id,nope'"),
        ({"keys": "id", "expiryKey": "nope", "expiryPeriod": "10"}, "option expiryKey='nope'"),
        (
            {"keys": "id", "expiryKey": "at", "expiryPeriod": "24 hourz"},
            "option expiryPeriod='24 hourz'",
        ),
        ({"keys": "id", "expiryKey": "seq", "expiryPeriod": "-5"}, "option expiryPeriod='-5'"),
        ({"keys": "id", "expiryKey": "at", "expiryPeriod": "10"}, "option expiryPeriod='10'"),
        (
            {"keys": "id", "expiryKey": "seq", "expiryMode": "tupleTime", "expiryPeriod": "1 h"},
            "option expiryMode='tupleTime'",
        ),
        ({"keys": "id", "expiryKey": "seq"}, "option expiryPeriod is missing"),
        (
            {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10", "bucketSpan": "20"},
            "option bucketSpan='20'",
        ),
        ({"keys": "id", "numBuckets": "0"}, "option numBuckets='0'"),
        ({"keys": "id", "outputFormat": "csv"}, "option outputFormat='csv'"),
        (
            {"keys": "id", "expiryKey": "at", "expiryPeriod": "1 day", "maxExpiryJump": "soon"},
            "option maxExpiryJump='soon'",
        ),
        ({"keys": "id", "expiryPeriode": "10"}, "did you mean expiryPeriod?"),
        (
            {"keys": "id", "expiryKey": "at", "expiryPeriod": "1 h", "assumeSameExpiry": "no"},
            "option assumeSameExpiry='no'",
        ),
        ({"keys": "id", "assumeSameExpiry": "false"}, "option assumeSameExpiry='false'"),
    ],
    ids=[
        "missing-path",
        "unknown-key-column",
        "unknown-expiry-key",
        "bad-duration",
        "negative-period",
        "number-period-for-time-column",
        "mode-not-fitting-column-type",
        "expiry-key-without-period",
        "span-over-period",
        "zero-buckets",
        "unknown-output-format",
        "bad-max-expiry-jump",
        "misspelt-option",
        "assume-same-expiry-not-boolean",
        "assume-same-expiry-in-basic-dedup",
    ],
)
def test_bad_option_fails_the_query_before_any_output_and_names_the_option(
    spark: Any, workdir: Path, stream_input: Path, options: dict[str, str], named: str
) -> None:
    output = workdir / "out"
    if named != "option path is missing":
        options = {"path": str(output), **options}
    message = failure_of(spark, workdir, options, "chk")
    first = message.splitlines()[0]
    assert named in first
    assert "invalid: expected" in first or "missing: expected" in first or "did you mean" in first
    assert "Traceback" not in message
    assert output_listing(output) == {}


STREAM_FAILED = re.compile(
    r"\[STREAM_FAILED\] Query \[id = [-0-9a-f]+, runId = [-0-9a-f]+\] terminated with "
    r"exception: (.*)"
)
WRITER_FAILED = "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: "
NOPE = (
    "dedupsink.errors.DedupOptionError: option keys='id,nope' is invalid: expected columns of "
    "the stream; 'nope' is not one of ['id', 'name', 'at', 'seq', 'city']"
)


def test_the_sink_s_line_is_the_first_line_spark_says(
    spark: Any, workdir: Path, stream_input: Path
) -> None:
    """Spark hands a Python data source's error over as its worker formats it: the sink's own
    errors as their one line, so it follows Spark's words on the first line of the message."""
    output = workdir / "out"
    message = failure_of(spark, workdir, {"path": str(output), "keys": "id,nope"}, "chk")
    found = STREAM_FAILED.fullmatch(message.splitlines()[0])
    assert found is not None, message
    assert found.group(1) == WRITER_FAILED + NOPE
    frame = spark.read.parquet(str(stream_input))
    with pytest.raises(AnalysisException) as caught:
        frame.write.format("dedup").option("keys", "id,nope").mode("append").save(str(output))
    assert str(caught.value).splitlines() == [WRITER_FAILED + NOPE, " SQLSTATE: 38000"]
    assert output_listing(output) == {}


@pytest.fixture
def no_hidden_traceback() -> Iterator[None]:
    os.environ.pop("SPARK_HIDE_TRACEBACK", None)
    yield
    os.environ.pop("SPARK_HIDE_TRACEBACK", None)


def _in_a_spark_worker(error: Exception) -> None:
    """Raise ``error`` under ``said_in_one_line`` from a frame of a Spark worker module."""
    code = "def call(error):\n    with said_in_one_line():\n        raise error\n"
    scope = {"__name__": "pyspark.sql.worker.write_into_data_source"}
    scope["said_in_one_line"] = datasource.said_in_one_line
    exec(code, scope)
    scope["call"](error)  # type: ignore[operator]


@pytest.mark.usefixtures("no_hidden_traceback")
def test_only_the_sink_s_own_errors_in_spark_s_workers_lose_their_traceback() -> None:
    with pytest.raises(ValueError):
        _in_a_spark_worker(ValueError("a bug keeps its traceback"))
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
    with pytest.raises(DedupError), datasource.said_in_one_line():
        raise DedupError("in this process (not a Spark worker) nothing is set")
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
    with pytest.raises(DedupError):
        _in_a_spark_worker(DedupError("said as its one line"))
    assert os.environ["SPARK_HIDE_TRACEBACK"] == "1"


ORIGINAL = {"keys": "id", "expiryKey": "seq", "expiryPeriod": "10"}


@pytest.fixture(scope="module")
def existing_store(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output whose store was created with ORIGINAL (failed queries leave it as it is)."""
    root = tmp_path_factory.mktemp("existing")
    write_batches(root / "in", events())
    run_stream(spark, root / "in", root / "out", ORIGINAL, root / "chk")
    return root


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"expiryPeriod": "20"}, "option expiryPeriod='20' is invalid: expected 10, the value"),
        ({"keys": "id,name"}, "option keys='id,name' is invalid: expected id, the value"),
        (
            {"expiryKey": None, "expiryPeriod": None},
            "option expiryMode='none (Basic Dedup: no expiryKey)' is invalid: expected ordered",
        ),
        ({"bucketSpan": "2"}, "option bucketSpan='2' is invalid: expected 1, the value"),
        ({"assumeSameExpiry": "false"}, "option assumeSameExpiry='false'"),
    ],
    ids=["period", "keys", "mode", "bucket-span", "assume-same-expiry"],
)
def test_incompatible_change_of_an_existing_store_fails_before_writing(
    spark: Any, existing_store: Path, changed: dict[str, str | None], named: str
) -> None:
    output = existing_store / "out"
    before = output_listing(output)
    options = {"path": str(output), **ORIGINAL, **changed}
    checkpoint = f"chk-{uuid.uuid4().hex}"
    message = failure_of(
        spark, existing_store, {k: v for k, v in options.items() if v is not None}, checkpoint
    )
    assert named in message
    assert "the value the store at" in message or "created with" in message
    assert output_listing(output) == before


def test_another_store_for_ports_that_hold_windows_fails_before_writing(
    spark: Any, existing_store: Path
) -> None:
    """A new store would number its windows from 1 again and overwrite the ports' files."""
    output, other_store = existing_store / "out", existing_store / "other-store"
    before = output_listing(output)
    options = {"path": str(output), **ORIGINAL, "storePath": str(other_store)}
    message = failure_of(spark, existing_store, options, f"chk-{uuid.uuid4().hex}")
    assert "option storePath=" in message
    assert str(other_store) in message
    assert "hold windows this store never committed" in message
    assert output_listing(output) == before
    assert not other_store.exists()


def test_a_second_output_sharing_a_store_fails_before_writing(
    spark: Any, existing_store: Path
) -> None:
    """The store numbers its windows and its ports' log entries for the output it published to;
    a new path given the same storePath is refused at the start, not at its first commit."""
    output, store = existing_store / "second-out", existing_store / "out" / "_store"
    before = output_listing(store)
    options = {"path": str(output), **ORIGINAL, "storePath": str(store)}
    message = failure_of(spark, existing_store, options, f"chk-{uuid.uuid4().hex}")
    assert "option storePath=" in message and "was published to another output" in message
    assert output_listing(store) == before
    assert not output.exists() or not any(output.rglob("*.parquet"))


def test_option_names_are_case_insensitive(spark: Any, workdir: Path, stream_input: Path) -> None:
    output = workdir / "out"
    options = {"KEYS": "id", "EXPIRYKEY": "seq", "expiryperiod": "10"}
    run_stream(spark, stream_input, output, options, workdir / "chk")
    windows = windows_of(events())
    assert_matches_reference(
        output, reference_outputs(windows, "ordered", ["id"], "seq", 10), COLUMNS
    )
    check_ports(spark, output, COLUMNS, len(windows))
