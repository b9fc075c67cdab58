"""PySpark 4.0 is refused (the compatibility suite's venv of 4.0.5, the package installed there
without its dependencies, as where PySpark comes with the cluster): importing the data source
raises one line naming the version found and the version needed, and what a user reads from
``format("dedup")`` (a stream, a batch write, a read) carries that same line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from streams import output_listing, start_stream, write_batches

pytestmark = [pytest.mark.compat, pytest.mark.spark]


def refusal() -> str:
    import pyspark

    return (
        "dedupsink needs PySpark 4.1 or newer (its Arrow stream writer, "
        f"DataSourceStreamArrowWriter); found PySpark {pyspark.__version__}"
    )


def test_the_release_is_older_than_4_1() -> None:
    import pyspark

    assert pyspark.__version__.startswith("4.0."), pyspark.__version__


@pytest.mark.parametrize("module", ["pyspark_dedup", "dedupsink.sink.datasource"])
def test_importing_the_data_source_raises_the_one_line(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"dedupsink.errors.PySparkVersionError: {refusal()}"


def test_the_refusal_is_an_import_error_and_a_dedup_error() -> None:
    from dedupsink.errors import DedupError, PySparkVersionError

    with pytest.raises(ImportError) as caught:
        import pyspark_dedup  # noqa: F401
    assert isinstance(caught.value, DedupError | PySparkVersionError)
    assert str(caught.value) == refusal()


def first_line(caught: pytest.ExceptionInfo[Exception]) -> str:
    message = str(caught.value)
    assert "Traceback" not in message, message
    return message.splitlines()[0]


def test_format_dedup_says_the_line_for_a_stream_a_batch_write_and_a_read(
    spark: Any, tmp_path: Path
) -> None:
    """Spark's own first words, then the refusal (Spark reports the error of the Python process
    that planned the write, or built the reader)."""
    out, inputs = tmp_path / "out", tmp_path / "in"
    write_batches(inputs, [pa.table({"id": pa.array([1, 2, 2], pa.int64())})])
    said = re.compile(
        r"(\[STREAM_FAILED\] Query \[id = [-0-9a-f]+, runId = [-0-9a-f]+\] terminated with "
        r"exception: )?\[PYTHON_DATA_SOURCE_ERROR\] Failed to (initialize Python data source "
        r"writer|create Python data source instance): dedupsink.errors.PySparkVersionError: "
        + re.escape(refusal())
    )
    with pytest.raises(Exception) as stream:
        query = start_stream(spark, inputs, {"path": str(out), "keys": "id"}, tmp_path / "cp")
        query.awaitTermination()
    assert said.fullmatch(first_line(stream)), first_line(stream)
    frame = spark.read.parquet(str(inputs))
    with pytest.raises(Exception) as batch:
        frame.write.format("dedup").option("keys", "id").mode("append").save(str(out))
    assert said.fullmatch(first_line(batch)), first_line(batch)
    with pytest.raises(Exception) as read:
        spark.read.format("dedup").load(str(out)).collect()
    assert said.fullmatch(first_line(read)), first_line(read)
    assert output_listing(out) == {}
