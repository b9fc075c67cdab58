"""What the data source costs the Python processes Spark starts only to find it or ask its schema.

Spark imports ``pyspark_dedup`` in every session with dedupsink installed (to find the ``dedup``
format) and asks the data source for its schema before every write, each in a process of its
own that stays for the session: neither may import pyarrow or the sink's engine and store.
"""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyarrow", "numpy", "fsspec", "msgpack", "dedupsink.engine", "dedupsink.store")


def imported_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    probe = f"import sys\n{code}\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    return result.stdout.split()


def test_finding_the_format_imports_no_pyarrow() -> None:
    assert imported_after("import pyspark_dedup") == []


def test_the_schema_spark_asks_before_a_write_imports_no_pyarrow() -> None:
    code = "from pyspark_dedup import DefaultSource\nDefaultSource(options={}).schema()"
    assert imported_after(code) == []


def test_the_data_source_schema_is_the_history_schema() -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    from dedupsink.sink.datasource import DedupDataSource
    from dedupsink.store.history import SCHEMA

    expected = from_arrow_schema(SCHEMA, prefer_timestamp_ntz=False)
    assert DedupDataSource(options={}).schema() == expected
